"""The upstream side: :class:`UpstreamClient`, which sends through one httpx transport: aiohttp's
(:class:`~agentcache.proxy._aiotransport.AiohttpTransport`, the default) or httpcore's, made of several connection
pools (:class:`ShardedTransport`, described here); :mod:`agentcache.proxy._upstream` chooses.

The proxy does not use ``httpx.AsyncClient``: a client's cookie jar would store the ``Set-Cookie`` of one
tenant's response and send it with every later request, whoever makes it; its default headers would add an
``Accept-Encoding`` (and a ``User-Agent``) the caller never sent; and its per-request bookkeeping (cookie
extraction through ``urllib`` request wrappers, auth and redirect flows a proxy never uses) cost about 0.4 ms
of the relay's ~1.2 ms here. :class:`UpstreamClient` builds plain ``httpx.Request`` objects with the
configured timeouts and hands them to the transport, so requests go out with exactly the caller's headers.

httpcore's pool re-examines every connection for every waiting request each time a request starts or a
response closes, so at high concurrency its cost grows with the square of the number of connections (at 64
concurrent streams it dominated the relay path). :class:`ShardedTransport` spreads requests over ``shards``
independent pools, each with its share of the limits, sending each request to the pool with the fewest
requests in flight (so a pool with an idle keep-alive connection is preferred). The client still has one
transport, created at startup and closed at shutdown.

Stale keep-alive connections. httpcore hands a request an idle pooled connection only if polling its socket
shows no pending EOF (``has_expired``), but the poll runs when the request is queued, one event-loop turn before
the request is written, and a server's close can arrive in between. Each pooled connection is therefore wrapped
(:class:`_Watched`) to look again right before the request's first byte: a connection found closed (or past its
keep-alive expiry) is closed and reported to httpcore as ``ConnectionNotAvailable``, which makes httpcore's own
pool loop put the request on another (or a new) connection. That is the only retry: once a byte of the request
was written, the upstream may have received it, and any failure goes back to the caller (a 502), never resent.
Counted in ``agentcache_proxy_stale_connections_total{action="resent"}``.

Some servers close a keep-alive connection after every streamed response without saying so (no
``Connection: close``), and their close can come milliseconds after the last chunk, so the next request may be
written before it arrives and then fails after it was sent (llama.cpp's ``llama-server``: its chunked content
provider returns ``has_next`` false at the end of a stream, which cpp-httplib treats as an aborted write and ends
the keep-alive loop, ``tools/server/server-http.cpp``; measured here with llama-cpp-python 0.3.36's llama.cpp:
the close comes 0.01–5 ms after the final chunk while the response advertised ``Keep-Alive: timeout=5``). For
such an upstream (:data:`CLOSES_AFTER_STREAM`, set by the proxy for the engine it fronts) the transport closes
the connection itself after each chunked response, so it is never reused
(``agentcache_proxy_stale_connections_total{action="closed_after_stream"}``). The idle expiry
(``keepalive_expiry``, default 4 s) stays below the 5 s keep-alive timeout of llama.cpp, uvicorn and Node, so an
idle connection is never reused just as the server times it out.
"""

from __future__ import annotations

import math
import urllib.request
from collections.abc import AsyncIterator, Callable, Sequence
from typing import Any, Protocol, TypeVar, runtime_checkable
from urllib.parse import urlsplit

import httpcore
import httpx

from ..model._types import Engine

__all__ = [
    "CLOSES_AFTER_STREAM",
    "ONE_WRITE",
    "ClosesAfterStream",
    "ShardedTransport",
    "UpstreamClient",
    "Watch",
    "Watched",
    "env_proxy",
    "parsed_url",
]

#: Request bodies up to this many bytes go upstream in one write (with the request's headers): the aiohttp transport
#: writes them at once, and the relay reads a body declared this small whole before sending it.
ONE_WRITE = 64 * 1024
#: Engines whose HTTP server closes a keep-alive connection after every streamed (chunked) response (see the
#: module docstring for the source).
CLOSES_AFTER_STREAM = frozenset({Engine.LLAMA_CPP})


@runtime_checkable
class ClosesAfterStream(Protocol):
    """A transport that can close each connection after a chunked response (both of the proxy's)."""

    closes_after_stream: bool


def env_proxy(url: str) -> str | None:
    """The proxy the environment (``HTTPS_PROXY``/``HTTP_PROXY``/``ALL_PROXY``, minus ``NO_PROXY``) names for
    ``url``, or None. The upstream is fixed, so this is decided once at start-up."""
    parts = urlsplit(url)
    proxies = urllib.request.getproxies_environment()
    bypass = urllib.request.proxy_bypass_environment  # type: ignore[attr-defined]  # stdlib, not in typeshed
    if not proxies or bypass(parts.hostname or "", proxies):
        return None
    return proxies.get(parts.scheme) or proxies.get("all")


