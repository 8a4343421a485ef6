"""Forwarding: header hygiene, the usage tap, and the ASGI response that relays an upstream body chunk by chunk.

:class:`UpstreamResponse` sends the upstream status and headers, then every raw chunk as it arrives
(``more_body=True``), never buffering the body. A :class:`UsageTap` reads usage from the chunks on the way
through: it decodes and frames them and hands the events that can carry usage (Anthropic ``message_start`` /
``message_delta``, the OpenAI Chat chunks with ``usage`` or llama.cpp ``timings``, the Responses
``response.completed`` event), or the whole JSON body of a non-streaming response, to one
:class:`~agentcache.model._usage.UsageAccumulator`. If the upstream stream breaks mid-way, the client's stream
is broken too (the ASGI app raises, so the server drops the connection instead of ending the body cleanly); if
the client goes away, the upstream response is closed at once. Either way the upstream connection goes back to
(or out of) the pool.
"""

from __future__ import annotations

import json
import time
import zlib
from collections.abc import AsyncIterator, Awaitable, Callable, Iterable
from dataclasses import dataclass
from functools import partial
from typing import Any

import anyio
import httpx
from starlette.responses import Response
from starlette.types import Receive, Scope, Send

from ..model._usage import CacheUsage, UsageAccumulator

__all__ = [
    "StreamOutcome",
    "UpstreamResponse",
    "UpstreamStreamError",
    "UsageTap",
    "request_headers",
    "response_headers",
    "with_raw_headers",
]

#: Connection-level headers (RFC 9110 §7.6.1) that a proxy never forwards.
HOP_BY_HOP = frozenset(
    {
        b"connection",
        b"keep-alive",
        b"proxy-authenticate",
        b"proxy-authorization",
        b"proxy-connection",
        b"te",
        b"trailer",
        b"transfer-encoding",
        b"upgrade",
    }
)
#: Encodings the usage tap can read; the pipeline routes ask the upstream for these only.
_TAPPABLE = ("gzip", "deflate", "identity")
#: The largest JSON response body (or SSE line) the tap holds to read usage from.
TAP_LIMIT = 8 * 1024 * 1024
_USAGE_MARKERS = UsageAccumulator.SSE_USAGE_MARKERS


def request_headers(raw: Iterable[tuple[bytes, bytes]], *, pipeline: bool) -> list[tuple[bytes, bytes]]:
    """The client's headers to send upstream: hop-by-hop, ``host`` and ``x-agentcache-*`` dropped; auth headers
    untouched. On pipeline routes ``content-length`` is dropped (the body may change) and ``accept-encoding``
    keeps only what the usage tap can decode."""
    out: list[tuple[bytes, bytes]] = []
    for name, value in raw:
        key = name.lower()
        if key in HOP_BY_HOP or key == b"host" or key.startswith(b"x-agentcache-"):
            continue
        if pipeline and key == b"content-length":
            continue
        if pipeline and key == b"accept-encoding":
            kept = [e for e in value.decode("latin-1").split(",") if e.split(";")[0].strip().lower() in _TAPPABLE]
            if not kept:
                continue
            value = ",".join(kept).strip().encode("latin-1")
        out.append((name, value))
    return out


def with_raw_headers(raw: list[tuple[bytes, bytes]], add: Iterable[tuple[str, str]]) -> list[tuple[bytes, bytes]]:
    """``raw`` headers with the pipeline's planned ``add`` headers: a value joins the client's comma-separated list
    of the same name (``anthropic-beta``) unless already in it."""
    out = list(raw)
    for name, value in add:
        key, val = name.lower().encode(), value.encode()
        i = next((j for j, (k, _) in enumerate(out) if k.lower() == key), None)
        if i is None:
            out.append((key, val))
        elif val not in [v.strip() for v in out[i][1].split(b",")]:
            out[i] = (out[i][0], out[i][1] + b"," + val)
    return out


