"""Forwarding: header hygiene, the usage tap, and the ASGI response that relays an upstream body chunk by chunk.

:class:`UpstreamResponse` sends the upstream status and headers, then every raw chunk as it arrives
(``more_body=True``), never buffering the body. A :class:`UsageTap` reads usage from the chunks on the way
through (:mod:`agentcache.model._bodytap`, shared with ``wrap()``): it decodes and frames them and hands the events
that can carry usage (Anthropic ``message_start`` /
``message_delta``, the OpenAI Chat chunks with ``usage`` or llama.cpp ``timings``, the Responses
``response.completed`` event), or the whole JSON body of a non-streaming response, to one
:class:`~agentcache.model._usage.UsageAccumulator`. If the upstream stream breaks mid-way, the client's stream
is broken too (the ASGI app raises, so the server drops the connection instead of ending the body cleanly); if
the client goes away, the upstream response is closed at once. Either way the upstream connection goes back to
(or out of) the pool.
"""

from __future__ import annotations

import asyncio
import re
import time
from collections.abc import AsyncIterator, Awaitable, Callable, Iterable
from dataclasses import dataclass
from typing import Any

import anyio
import httpx
from starlette.responses import Response
from starlette.types import Receive, Scope, Send

from ..model._bodytap import TAP_LIMIT, UsageTap
from ..model._usage import CacheUsage
from ._errors import failure_reason

