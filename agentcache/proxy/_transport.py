"""The upstream transport: one httpx transport made of several connection pools.

httpcore's pool re-examines every connection for every waiting request each time a request starts or a
response closes, so at high concurrency its cost grows with the square of the number of connections (at 64
concurrent streams it dominated the relay path). :class:`ShardedTransport` spreads requests over ``shards``
independent pools, each with its share of the limits, sending each request to the pool with the fewest
requests in flight (so a pool with an idle keep-alive connection is preferred). The client still has one
transport, created at startup and closed at shutdown.
"""

from __future__ import annotations

import math
from collections.abc import AsyncIterator, Callable
from typing import Any

import httpx

__all__ = ["ShardedTransport"]


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
