"""The upstream transport on aiohttp: :class:`AiohttpTransport`, an ``httpx.AsyncBaseTransport`` that sends through
one ``aiohttp.ClientSession`` (its C HTTP parser and lean connection pool), so the proxy and the tests keep httpx's
request, response and exception types while the relay costs about a millisecond less per request than through
httpcore (``benchmarks/README.md``, issue 26). The proxy uses it when aiohttp is installed (the ``proxy`` extra),
else :class:`~agentcache.proxy._transport.ShardedTransport`; ``upstream_client`` chooses explicitly.

It keeps the httpcore transport's behaviour (``_transport.py``'s module docstring):

* Requests go out with exactly the caller's headers (plus ``Host`` and the body's length): aiohttp's automatic
  ``User-Agent``, ``Accept``, ``Accept-Encoding`` and ``Content-Type`` are skipped, its cookie jar is a dummy, the
  response body is relayed raw (``auto_decompress`` off: a gzip body stays gzip), redirects are not followed,
  HTTP/1.1, ``TCP_NODELAY`` (aiohttp sets it on every connection).
* Stale keep-alive connections: right before a request is written on a pooled connection that served an earlier
  one, its socket is polled; readable means the server closed it (or sent junk): it is closed and the request goes
  to another or a new connection (counted ``resent``). Once a byte was written nothing is resent, not even an
  idempotent GET (aiohttp's own retry of those is turned off). :data:`closes_after_stream` closes the connection
  after each chunked response (llama.cpp's server).
* Limits and timeouts: at most ``max_connections`` requests in flight (waiting longer than ``pool`` for a slot is
  a ``PoolTimeout``); idle connections expire after ``keepalive_expiry``; ``connect`` bounds a new connection,
  ``read`` the wait for each piece of the response; ``write`` the wait for the upstream to take each 64 KiB of a
  body larger than that (a smaller body is handed to the socket at once, and the read timeout runs from there).
  aiohttp has no cap on idle connections apart from the in-flight one, so ``max_keepalive`` and ``upstream_pools``
  apply to the httpx transport only.
* Failures are httpx's exceptions (``ConnectError``, ``ConnectTimeout``, ``ReadTimeout``, ``WriteTimeout``,
  ``PoolTimeout``, ``RemoteProtocolError``, ``ReadError``...) raised from aiohttp's, whose causes keep the socket
  error (:func:`~agentcache.proxy._errors.failure_reason` reads them); an exception from the request body's own
  iterator (the client's body over the limit or too slow) is raised as itself.
* The environment's proxy is passed explicitly (``env_proxy``); TLS uses httpx's context (certifi, and
  ``SSL_CERT_FILE``/``SSL_CERT_DIR`` when ``trust_env``), as the httpx transport did.
"""

from __future__ import annotations

import asyncio
import select
import weakref
from collections.abc import AsyncIterator, Callable
from contextlib import suppress
from typing import Any

import aiohttp
import httpx
from aiohttp.client_proto import ResponseHandler
from multidict import CIMultiDict
from yarl import URL

from ._transport import ONE_WRITE, Watch, Watched, parsed_url

__all__ = ["AiohttpTransport"]

#: Headers aiohttp would add on its own; the upstream gets only the caller's.
_SKIP_AUTO = frozenset({"User-Agent", "Accept", "Accept-Encoding", "Content-Type"})
#: Bodies up to this size are written at once (they fit the transport's buffer); larger ones piece by piece, each
#: piece under the write timeout.
_PIECE = ONE_WRITE


class _Connector(aiohttp.TCPConnector):
    """aiohttp's pool, which looks again at a reused connection right before the request is written."""

    def __init__(self, watch: Watch, **options: Any) -> None:
        super().__init__(**options)
        self._watch = watch
        self._used: weakref.WeakSet[ResponseHandler] = weakref.WeakSet()

    async def connect(self, req: Any, traces: Any, timeout: aiohttp.ClientTimeout) -> Any:
        """A connection for ``req`` whose socket shows no close; each closed one found is closed and counted."""
        while True:
            conn = await super().connect(req, traces, timeout)
            proto = conn.protocol
            if proto is None or proto not in self._used:
                if proto is not None:
                    self._used.add(proto)
                return conn
            if not _closed_by_peer(conn.transport):
                return conn
            conn.close()  # nothing written yet: the request may go elsewhere
            self._watch.count("resent")


def _closed_by_peer(transport: asyncio.Transport | None) -> bool:
    """Whether an idle connection's socket is readable (EOF or unexpected bytes) or gone."""
    if transport is None or transport.is_closing():
        return True
    sock = transport.get_extra_info("socket")
    if sock is None:
        return False
    fd = sock.fileno()
    return fd < 0 or bool(select.select([fd], [], [], 0)[0])