T = TypeVar("T")

#: Parsed upstream URLs kept (the parse is ~30 µs of a request).
_URL_MEMO = 1024


def parsed_url(memo: dict[str, T], url: str, parse: Callable[[str], T]) -> T:
    """``parse(url)``, once per distinct ``url`` in ``memo`` (a proxy sends to few); ``memo`` starts over past
    :data:`_URL_MEMO` entries (query strings may make URLs many)."""
    parsed = memo.get(url)
    if parsed is None:
        if len(memo) >= _URL_MEMO:
            memo.clear()
        parsed = memo[url] = parse(url)
    return parsed


class UpstreamClient:
    """Requests to the upstream through ``transport`` (see the module docstring). ``timeout`` applies to
    every request (connect, read, write, pool). Exceptions are httpx's own (``httpx.HTTPError``)."""

    def __init__(self, transport: httpx.AsyncBaseTransport, timeout: httpx.Timeout) -> None:
        self.transport = transport
        self._extensions = {"timeout": timeout.as_dict()}
        self._urls: dict[str, httpx.URL] = {}  # parsed once: a proxy sends to few distinct URLs

    def build_request(
        self,
        method: str,
        url: str,
        *,
        headers: Sequence[tuple[bytes, bytes]] = (),
        content: Any = None,
        json: Any = None,
    ) -> httpx.Request:
        """A request carrying exactly ``headers`` (plus ``Host`` and the body's length, which httpx sets)."""
        return httpx.Request(
            method,
            parsed_url(self._urls, url, httpx.URL),
            headers=list(headers),
            content=content,
            json=json,
            extensions=self._extensions,
        )

    async def send(self, request: httpx.Request) -> httpx.Response:
        """Send ``request``; the response body is not read (stream it, then ``aclose()``)."""
        response = await self.transport.handle_async_request(request)
        response.request = request
        return response

    async def post(
        self, url: str, *, headers: Sequence[tuple[bytes, bytes]] = (), content: Any = None, json: Any = None
    ) -> httpx.Response:
        """POST and read the whole response (closed on return)."""
        response = await self.send(self.build_request("POST", url, headers=headers, content=content, json=json))
        try:
            await response.aread()
        finally:
            await response.aclose()
        return response

    async def get(self, url: str, *, headers: Sequence[tuple[bytes, bytes]] = ()) -> httpx.Response:
        """GET and read the whole response (closed on return)."""
        response = await self.send(self.build_request("GET", url, headers=headers))
        try:
            await response.aread()
        finally:
            await response.aclose()
        return response

    async def aclose(self) -> None:
        """Close the transport's connections."""
        await self.transport.aclose()


class _Released(httpx.AsyncByteStream):
    """A response stream that tells its pool's counter when it is closed (exactly once)."""

    def __init__(self, stream: httpx.AsyncByteStream, release: Callable[[], None]) -> None:
        self._stream = stream
        self._release: Callable[[], None] | None = release

    async def __aiter__(self) -> AsyncIterator[bytes]:
        async for chunk in self._stream:
            yield chunk

    async def aclose(self) -> None:
        try:
            await self._stream.aclose()
        finally:
            if self._release is not None:
                self._release()
                self._release = None


class Watch:
    """What the wrapped connections of one transport share: whether to close connections after a chunked
    response, and the callback counting stale-connection actions (``resent``, ``closed_after_stream``)."""

    def __init__(self, on_stale: Callable[[str], None] | None) -> None:
        self.closes_after_stream = False
        self.on_stale = on_stale

    def count(self, action: str) -> None:
        if self.on_stale is not None:
            self.on_stale(action)


class Watched:
    """A transport (both of the proxy's) whose connections one :class:`Watch` looks after: its
    ``closes_after_stream`` (:class:`ClosesAfterStream`) is the watch's."""

    watch: Watch

    @property
    def closes_after_stream(self) -> bool:
        """Whether connections are closed after each chunked response (see the module docstring)."""
        return self.watch.closes_after_stream

    @closes_after_stream.setter
    def closes_after_stream(self, value: bool) -> None:
        self.watch.closes_after_stream = value


