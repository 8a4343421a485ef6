"""Send one replayed request, streaming, and measure it: time to first token, and the prompt / cached tokens the
server reported (read with the one usage accumulator of every door, :class:`agentcache.model.UsageAccumulator`).

Streams read (server-sent events, ``data:`` lines):

* OpenAI Chat (``/v1/chat/completions`` with ``stream_options.include_usage``): the first chunk whose delta
  carries content, reasoning or a tool call is the first token; the chunk with ``usage`` (and llama.cpp's
  ``timings``) gives the usage.
* Anthropic Messages (``/v1/messages``): the first ``content_block_delta`` (or a ``tool_use`` block start) is
  the first token; ``message_start``'s usage updated by ``message_delta``'s gives the usage.
* SGLang ``/generate``: the first chunk with output is the first token; the last chunk's ``meta_info`` gives
  ``prompt_tokens`` / ``cached_tokens`` (and ``cached_tokens_details``).
"""

from __future__ import annotations

import json
import time
from dataclasses import asdict, dataclass, field
from typing import Any

import httpx

from ..adapters import REPLAY_ENDPOINTS, endpoint_for
from ..model._usage import CacheUsage
from ..model._usage_stream import UsageAccumulator

__all__ = ["PATHS", "TurnResult", "send_turn"]

#: Target wire format → path on the endpoint.
PATHS: dict[str, str] = {e.api: e.route for e in REPLAY_ENDPOINTS}
_ERROR_CHARS = 300


@dataclass(slots=True)
class TurnResult:
    """One replayed request. ``turn``: its 0-based index in the session. ``ok``: a 2xx response that streamed
    to the end. ``prompt_tokens``/``cached_tokens``/``output_tokens``: as the server reported them (None when
    it reported none). ``ttft_s``: seconds from sending to the first generated token (None on error).
    ``duration_s``: to the end of the stream. ``started_s``: when it was sent, from the start of the replay.
    ``tiers``: SGLang ``cached_tokens_details`` when reported. ``slot``: the llama.cpp slot it was pinned to.
    ``predicted_cached_tokens``/``predicted_slot``: the engine model's prediction for a llama.cpp endpoint
    (:class:`agentcache.engine.LlamaCppCache`, the server's own template and tokenizer; None when not predicted).
    ``generated_ids``/``generated_text``: what the response generated (token ids from llama.cpp's
    ``logprobs``, else the text), for the engine model; not in :meth:`to_dict`."""

    session: str
    turn: int
    ok: bool = False
    status: int | None = None
    error: str | None = None
    prompt_tokens: int | None = None
    cached_tokens: int | None = None
    output_tokens: int | None = None
    ttft_s: float | None = None
    duration_s: float = 0.0
    started_s: float = 0.0
    tiers: dict[str, int] = field(default_factory=dict)
    slot: int | None = None
    predicted_cached_tokens: int | None = None
    predicted_slot: int | None = None
    usage: CacheUsage | None = field(default=None, repr=False, compare=False)
    generated_ids: list[int] = field(default_factory=list, repr=False, compare=False)
    generated_text: str = field(default="", repr=False, compare=False)

    def to_dict(self) -> dict[str, Any]:
        """JSON-ready dict (``usage`` is given by its fields above; no generated text)."""
        out = asdict(self)
        for key in ("usage", "generated_ids", "generated_text"):
            out.pop(key)
        return out


class _UsageReader:
    """The usage of one replayed stream: the one :class:`~agentcache.model.UsageAccumulator` every door uses
    (SGLang ``/generate`` chunks carry ``meta_info``, which it reads like the Chat chunks' ``usage``)."""

    def __init__(self, target: str) -> None:
        self.usage = UsageAccumulator(target)

    def feed(self, event: dict[str, Any]) -> None:
        self.usage.add_event(event)

    def apply(self, result: TurnResult) -> None:
        usage = self.usage.usage
        if usage is None:
            return
        result.usage = usage
        result.prompt_tokens = usage.prompt_tokens
        result.cached_tokens = usage.cache_read_tokens
        result.output_tokens = usage.output_tokens
        result.tiers = dict(usage.tiers)


async def _stream(
    client: httpx.AsyncClient,
    target: str,
    body: dict[str, Any],
    result: TurnResult,
    reader: _UsageReader,
    start: float,
    headers: dict[str, str] | None,
) -> bool:
    """One attempt: stream the response into ``result`` / ``reader``; False when it ended in an error."""
    endpoint = endpoint_for(target)
    async with client.stream("POST", PATHS[target], json=body, headers=headers) as response:
        result.status = response.status_code
        if response.status_code >= 400:
            text = (await response.aread()).decode("utf-8", "replace")
            result.error = f"HTTP {response.status_code}: {' '.join(text.split())[:_ERROR_CHARS]}"
            return False
        async for line in response.aiter_lines():
            if not line.startswith("data:"):
                continue
            data = line[5:].strip()
            if not data or data == "[DONE]":
                continue
            try:
                event = json.loads(data)
            except json.JSONDecodeError:
                continue
            if not isinstance(event, dict):
                continue
            if endpoint.stream_error(event):
                result.error = f"stream error: {json.dumps(event.get('error', event))[:_ERROR_CHARS]}"
                return False
            if result.ttft_s is None and endpoint.first_output(event):
                result.ttft_s = time.perf_counter() - start
            reader.feed(event)
            text, ids = endpoint.generated(event)
            result.generated_text += text
            result.generated_ids += ids
    return True


async def send_turn(
    client: httpx.AsyncClient,
    target: str,
    body: dict[str, Any],
    result: TurnResult,
    *,
    headers: dict[str, str] | None = None,
    clock_zero: float = 0.0,
) -> TurnResult:
    """POST ``body`` (already in format ``target``, with streaming on) and fill ``result`` in place.

    Never raises for HTTP or network failures: they become ``result.error``. A connection the server closed
    before answering (a stale keep-alive) is retried once.
    """
    start = time.perf_counter()
    result.started_s = start - clock_zero
    for attempt in range(2):
        reader = _UsageReader(target)
        result.generated_ids.clear()
        result.generated_text = ""
        try:
            if not await _stream(client, target, body, result, reader, start, headers):
                return result
            break
        except (httpx.RemoteProtocolError, httpx.ReadError) as exc:
            # A pooled keep-alive connection the server had just closed: nothing was sent back, send once more.
            if attempt == 0 and result.status is None:
                continue
            result.error = f"{type(exc).__name__}: {exc}"[:_ERROR_CHARS]
            return result
        except httpx.HTTPError as exc:
            result.error = f"{type(exc).__name__}: {exc}"[:_ERROR_CHARS]
            return result
        finally:
            result.duration_s = time.perf_counter() - start
    if result.ttft_s is None:  # nothing generated (e.g. max_tokens reached at once): the end of the stream
        result.ttft_s = result.duration_s
    reader.apply(result)
    result.ok = True
    return result
