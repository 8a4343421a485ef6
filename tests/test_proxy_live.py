"""The proxy under uvicorn on a real socket, in front of a small raw-socket upstream that misbehaves on purpose:
streams are relayed chunk by chunk (never buffered), a stalled upstream becomes a 504 without hanging, an
upstream that drops the connection mid-stream drops the client's stream too, and a client that goes away
mid-stream releases the upstream connection at once."""

from __future__ import annotations

import asyncio
import json
import socket
import threading
import time
from collections.abc import Iterator
from typing import Any

import httpx
import pytest

from agentcache.proxy import ProxyConfig, create_app
from tests.test_proxy_support import ServerThread, anthropic_body, conversation, eventually, settings

CHUNK_GAP = 0.2


class RawUpstream:
    """A loopback HTTP/1.1 server on its own event loop thread. The request body's ``"model"`` picks the
    behaviour: ``stall`` (never answers), ``cut`` (headers + one SSE chunk, then closes), ``slow`` (an SSE
    chunk every ``CHUNK_GAP`` seconds, 10 in all); anything else gets a normal short stream."""

    def __init__(self) -> None:
        self.loop = asyncio.new_event_loop()
        self.port = 0
        self.events: list[tuple[str, float]] = []
        self.open_connections = 0
        self._ready = threading.Event()
        self.thread = threading.Thread(target=self._run, daemon=True)

    def _run(self) -> None:
        asyncio.set_event_loop(self.loop)
        server = self.loop.run_until_complete(asyncio.start_server(self._conn, "127.0.0.1", 0))
        self.port = server.sockets[0].getsockname()[1]
        self._ready.set()
        self.loop.run_forever()

    def __enter__(self) -> RawUpstream:
        self.thread.start()
        self._ready.wait(10)
        return self

    def __exit__(self, *exc: object) -> None:
        asyncio.run_coroutine_threadsafe(self._shutdown(), self.loop).result(10)
        self.loop.call_soon_threadsafe(self.loop.stop)
        self.thread.join(10)

    async def _shutdown(self) -> None:
        """Cancel the connection handlers still waiting (a ``stall`` request) while the loop still runs."""
        tasks = [t for t in asyncio.all_tasks() if t is not asyncio.current_task()]
        for task in tasks:
            task.cancel()
        await asyncio.gather(*tasks, return_exceptions=True)

    async def _conn(self, reader: asyncio.StreamReader, writer: asyncio.StreamWriter) -> None:
        writer.get_extra_info("socket").setsockopt(socket.IPPROTO_TCP, socket.TCP_NODELAY, 1)
        self.open_connections += 1
        probe = False
        try:
            while True:
                head = await reader.readuntil(b"\r\n\r\n")
                if head.startswith(b"GET "):  # the proxy asking what the upstream is (not an engine)
                    writer.write(b"HTTP/1.1 404 Not Found\r\ncontent-length: 0\r\nconnection: close\r\n\r\n")
                    await writer.drain()
                    probe = True
                    return
                length = next(
                    int(line.split(b":")[1])
                    for line in head.split(b"\r\n")
                    if line.lower().startswith(b"content-length")
                )
                model = json.loads(await reader.readexactly(length)).get("model")
                self.events.append((f"request:{model}", time.monotonic()))
                if model == "stall":
                    await asyncio.sleep(3600)
                writer.write(
                    b"HTTP/1.1 200 OK\r\ncontent-type: text/event-stream\r\ntransfer-encoding: chunked\r\n\r\n"
                )
                count = {"cut": 1, "slow": 10}.get(str(model), 3)
                for i in range(count):
                    data = f'event: ping\ndata: {{"i": {i}}}\n\n'.encode()
                    writer.write(b"%x\r\n%s\r\n" % (len(data), data))
                    await writer.drain()
                    self.events.append((f"sent:{i}", time.monotonic()))
                    if model == "slow":
                        await asyncio.sleep(CHUNK_GAP)
                if model == "cut":
                    writer.transport.abort()
                    return
                writer.write(b"0\r\n\r\n")
                await writer.drain()
        except (asyncio.IncompleteReadError, ConnectionError, StopIteration):
            pass
        finally:
            self.open_connections -= 1
            if not probe:
                self.events.append(("closed", time.monotonic()))
            writer.close()


