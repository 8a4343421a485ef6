"""The upstream side: :class:`UpstreamClient`, which sends through one httpx transport made of several
connection pools (:class:`ShardedTransport`).

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
"""

from __future__ import annotations

import math
import urllib.request
from collections.abc import AsyncIterator, Callable, Sequence
from typing import Any
from urllib.parse import urlsplit

import httpx

__all__ = ["ShardedTransport", "UpstreamClient", "env_proxy"]


def env_proxy(url: str) -> str | None:
    """The proxy the environment (``HTTPS_PROXY``/``HTTP_PROXY``/``ALL_PROXY``, minus ``NO_PROXY``) names for
    ``url``, or None. The upstream is fixed, so this is decided once at start-up."""
    parts = urlsplit(url)
    proxies = urllib.request.getproxies_environment()
    bypass = urllib.request.proxy_bypass_environment  # type: ignore[attr-defined]  # stdlib, not in typeshed
    if not proxies or bypass(parts.hostname or "", proxies):
        return None
    return proxies.get(parts.scheme) or proxies.get("all")


class UpstreamClient:
    """Requests to the upstream through ``transport`` (see the module docstring). ``timeout`` applies to
    every request (connect, read, write, pool). Exceptions are httpx's own (``httpx.HTTPError``)."""

    def __init__(self, transport: httpx.AsyncBaseTransport, timeout: httpx.Timeout) -> None:
        self.transport = transport
        self._extensions = {"timeout": timeout.as_dict()}

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
            method, url, headers=list(headers), content=content, json=json, extensions=self._extensions
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


class ShardedTransport(httpx.AsyncBaseTransport):
    """``shards`` ``httpx.AsyncHTTPTransport`` pools behind one transport (see the module docstring).
    ``limits`` are the totals; ``options`` go to every pool (``verify``, ``http2``, ``retries``...)."""

    def __init__(self, shards: int, limits: httpx.Limits, **options: Any) -> None:
        n = max(1, shards)
        per = httpx.Limits(
            max_connections=None if limits.max_connections is None else math.ceil(limits.max_connections / n),
            max_keepalive_connections=None
            if limits.max_keepalive_connections is None
            else math.ceil(limits.max_keepalive_connections / n),
            keepalive_expiry=limits.keepalive_expiry,
        )
        self._pools = [httpx.AsyncHTTPTransport(limits=per, **options) for _ in range(n)]
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

    def _done(self, i: int) -> None:
        self._inflight[i] -= 1

    async def aclose(self) -> None:
        """Close every pool."""
        for pool in self._pools:
            await pool.aclose()