def response_headers(upstream: httpx.Response, extra: Iterable[tuple[bytes, bytes]] = ()) -> list[tuple[bytes, bytes]]:
    """The upstream's response headers minus hop-by-hop ones (``content-length``/``-encoding`` kept: the raw
    bytes are relayed unchanged), plus ``extra``."""
    out = [(k, v) for k, v in upstream.headers.raw if k.lower() not in HOP_BY_HOP]
    out.extend(extra)
    return out


class UsageTap:
    """Reads usage from a response body as it streams past, holding at most one SSE line (or a JSON body up
    to :data:`TAP_LIMIT`). Only the framing lives here: decompression (gzip, deflate), SSE line splitting and
    the JSON parsing of the ``data:`` lines that can carry usage (or of the whole body); what the events mean
    is a :class:`~agentcache.model._usage.UsageAccumulator`'s. Never raises: anything unreadable just yields
    no usage."""

    def __init__(self, api: str, content_type: str, content_encoding: str = "") -> None:
        self.api = api
        self.sse = "text/event-stream" in content_type.lower()
        enc = content_encoding.strip().lower()
        self._decoder: Any = None
        self._ok = True
        if enc == "gzip":
            self._decoder = zlib.decompressobj(16 + zlib.MAX_WBITS)
        elif enc == "deflate":
            self._decoder = zlib.decompressobj()
        elif enc not in ("", "identity"):
            self._ok = False
        self._buf = bytearray()
        self._acc = UsageAccumulator(api)

    @property
    def ended(self) -> bool:
        """The api's terminal event went past (Anthropic ``message_stop``, Chat ``[DONE]``, Responses
        ``response.completed`` / ``incomplete`` / ``failed``: ``TERMINAL_EVENTS``)."""
        return self._acc.ended

    def feed(self, chunk: bytes) -> None:
        """Take one raw (possibly compressed) chunk."""
        if not self._ok or not chunk:
            return
        try:
            data = self._decoder.decompress(chunk) if self._decoder is not None else chunk
            if self.sse:
                self._feed_sse(data)
            else:
                self._buf += data
                if len(self._buf) > TAP_LIMIT:
                    self._ok = False
                    self._buf.clear()
        except Exception:  # unreadable: no usage, but the bytes still reach the client
            self._ok = False

    def _feed_sse(self, data: bytes) -> None:
        self._buf += data
        end = self._buf.rfind(b"\n")
        if end < 0:
            if len(self._buf) > TAP_LIMIT:
                self._buf.clear()
            return
        lines = bytes(self._buf[:end]).split(b"\n")
        del self._buf[: end + 1]
        acc = self._acc
        ends = acc.sse_end_markers
        for line in lines:
            if not line.startswith(b"data:"):
                continue
            # Substring tests only (plain loops: cheaper than any()): the many delta lines that carry no usage
            # are never parsed.
            for marker in ends:
                if marker in line:
                    acc.end()
                    break
            for marker in _USAGE_MARKERS:
                if marker in line:
                    break
            else:
                continue
            try:
                obj = json.loads(line[5:])
            except ValueError:
                continue
            if isinstance(obj, dict):
                acc.add_event(obj)

    def result(self) -> CacheUsage | None:
        """The usage read so far (call after the last chunk), or None."""
        if not self._ok:
            return None
        if self.sse:
            return self._acc.usage
        try:
            if self._decoder is not None:
                self._buf += self._decoder.flush()
            doc = json.loads(bytes(self._buf)) if self._buf else None
        except Exception:
            return None
        if not isinstance(doc, dict):
            return None
        self._acc.add_body(doc)
        return self._acc.usage


class UpstreamStreamError(Exception):
    """The upstream broke the response body mid-way; raised so the client's stream is broken too."""


@dataclass(frozen=True, slots=True)
class StreamOutcome:
    """How a relayed response ended: ``complete``, ``upstream_error`` (cut by the upstream), ``client_gone``;
    ``bytes`` relayed, ``first_byte_s`` (seconds from the upstream request to the first body chunk, None
    without a body) and ``usage`` read by the tap."""

    status: str
    bytes: int
    first_byte_s: float | None
    usage: CacheUsage | None
    error: str | None = None


