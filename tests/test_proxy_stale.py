"""Stale keep-alive connections to the upstream (issue 12, item 5).

A real-socket fake upstream (asyncio, TCP_NODELAY) answers ``/v1/chat/completions`` plainly or as an SSE stream
(chunked) and misbehaves the way servers do: closing a keep-alive connection right after a streamed response,
or a few milliseconds after it (llama.cpp's ``llama-server``), or after reading a request without answering.
The proxy runs under uvicorn in a thread (:class:`~tests.test_proxy_support.ServerThread`); the client is httpx.
"""

from __future__ import annotations

import asyncio
import json
from collections import Counter
from collections.abc import Iterator
from typing import Any

import aiohttp
import httpcore
import httpx
import pytest

from agentcache.proxy import ProxyConfig, create_app
from agentcache.proxy._aiotransport import AiohttpTransport
from agentcache.proxy._state import ProxyState
from agentcache.proxy._transport import ShardedTransport
from tests.test_proxy_support import RawUpstream, ServerThread, chat_chunks, chat_completion, settings, sse_bytes

USAGE = {"prompt_tokens": 12, "completion_tokens": 2, "total_tokens": 14}
PLAIN = json.dumps(chat_completion(USAGE)).encode()
STREAM = sse_bytes(chat_chunks(USAGE), done=True)


class Upstream(RawUpstream):
    """The fake upstream in its own thread. ``close_after_stream``: seconds after a streamed response's final
    chunk at which the connection is closed (None: kept alive). ``drop``: ``(connection's request number)`` on
    which the request is read in full and the connection closed without a response. ``calls`` counts the
    requests read, by kind (``plain``, ``stream``, ``dropped``)."""

    def __init__(self, close_after_stream: float | None = None, drop: int | None = None) -> None:
        self.close_after_stream = close_after_stream
        self.drop = drop
        self.calls: Counter[str] = Counter()
        self.connections = 0
        super().__init__(self._serve)

    async def _serve(self, reader: asyncio.StreamReader, writer: asyncio.StreamWriter) -> None:
        n = 0
        while True:
            head = await reader.readuntil(b"\r\n\r\n")
            if not head.startswith(b"POST "):  # the proxy's engine probe at start-up
                writer.write(b"HTTP/1.1 404 Not Found\r\ncontent-length: 0\r\n\r\n")
                continue
            lines = (h.partition(b":") for h in head.split(b"\r\n"))
            length = next(int(v) for k, _, v in lines if k.lower() == b"content-length")
            body = json.loads(await reader.readexactly(length))
            if not head.startswith(b"POST /v1/"):  # the live report's engine arm (/apply-template): not served
                writer.write(b"HTTP/1.1 404 Not Found\r\ncontent-length: 0\r\n\r\n")
                continue
            n += 1
            self.connections += n == 1  # connections that carried a request
            if n == self.drop:
                self.calls["dropped"] += 1
                return  # read it, answer nothing: the upstream may have acted on it
            if body.get("stream"):
                self.calls["stream"] += 1
                writer.write(
                    b"HTTP/1.1 200 OK\r\ncontent-type: text/event-stream\r\ntransfer-encoding: chunked\r\n\r\n"
                )
                for chunk in STREAM:
                    writer.write(b"%x\r\n%s\r\n" % (len(chunk), chunk))
                writer.write(b"0\r\n\r\n")
                await writer.drain()
                if self.close_after_stream is not None:
                    await asyncio.sleep(self.close_after_stream)
                    return
            else:
                self.calls["plain"] += 1
                writer.write(
                    b"HTTP/1.1 200 OK\r\ncontent-type: application/json\r\ncontent-length: %d\r\n\r\n%s"
                    % (len(PLAIN), PLAIN)
                )
                await writer.drain()


def body(i: int, stream: bool) -> dict[str, Any]:
    return {"model": "gpt-4o", "messages": [{"role": "user", "content": f"turn {i}"}], "stream": stream}


@pytest.fixture(params=["aiohttp", "httpx"])
def proxied(request: pytest.FixtureRequest) -> Iterator[Any]:
    """A factory: ``proxied(upstream, engine)`` → (proxy base URL, ProxyState), on each upstream client."""
    stack: list[Any] = []

    def start(up: Upstream, engine: str = "none") -> tuple[str, ProxyState]:
        config = ProxyConfig(upstream=up.url, engine=engine, upstream_client=request.param)
        app = create_app(config, settings=settings())
        server = ServerThread(app).__enter__()
        stack.append(server)
        return server.url, app.state.proxy

    yield start
    for server in stack:
        server.__exit__(None, None, None)


def alternate(url: str, n: int) -> list[int]:
    """``n`` requests on one keep-alive client connection, streamed and plain in turn, each sent right after
    the previous response ended; their status codes."""
    out = []
    with httpx.Client(base_url=url, timeout=10) as client:
        for i in range(n):
            stream = i % 2 == 0
            with client.stream("POST", "/v1/chat/completions", json=body(i, stream)) as r:
                r.read()
                out.append(r.status_code)
    return out