class _Body(httpx.AsyncByteStream):
    """An aiohttp response's body as raw chunks as they arrive; closing it releases the connection (closed instead
    when the body is unfinished) and the in-flight slot."""

    def __init__(self, response: aiohttp.ClientResponse, transport: AiohttpTransport) -> None:
        self._response = response
        self._transport: AiohttpTransport | None = transport

    async def __aiter__(self) -> AsyncIterator[bytes]:
        try:
            # Whatever has arrived, at once: never waits for more (no buffering), and several chunks read together
            # go on as one piece (fewer sends to the client than one per HTTP chunk)
            async for data in self._response.content.iter_any():
                yield data
        except (aiohttp.ClientError, TimeoutError) as exc:
            raise _httpx_error(exc) from exc

    async def aclose(self) -> None:
        transport, self._transport = self._transport, None
        if transport is None:
            return
        try:
            self._response.release()  # an unfinished body's connection is closed, not pooled
        finally:
            transport.release_slot()


def _as_sent(url: str) -> URL:
    return URL(url, encoded=True)  # no re-quoting of the raw path


def _chunked(response: aiohttp.ClientResponse) -> bool:
    return "chunked" in response.headers.get("transfer-encoding", "").lower()


class AiohttpTransport(Watched, httpx.AsyncBaseTransport):
    """httpx's transport interface on one ``aiohttp.ClientSession`` (module docstring). ``limits``: the total
    in-flight requests (``max_connections``; None: unbounded) and the idle expiry; ``proxy``: an HTTP proxy URL for
    every request; ``trust_env``: TLS settings from the environment; ``on_stale(action)`` counts stale-connection
    actions. The session is created on the first request (it needs the running loop)."""

    def __init__(
        self,
        limits: httpx.Limits,
        *,
        proxy: str | None = None,
        trust_env: bool = True,
        on_stale: Callable[[str], None] | None = None,
    ) -> None:
        self.watch = Watch(on_stale)
        self._limits = limits
        self._proxy = proxy
        self._trust_env = trust_env
        self._session: aiohttp.ClientSession | None = None
        self._slots = None if limits.max_connections is None else asyncio.Semaphore(limits.max_connections)
        self._timeouts: dict[tuple[Any, ...], aiohttp.ClientTimeout] = {}
        self._urls: dict[str, URL] = {}  # parsed once (as UpstreamClient's)
        self.in_flight = 0  # requests sent whose response is not closed yet

    def _open(self) -> aiohttp.ClientSession:
        connector = _Connector(
            self.watch,
            limit=0,  # the in-flight slots bound connections (and tell a pool wait from a connect)
            limit_per_host=0,
            keepalive_timeout=self._limits.keepalive_expiry,
            resolver=aiohttp.ThreadedResolver(),  # getaddrinfo as httpcore (not aiodns when installed): same errors
            ssl=httpx.create_ssl_context(trust_env=self._trust_env),
        )
        session = aiohttp.ClientSession(
            connector=connector,
            cookie_jar=aiohttp.DummyCookieJar(),
            skip_auto_headers=_SKIP_AUTO,
            auto_decompress=False,
            trust_env=False,  # the proxy is passed explicitly; no .netrc credentials
            timeout=aiohttp.ClientTimeout(total=None),
        )
        if hasattr(session, "_retry_connection"):  # aiohttp's resend of an idempotent request once written: off
            session._retry_connection = False
        self._session = session
        return session

    def _timeout(self, request: httpx.Request) -> tuple[aiohttp.ClientTimeout, float | None, float | None]:
        """aiohttp's timeouts for ``request`` (its ``timeout`` extension), and the pool and write ones."""
        t = request.extensions.get("timeout") or {}
        key = (t.get("connect"), t.get("read"))
        timeout = self._timeouts.get(key)
        if timeout is None:
            timeout = aiohttp.ClientTimeout(total=None, connect=None, sock_connect=key[0], sock_read=key[1])
            self._timeouts[key] = timeout
        return timeout, t.get("pool"), t.get("write")

    async def _acquire(self, pool: float | None) -> None:
        if self._slots is not None and self._slots.locked():
            try:
                async with asyncio.timeout(pool):
                    await self._slots.acquire()
            except TimeoutError as exc:
                raise httpx.PoolTimeout("no free upstream connection") from exc
        elif self._slots is not None:
            await self._slots.acquire()  # free: no wait, no timer
        self.in_flight += 1

    def release_slot(self) -> None:
        """One request's slot back (when its response is closed, or it failed)."""
        self.in_flight -= 1
        if self._slots is not None:
            self._slots.release()

    async def handle_async_request(self, request: httpx.Request) -> httpx.Response:
        """Send ``request``; the response streams its body (close it). Raises ``httpx.HTTPError`` subclasses, or
        the request body iterator's own exception."""
        session = self._session or self._open()
        timeout, pool, write = self._timeout(request)
        await self._acquire(pool)
        failures: list[BaseException] = []
        headers = CIMultiDict(
            (k.decode("latin-1"), v.decode("latin-1"))
            for k, v in request.headers.raw
            if k.lower() != b"transfer-encoding"  # httpx's own framing; aiohttp frames the body itself
        )
        clock: _WriteClock | None = None
        try:
            async with asyncio.timeout(None) as deadline:
                clock = _WriteClock(deadline, write)
                try:
                    response = await session.request(
                        request.method,
                        parsed_url(self._urls, str(request.url), _as_sent),
                        headers=headers,
                        data=_body(request, clock, failures),
                        proxy=self._proxy,
                        timeout=timeout,
                        allow_redirects=False,
                    )
                finally:
                    clock.live = False  # the rest of a body still being written (an early answer) runs untimed
        except BaseException as exc:
            self.release_slot()
            if failures:  # the body's own source failed (over the limit, too slow): that is the error
                raise failures[0] from None
            if isinstance(exc, TimeoutError) and clock is not None and clock.deadline.expired():
                raise httpx.WriteTimeout("upstream stopped reading the request body") from exc
            if isinstance(exc, (aiohttp.ClientError, TimeoutError)):
                raise _httpx_error(exc) from exc
            raise
        if self.watch.closes_after_stream and _chunked(response):
            self._close_after(response)
        return httpx.Response(
            response.status,
            headers=response.raw_headers,
            stream=_Body(response, self),
            extensions={"http_version": b"HTTP/1.1", "reason_phrase": (response.reason or "").encode("latin-1")},
        )

    def _close_after(self, response: aiohttp.ClientResponse) -> None:
        """Never reuse ``response``'s connection. aiohttp pools a connection as soon as its body's end is parsed,
        which may already have happened with the headers: then it is closed in the pool (where it is skipped as
        closed), else marked to close on release. ``ClientResponse._protocol`` is the one private name used
        (tests/test_proxy_stale.py fails if it goes away)."""
        proto: ResponseHandler | None = getattr(response, "_protocol", None)
        if proto is None:
            return
        if response.connection is None:
            proto.close()
        else:
            proto.force_close()
        self.watch.count("closed_after_stream")

    async def aclose(self) -> None:
        """Close every connection."""
        if self._session is not None:
            session, self._session = self._session, None
            with suppress(Exception):
                await session.close()