class UpstreamResponse(Response):
    """Relays an open ``httpx.Response`` (opened with ``stream=True``) to the client.

    ``started``: ``perf_counter()`` when the upstream request was sent. ``on_done(outcome)`` runs after the
    last byte (or the failure), with the upstream response already closed; it must not raise.
    """

    def __init__(
        self,
        upstream: httpx.Response,
        *,
        started: float,
        tap: UsageTap | None = None,
        extra_headers: Iterable[tuple[bytes, bytes]] = (),
        on_done: Callable[[StreamOutcome], Awaitable[None]] | None = None,
    ) -> None:
        self.upstream = upstream
        self.status_code = upstream.status_code
        self.raw_headers = response_headers(upstream, extra_headers)
        self.background = None
        self._tap = tap
        self._started = started
        self._on_done = on_done
        self._sent = 0
        self._first: float | None = None
        self._error: BaseException | None = None
        self._client_gone = False
        self._finished = False

    async def _relay(self, send: Send) -> None:
        await send({"type": "http.response.start", "status": self.status_code, "headers": self.raw_headers})
        try:
            async for chunk in self._chunks():
                if self._first is None:
                    self._first = time.perf_counter() - self._started
                if self._tap is not None:
                    self._tap.feed(chunk)
                self._sent += len(chunk)
                await send({"type": "http.response.body", "body": chunk, "more_body": True})
        except httpx.HTTPError as exc:  # cut, reset or timed out mid-body
            self._error = exc
            return
        self._finished = True  # from here on, a disconnect is the normal end of the exchange
        # Back to the pool before the client learns the response is complete: its next request must find
        # this connection idle, not open another one.
        await self.upstream.aclose()
        await send({"type": "http.response.body", "body": b"", "more_body": False})

    async def _chunks(self) -> AsyncIterator[bytes]:
        try:
            # A transport that answered with in-memory bytes (a mock) hands over a response already read.
            content = self.upstream.content
        except httpx.ResponseNotRead:
            async for chunk in self.upstream.aiter_raw():
                yield chunk
            return
        if content:
            yield content

    async def _listen(self, receive: Receive) -> None:
        while True:
            message = await receive()
            if message["type"] == "http.disconnect":
                self._client_gone = not self._finished
                return

    async def __call__(self, scope: Scope, receive: Receive, send: Send) -> None:
        """Relay the upstream response; see the class docstring."""
        try:
            async with anyio.create_task_group() as tg:

                async def until_done(func: Callable[[], Awaitable[None]]) -> None:
                    await func()
                    tg.cancel_scope.cancel()

                tg.start_soon(until_done, partial(self._relay, send))
                await until_done(partial(self._listen, receive))
        except* OSError:  # the server reports a client that went away (ASGI spec 2.4)
            self._client_gone = not self._finished
        finally:
            with anyio.CancelScope(shield=True):
                await self.upstream.aclose()
                if self._on_done is not None:
                    await self._on_done(self._outcome())
        if self._error is not None and not self._client_gone:
            raise UpstreamStreamError(f"upstream stream broken: {type(self._error).__name__}") from self._error

    def _body_complete(self) -> bool:
        """Whether the client had the whole body before it went away: a disconnect right after the last
        byte (a client that stops reading at the terminal event, or at ``content-length``) is a complete
        exchange, not a client that gave up."""
        if self._tap is not None and self._tap.ended:
            return True
        length = self.upstream.headers.get("content-length", "")
        return length.isdigit() and int(length) == self._sent

    def _outcome(self) -> StreamOutcome:
        usage = self._tap.result() if self._tap is not None and self._error is None else None
        if self._error is not None:
            status, err = "upstream_error", type(self._error).__name__
        elif self._client_gone and not self._body_complete():
            status, err = "client_gone", None
        else:
            status, err = "complete", None
        return StreamOutcome(status, self._sent, self._first, usage, err)