__all__ = [
    "TAP_LIMIT",
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
#: RFC 9110 §5.1 field name (``token``) and §5.5 field value (visible ASCII and obs-text, with spaces and tabs
#: only inside), the grammar the ASGI servers enforce on a response start.
_FIELD_NAME = re.compile(rb"[!#$%&'*+\-.^_`|~0-9A-Za-z]+")
_FIELD_VALUE = re.compile(rb"(?:[\x21-\x7e\x80-\xff](?:[\x20\x09\x21-\x7e\x80-\xff]*[\x21-\x7e\x80-\xff])?)?")
#: Encodings the usage tap can read; the pipeline routes ask the upstream for these only.
_TAPPABLE = ("gzip", "deflate", "identity")


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


class UpstreamStreamError(Exception):
    """The upstream broke the response body mid-way; raised so the client's stream is broken too."""


@dataclass(frozen=True, slots=True)
class StreamOutcome:
    """How a relayed response ended: ``complete``, ``upstream_error`` (cut by the upstream), ``client_gone``,
    or ``not_started`` (the server refused to start the response: the client got no answer); ``bytes``
    relayed, ``first_byte_s`` (seconds from the upstream request to the first body chunk, None without a body)
    and ``usage`` read by the tap."""

    status: str
    bytes: int
    first_byte_s: float | None
    usage: CacheUsage | None
    error: str | None = None

    def counted_status(self, status: int) -> str:
        """The ``status`` label of ``agentcache_proxy_requests_total`` for a response the upstream answered with
        ``status``: that code, or ``error`` when the client never got the response."""
        return "error" if self.status == "not_started" else str(status)


class UpstreamResponse(Response):
    """Relays an open ``httpx.Response`` (opened with ``stream=True``) to the client.

    ``started``: ``perf_counter()`` when the upstream request was sent. ``on_done(outcome)`` runs after the
    last byte (or the failure), with the upstream response already closed; it must not raise.
    ``on_first_byte()`` runs when the first body chunk arrives from the upstream, before it is relayed (the
    coalescer's signal that the request's cache entries are readable); it must not raise.
    """

    def __init__(
        self,
        upstream: httpx.Response,
        *,
        started: float,
        tap: UsageTap | None = None,
        extra_headers: Iterable[tuple[bytes, bytes]] = (),
        on_done: Callable[[StreamOutcome], Awaitable[None]] | None = None,
        on_error: Callable[[str, BaseException], None] | None = None,
        on_first_byte: Callable[[], None] | None = None,
    ) -> None:
        self.upstream = upstream
        self._on_first_byte = on_first_byte
        self.status_code = upstream.status_code
        self._on_error = on_error
        self.raw_headers = response_headers(upstream, self._valid(extra_headers))
        self.background = None
        self._tap = tap
        self._started = started
        self._on_done = on_done
        self._sent = 0
        self._first: float | None = None
        self._error: BaseException | None = None
        self._client_gone = False
        self._finished = False
        self._started_response = False
        self._relayed = False  # the relay step returned (or raised): the watcher no longer stops it
        self._stopped = False  # the watcher cancelled the relay step (the client went away)
        self._watch_error: Exception | None = None

    def _valid(self, extra: Iterable[tuple[bytes, bytes]]) -> list[tuple[bytes, bytes]]:
        """``extra`` minus any header that is no valid field (the server would refuse the whole response
        start, after the upstream answered); each one dropped is reported as ``on_error("response_header")``.
        The upstream's own headers need no check: the HTTP client parsed them under the same grammar."""
        kept = []
        for name, value in extra:
            if _FIELD_NAME.fullmatch(name) and _FIELD_VALUE.fullmatch(value):
                kept.append((name, value))
            elif self._on_error is not None:
                self._on_error("response_header", ValueError(f"invalid value for header {name!r}"))
        return kept

    async def _start(self, send: Send) -> None:
        """Send the response start. The server may still refuse it (nothing of ours should make it): the
        answer is then lost, so it is reported as ``on_error("response_start")`` and the outcome is
        ``not_started``, never silent."""
        try:
            await send({"type": "http.response.start", "status": self.status_code, "headers": self.raw_headers})
        except Exception as exc:
            if self._on_error is not None:
                self._on_error("response_start", exc)
            raise
        self._started_response = True

    async def _relay(self, send: Send) -> None:
        await self._start(send)
        try:
            async for chunk in self._chunks():
                if self._first is None:
                    self._first = time.perf_counter() - self._started
                    if self._on_first_byte is not None:
                        self._on_first_byte()  # the upstream began answering: its cache entries are readable
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

    async def _watch(self, receive: Receive, relaying: asyncio.Task[Any]) -> None:
        """Wait for the client's disconnect, then stop the ``relaying`` task (unless it has returned already); what
        ``receive`` raised is kept for :meth:`__call__` to raise."""
        try:
            await self._listen(receive)
        except OSError:  # the server reports a client that went away (ASGI spec 2.4)
            self._client_gone = not self._finished
        except Exception as exc:
            self._watch_error = exc
        if not self._relayed:
            self._stopped = True
            relaying.cancel()

    async def __call__(self, scope: Scope, receive: Receive, send: Send) -> None:
        """Relay the upstream response; see the class docstring. The relay runs in this task and a second one
        watches for the client's disconnect and cancels it; plain asyncio, as a task group's cancel scopes cost
        more than the relay's own steps."""
        relaying = asyncio.current_task()
        assert relaying is not None
        watcher = asyncio.ensure_future(self._watch(receive, relaying))
        try:
            await self._relay(send)
        except asyncio.CancelledError:
            if not self._stopped or relaying.cancelling() > 1:  # cancelled by someone else too: theirs to handle
                raise
        except OSError:  # the server reports a client that went away (ASGI spec 2.4)
            self._client_gone = not self._finished
        finally:
            self._relayed = True
            watcher.cancel()
            if self._stopped:
                relaying.uncancel()  # the watcher's cancel is answered (or was swallowed on the way)
            with anyio.CancelScope(shield=True):
                await self.upstream.aclose()
                if self._on_done is not None:
                    await self._on_done(self._outcome())
        if self._watch_error is not None:
            raise self._watch_error
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
        if not self._started_response:
            status, err = "not_started", None
        elif self._error is not None:
            status, err = "upstream_error", failure_reason(self._error)
        elif self._client_gone and not self._body_complete():
            status, err = "client_gone", None
        else:
            status, err = "complete", None
        return StreamOutcome(status, self._sent, self._first, usage, err)
