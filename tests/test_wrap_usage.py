"""Usage read by ``agentcache.wrap`` from streams the real SDKs iterate: llama.cpp's ``timings`` on the final
OpenAI Chat chunk (``llama-server`` sends them with or without ``stream_options.include_usage``), read by the
same :class:`~agentcache.model._usage.UsageAccumulator` as the proxy's tap.
"""

from __future__ import annotations

import asyncio
from collections.abc import Iterator
from typing import Any

import pytest

openai = pytest.importorskip("openai")

from agentcache import Sessions, wrap  # noqa: E402

from .test_wrap_upstream import CHAT_USAGE, FakeUpstream, Reply, o_body, openai_client  # noqa: E402

#: ``llama-server``'s ``timings`` (tools/server/README.md): ``cache_n`` prompt tokens reused from the KV cache,
#: ``prompt_n`` processed, ``predicted_n`` generated; the ``*_ms`` fields are times.
TIMINGS = {"cache_n": 1120, "prompt_n": 198, "prompt_ms": 41.2, "predicted_n": 3, "predicted_ms": 30.5}


def llama_chat_events(usage: dict[str, Any] | None = None) -> list[tuple[str | None, Any]]:
    """A ``llama-server`` Chat stream: ``timings`` on the chunk with ``finish_reason``; a usage chunk after it
    only when ``usage`` is given (the request set ``include_usage``)."""
    base = {"id": "chatcmpl-l", "object": "chat.completion.chunk", "created": 0, "model": "smollm2"}
    events: list[tuple[str | None, Any]] = [
        (None, {**base, "choices": [{"index": 0, "delta": {"role": "assistant", "content": "Hello."}}]}),
        (None, {**base, "choices": [{"index": 0, "delta": {}, "finish_reason": "stop"}], "timings": TIMINGS}),
    ]
    if usage is not None:
        events.append((None, {**base, "choices": [], "usage": usage}))
    return [*events, (None, "[DONE]")]


@pytest.fixture
def upstream() -> Iterator[FakeUpstream]:
    up = FakeUpstream()
    yield up
    up.close()


@pytest.mark.parametrize("async_", [False, True], ids=["sync", "async"])
def test_llama_cpp_timings_on_the_last_chunk_give_the_turn_its_usage(upstream: FakeUpstream, async_: bool) -> None:
    upstream.script.append(lambda path, body: Reply(events=llama_chat_events()))
    session = Sessions().session()
    client = wrap(openai_client(upstream, async_=async_), session=session)

    async def consume_async() -> str:
        stream = await client.chat.completions.create(**o_body(1), stream=True)
        return "".join([c.choices[0].delta.content or "" async for c in stream if c.choices])

    if async_:
        text = asyncio.run(consume_async())
    else:
        stream = client.chat.completions.create(**o_body(1), stream=True)  # no include_usage: no usage chunk
        text = "".join(c.choices[0].delta.content or "" for c in stream if c.choices)
    assert text == "Hello."
    report = session.last_report
    assert report is not None and report.usage is not None
    u = report.usage
    assert (u.source, u.prompt_tokens, u.cache_read_tokens, u.uncached_tokens) == ("llama.cpp", 1318, 1120, 198)
    assert u.output_tokens == 3  # predicted_n


def test_llama_cpp_timings_and_a_separate_usage_chunk_are_read_together(upstream: FakeUpstream) -> None:
    upstream.script.append(lambda path, body: Reply(events=llama_chat_events(CHAT_USAGE)))
    session = Sessions().session()
    client = wrap(openai_client(upstream), session=session)
    stream = client.chat.completions.create(**o_body(1), stream=True, stream_options={"include_usage": True})
    for _ in stream:
        pass
    report = session.last_report
    assert report is not None and report.usage is not None
    u = report.usage  # the cache split from timings, the prompt size from usage (from_openai_chat(usage, timings))
    assert (u.source, u.prompt_tokens, u.cache_read_tokens, u.output_tokens) == ("llama.cpp", 1318, 1120, 3)