@pytest.fixture(params=["aiohttp", "httpx"])
def stack(request: pytest.FixtureRequest) -> Iterator[tuple[RawUpstream, ServerThread, Any]]:
    with RawUpstream() as upstream:
        url = f"http://127.0.0.1:{upstream.port}"
        cfg = ProxyConfig(upstream=url, read_timeout=1.0, upstream_client=request.param)
        app = create_app(cfg, settings=settings())
        with ServerThread(app) as server:
            yield upstream, server, app.state.proxy


def _body(model: str) -> dict[str, Any]:
    return {**anthropic_body(conversation(1), stream=True), "model": model}


def test_stream_is_relayed_chunk_by_chunk(stack: tuple[RawUpstream, ServerThread, Any]) -> None:
    upstream, server, state = stack
    with (
        httpx.Client(base_url=server.url, timeout=30) as client,
        client.stream("POST", "/v1/messages", json=_body("slow")) as r,
    ):
        it = r.iter_raw()
        first = next(it)
        got_first = time.monotonic()
        rest = b"".join(it)
    assert first.startswith(b"event: ping") and (first + rest).count(b"event: ping") == 10
    last_sent = max(t for name, t in upstream.events if name.startswith("sent:"))
    assert got_first < last_sent - 5 * CHUNK_GAP  # the first chunk arrived long before the upstream finished
    eventually(lambda: _inflight(state) == 0)


def test_concurrent_streams_share_the_pools(stack: tuple[RawUpstream, ServerThread, Any]) -> None:
    _, server, state = stack

    async def many() -> list[int]:
        async with httpx.AsyncClient(base_url=server.url, timeout=30) as client:
            rs = await asyncio.gather(*(client.post("/v1/messages", json=_body("fine")) for _ in range(32)))
        return [r.status_code for r in rs]

    assert asyncio.run(many()) == [200] * 32
    eventually(lambda: _inflight(state) == 0)


def test_stalled_upstream_becomes_504_without_hanging(stack: tuple[RawUpstream, ServerThread, Any]) -> None:
    _, server, state = stack
    started = time.monotonic()
    with httpx.Client(base_url=server.url, timeout=30) as client:
        r = client.post("/v1/messages", json=_body("stall"))
    assert r.status_code == 504 and r.json()["error"]["type"] == "timeout_error"
    assert time.monotonic() - started < 5
    eventually(lambda: _inflight(state) == 0)


def test_upstream_cut_mid_stream_cuts_the_client(stack: tuple[RawUpstream, ServerThread, Any]) -> None:
    _, server, state = stack
    with httpx.Client(base_url=server.url, timeout=30) as client:
        with pytest.raises(httpx.RemoteProtocolError), client.stream("POST", "/v1/messages", json=_body("cut")) as r:
            assert r.status_code == 200
            b"".join(r.iter_raw())
        # the proxy is still healthy afterwards
        ok = client.post("/v1/messages", json=_body("fine"))
        assert ok.status_code == 200 and ok.text.count("event: ping") == 3
    cut = 'agentcache_proxy_upstream_errors_total{kind="stream_cut",route="/v1/messages"} 1.0'
    eventually(lambda: cut in state.metrics.render().decode())
    eventually(lambda: _inflight(state) == 0)


def _inflight(state: Any) -> int:
    """Requests the upstream transport counts as in flight (0 once every response is closed)."""
    return int(state.client.transport.in_flight)


def test_client_gone_releases_the_upstream_connection(stack: tuple[RawUpstream, ServerThread, Any]) -> None:
    upstream, server, state = stack
    with (
        httpx.Client(base_url=server.url, timeout=30) as client,
        client.stream("POST", "/v1/messages", json=_body("slow")) as r,
    ):
        next(r.iter_raw())  # leaving the block closes the client's connection mid-stream
    deadline = time.monotonic() + 5
    while time.monotonic() < deadline and not any(name == "closed" for name, _ in upstream.events):
        time.sleep(0.05)
    sent = [name for name, _ in upstream.events if name.startswith("sent:")]
    assert any(name == "closed" for name, _ in upstream.events), upstream.events
    assert len(sent) < 10  # the upstream stopped streaming: its connection was closed, not drained
    assert upstream.open_connections == 0
    eventually(lambda: _inflight(state) == 0)