class _Watched(httpcore.AsyncConnectionInterface):
    """One pooled httpcore connection, checked again right before a request is written (module docstring)."""

    def __init__(self, inner: httpcore.AsyncConnectionInterface, watch: Watch) -> None:
        self._inner = inner
        self._watch = watch

    async def handle_async_request(self, request: httpcore.Request) -> httpcore.Response:
        # Idle (a reused keep-alive connection) and already closed by the server or past its expiry: nothing
        # was written yet, so httpcore's pool may safely put the request on another connection.
        if self._inner.is_idle() and self._inner.has_expired():
            await self._inner.aclose()
            self._watch.count("resent")
            raise httpcore.ConnectionNotAvailable()
        response = await self._inner.handle_async_request(request)
        if self._watch.closes_after_stream and _chunked(response.headers):
            stream = response.stream
            response.stream = _CloseAfter(stream, self)
        return response

    async def close_after_stream(self) -> None:
        if not self._inner.is_closed():
            await self._inner.aclose()
            self._watch.count("closed_after_stream")

    async def aclose(self) -> None:
        await self._inner.aclose()

    def info(self) -> str:
        return self._inner.info()

    def can_handle_request(self, origin: httpcore.Origin) -> bool:
        return self._inner.can_handle_request(origin)

    def is_available(self) -> bool:
        return self._inner.is_available()

    def has_expired(self) -> bool:
        return self._inner.has_expired()

    def is_idle(self) -> bool:
        return self._inner.is_idle()

    def is_closed(self) -> bool:
        return self._inner.is_closed()

    def __repr__(self) -> str:
        return f"<_Watched {self._inner!r}>"


def _chunked(headers: Sequence[tuple[bytes, bytes]]) -> bool:
    return any(k.lower() == b"transfer-encoding" and b"chunked" in v.lower() for k, v in headers)


class _CloseAfter:
    """A connection's response stream that closes the connection once the response is closed."""

    def __init__(self, stream: Any, conn: _Watched) -> None:
        self._stream = stream
        self._conn = conn

    async def __aiter__(self) -> AsyncIterator[bytes]:
        async for chunk in self._stream:
            yield chunk

    async def aclose(self) -> None:
        try:
            if hasattr(self._stream, "aclose"):
                await self._stream.aclose()
        finally:
            await self._conn.close_after_stream()


class _WatchedTransport(httpx.AsyncHTTPTransport):
    """``httpx.AsyncHTTPTransport`` whose pool wraps every connection it creates in :class:`_Watched`.
    httpcore's pools create connections through their public ``create_connection`` hook; httpx keeps the
    pool in ``_pool`` (the one private name used: tests/test_proxy_stale.py fails if it goes away)."""

    def __init__(self, watch: Watch, **options: Any) -> None:
        super().__init__(**options)
        pool = self._pool
        make = pool.create_connection

        def create_connection(origin: httpcore.Origin) -> httpcore.AsyncConnectionInterface:
            return _Watched(make(origin), watch)

        setattr(pool, "create_connection", create_connection)  # noqa: B010  # an instance hook, not a method


class ShardedTransport(Watched, httpx.AsyncBaseTransport):
    """``shards`` ``httpx.AsyncHTTPTransport`` pools behind one transport (see the module docstring).
    ``limits`` are the totals; ``options`` go to every pool (``verify``, ``http2``, ``retries``...).
    ``on_stale(action)`` counts stale-connection actions; :attr:`closes_after_stream` (default False) makes
    the pools close a connection after each chunked response (an upstream in :data:`CLOSES_AFTER_STREAM`)."""

    def __init__(
        self,
        shards: int,
        limits: httpx.Limits,
        *,
        on_stale: Callable[[str], None] | None = None,
        **options: Any,
    ) -> None:
        n = max(1, shards)
        per = httpx.Limits(
            max_connections=None if limits.max_connections is None else math.ceil(limits.max_connections / n),
            max_keepalive_connections=None
            if limits.max_keepalive_connections is None
            else math.ceil(limits.max_keepalive_connections / n),
            keepalive_expiry=limits.keepalive_expiry,
        )
        self.watch = Watch(on_stale)
        self._pools = [_WatchedTransport(self.watch, limits=per, **options) for _ in range(n)]
        self._inflight = [0] * n

    async def handle_async_request(self, request: httpx.Request) -> httpx.Response:
        """Send ``request`` on the least busy pool."""
        i = min(range(len(self._pools)), key=self._inflight.__getitem__)
        self._inflight[i] += 1
        try:
            response = await self._pools[i].handle_async_request(request)
        except BaseException:
            self._inflight[i] -= 1
            raise
        stream = response.stream
        assert isinstance(stream, httpx.AsyncByteStream)
        response.stream = _Released(stream, lambda: self._done(i))
        return response

    @property
    def in_flight(self) -> int:
        """Requests sent whose response is not closed yet."""
        return sum(self._inflight)

    def _done(self, i: int) -> None:
        self._inflight[i] -= 1

    async def aclose(self) -> None:
        """Close every pool."""
        for pool in self._pools:
            await pool.aclose()