def stale(state: ProxyState) -> dict[str, float]:
    text = state.metrics.render().decode()
    out = {}
    for line in text.splitlines():
        if line.startswith("agentcache_proxy_stale_connections_total{"):
            action = line.split('action="')[1].split('"')[0]
            out[action] = float(line.rsplit(" ", 1)[1])
    return out


def test_upstream_closing_right_after_each_stream_loses_nothing(proxied: Any) -> None:
    with Upstream(close_after_stream=0.0) as up:
        url, _state = proxied(up)
        statuses = alternate(url, 20)
        assert statuses == [200] * 20
        assert up.calls == {"stream": 10, "plain": 10}  # each request reached the upstream exactly once
        assert up.connections >= 10  # every stream's connection was closed and a new one opened


def test_upstream_closing_late_after_streams_is_not_reused_when_the_engine_does_that(proxied: Any) -> None:
    # The close comes 30 ms after the final chunk, later than the next request: only not reusing the
    # connection helps. llama.cpp is declared, whose server does exactly this.
    with Upstream(close_after_stream=0.03) as up:
        url, state = proxied(up, "llama.cpp")
        statuses = alternate(url, 12)
        assert statuses == [200] * 12
        assert up.calls == {"stream": 6, "plain": 6}
        assert stale(state).get("closed_after_stream") == 6


def test_late_close_without_the_engine_fact_is_a_502_and_never_resent(proxied: Any) -> None:
    # The same upstream, undeclared: the request written before the close arrived fails (the proxy cannot know
    # the upstream did not read it) and is not sent again.
    with Upstream(close_after_stream=0.03) as up:
        url, state = proxied(up)
        statuses = alternate(url, 2)
        assert statuses == [200, 502]
        assert up.calls == {"stream": 1}
        assert "resent" not in stale(state)


def test_request_read_then_dropped_is_not_retried(proxied: Any) -> None:
    # The second request on a kept-alive connection is read in full, then the connection closes: the upstream
    # may have acted on it, so the client gets a 502 and the upstream saw it exactly once.
    with Upstream(drop=2) as up:
        url, state = proxied(up)
        with httpx.Client(base_url=url, timeout=10) as client:
            assert client.post("/v1/chat/completions", json=body(0, False)).status_code == 200
            r = client.post("/v1/chat/completions", json=body(1, False))
            assert r.status_code == 502 and "upstream unavailable" in r.text
            assert client.post("/v1/chat/completions", json=body(2, False)).status_code == 200
        assert up.calls == {"plain": 2, "dropped": 1}
        assert up.connections == 2
        assert stale(state) == {}


def test_pooled_connection_found_closed_before_writing_is_resent_on_a_new_one() -> None:
    # The pool's own look at the socket came before the close; the look right before writing sees it.
    async def scenario(up: Upstream) -> None:
        seen: list[str] = []
        transport = ShardedTransport(1, httpx.Limits(), on_stale=seen.append)
        client = httpx.AsyncClient(transport=transport)
        try:
            r = await client.post(up.url + "/v1/chat/completions", json=body(0, True))
            assert r.status_code == 200 and r.text.endswith("[DONE]\n\n")
            await asyncio.sleep(0.1)  # the upstream has closed it by now
            (conn,) = transport._pools[0]._pool.connections
            assert conn.is_idle() and conn.has_expired()
            with pytest.raises(httpcore.ConnectionNotAvailable):
                await conn.handle_async_request(httpcore.Request("POST", up.url + "/v1/chat/completions"))
            assert seen == ["resent"] and conn.is_closed()
            r = await client.post(up.url + "/v1/chat/completions", json=body(1, False))
            assert r.status_code == 200 and up.calls == {"stream": 1, "plain": 1}
        finally:
            await client.aclose()

    with Upstream(close_after_stream=0.05) as up:  # after the pool took the connection back
        asyncio.run(scenario(up))


@pytest.mark.parametrize("client", ["aiohttp", "httpx", "auto"])
def test_idle_connections_expire_before_a_5_s_server_keep_alive_timeout(client: str) -> None:
    config = ProxyConfig(upstream="http://127.0.0.1:9", upstream_client=client)
    assert config.keepalive_expiry < 5.0
    state = ProxyState(config, settings=settings())

    async def scenario() -> None:
        async with state.running():
            transport = state.client.transport
            if client == "httpx":
                assert isinstance(transport, ShardedTransport) and not transport.closes_after_stream
                pool = transport._pools[0]._pool
                assert pool._keepalive_expiry == config.keepalive_expiry
            else:  # the proxy extra has aiohttp: auto picks it
                assert isinstance(transport, AiohttpTransport) and not transport.closes_after_stream
                assert transport._session is not None  # made by the engine probe at start-up
                connector = transport._session.connector
                assert isinstance(connector, aiohttp.TCPConnector)
                assert connector._keepalive_timeout == config.keepalive_expiry

    asyncio.run(scenario())