class _WriteClock:
    """The write timeout of one request's body on the request's ``deadline``: armed while aiohttp writes a piece,
    off while the body's source produces the next (the client's pace is not the upstream's), inert once the
    request is answered (``live`` False)."""

    def __init__(self, deadline: asyncio.Timeout, seconds: float | None) -> None:
        self.deadline = deadline
        self.seconds = seconds
        self.live = True

    def arm(self) -> None:
        if self.live and self.seconds is not None:
            self.deadline.reschedule(asyncio.get_running_loop().time() + self.seconds)

    def disarm(self) -> None:
        if self.live:
            self.deadline.reschedule(None)


def _body(request: httpx.Request, clock: _WriteClock, failures: list[BaseException]) -> Any:
    """What aiohttp sends: a small body's bytes; else its pieces, each written under ``clock``; failures of the
    body's source are kept in ``failures``."""
    try:
        content = request.content
    except httpx.RequestNotRead:
        return _pieces(request.stream, clock, failures)
    if len(content) <= _PIECE:
        return content or None
    view = memoryview(content)
    return _pieces(_slices(view), clock, failures)


async def _slices(view: memoryview) -> AsyncIterator[bytes]:
    for i in range(0, len(view), _PIECE):
        yield bytes(view[i : i + _PIECE])


async def _pieces(source: Any, clock: _WriteClock, failures: list[BaseException]) -> AsyncIterator[bytes]:
    try:
        async for piece in source:
            clock.arm()
            yield piece
            clock.disarm()
    except BaseException as exc:
        if not isinstance(exc, (GeneratorExit, asyncio.CancelledError)):
            failures.append(exc)
        raise


def _httpx_error(exc: BaseException) -> httpx.HTTPError:
    """The httpx exception for an aiohttp failure (its ``__cause__`` is set by the caller's ``raise ... from``)."""
    message = str(exc) or type(exc).__name__
    if isinstance(exc, aiohttp.ConnectionTimeoutError):
        return httpx.ConnectTimeout(message)
    if isinstance(exc, (aiohttp.SocketTimeoutError, TimeoutError)):
        return httpx.ReadTimeout(message)
    if isinstance(exc, aiohttp.ClientConnectorError):  # refused, DNS, TLS, the proxy
        return httpx.ConnectError(message)
    if isinstance(exc, (aiohttp.ServerDisconnectedError, aiohttp.ClientPayloadError, aiohttp.ClientResponseError)):
        return httpx.RemoteProtocolError(message)
    if isinstance(exc, aiohttp.ClientOSError):
        return httpx.ReadError(message)
    return httpx.TransportError(message)
