"""The aiohttp upstream transport (``agentcache/proxy/_aiotransport.py``, issue 26) against a real local upstream.

The fake upstream is a raw asyncio server in its own thread (``TCP_NODELAY``), scripted per test by one
connection handler; the proxy runs under uvicorn in a thread with ``upstream_client="aiohttp"``, or the transport
is driven directly where the test is about the transport alone.
"""

from __future__ import annotations

import asyncio
import gzip
import json
import socket
import threading
import time
from collections.abc import AsyncIterator, Awaitable, Iterator
from contextlib import contextmanager
from typing import Any

import httpx
import pytest

from agentcache.proxy import ProxyConfig, create_app
from agentcache.proxy._aiotransport import AiohttpTransport
from agentcache.proxy._state import ProxyState
from agentcache.proxy._transport import UpstreamClient
from tests.test_proxy_support import ANTHROPIC_KEY, RawUpstream, ServerThread, anthropic_body, conversation, settings

A = {"x-api-key": ANTHROPIC_KEY, "anthropic-version": "2023-06-01"}


async def read_request(reader: asyncio.StreamReader, heads: list[bytes] | None = None) -> tuple[bytes, bytes]:
    """One request's head and body (``content-length`` or chunked)."""
    head = await reader.readuntil(b"\r\n\r\n")
    if heads is not None:
        heads.append(head)
    fields = {k.strip().lower(): v.strip() for k, _, v in (h.partition(b":") for h in head.split(b"\r\n")[1:])}
    if b"content-length" in fields:
        return head, await reader.readexactly(int(fields[b"content-length"]))
    body = b""
    if fields.get(b"transfer-encoding", b"").lower() == b"chunked":
        while size := int((await reader.readuntil(b"\r\n")).strip(), 16):
            body += (await reader.readexactly(size + 2))[:-2]
        await reader.readuntil(b"\r\n")
    return head, body


def not_found(writer: asyncio.StreamWriter) -> None:
    writer.write(b"HTTP/1.1 404 Not Found\r\ncontent-length: 0\r\n\r\n")


async def requests_to(reader: asyncio.StreamReader, writer: asyncio.StreamWriter, start: bytes) -> AsyncIterator[bytes]:
    """The head of every request whose head starts with ``start`` (the proxy's own start-up probes and any other
    request are answered 404), until the connection ends."""
    while True:
        head, _ = await read_request(reader)
        if head.startswith(start):
            yield head
        else:
            not_found(writer)


@contextmanager
def proxy_to(url: str, **config: Any) -> Iterator[tuple[str, ProxyState]]:
    app = create_app(ProxyConfig(upstream=url, **{"upstream_client": "aiohttp", **config}), settings=settings())
    with ServerThread(app) as server:
        yield server.url, app.state.proxy


def test_a_stream_is_relayed_chunk_by_chunk_before_the_upstream_sends_the_next() -> None:
    got_first = threading.Event()

    async def handler(reader: asyncio.StreamReader, writer: asyncio.StreamWriter) -> None:
        async for _ in requests_to(reader, writer, b"POST /v1/messages"):
            writer.write(b"HTTP/1.1 200 OK\r\ncontent-type: text/event-stream\r\ntransfer-encoding: chunked\r\n\r\n")
            first = b'event: message_start\ndata: {"type":"message_start","message":{"usage":{"input_tokens":5}}}\n\n'
            writer.write(b"%x\r\n%s\r\n" % (len(first), first))
            await writer.drain()
            # The second chunk only once the client holds the first: a relay that buffered would deadlock here.
            ok = await asyncio.get_running_loop().run_in_executor(None, got_first.wait, 10)
            last = b'event: message_stop\ndata: {"type":"message_stop"}\n\n'
            writer.write(b"%x\r\n%s\r\n0\r\n\r\n" % (len(last), last if ok else b"late"))
            await writer.drain()

    with RawUpstream(handler) as up, proxy_to(up.url) as (url, _state):
        body = anthropic_body(conversation(1), stream=True)
        with (
            httpx.Client(base_url=url, timeout=20) as client,
            client.stream("POST", "/v1/messages", json=body, headers=A) as r,
        ):
            chunks = r.iter_raw()
            assert next(chunks).startswith(b"event: message_start")
            got_first.set()
            assert b"".join(chunks) == b'event: message_stop\ndata: {"type":"message_stop"}\n\n'


def test_upstream_error_and_gzip_body_reach_the_client_byte_for_byte_with_only_the_callers_headers() -> None:
    error = b'{"type":"error","error":{"type":"rate_limit_error","message":"slow down"}}'
    zipped = gzip.compress(b'{"data": []}')

    async def handler(reader: asyncio.StreamReader, writer: asyncio.StreamWriter) -> None:
        while True:
            head, _ = await read_request(reader, up.heads)
            if head.startswith(b"POST /v1/messages"):
                writer.write(b"HTTP/1.1 429 Too Many Requests\r\nretry-after: 7\r\ncontent-type: application/json\r\n"
                             b"content-length: %d\r\n\r\n%s" % (len(error), error))  # fmt: skip
            elif head.startswith(b"GET /v1/models"):
                writer.write(b"HTTP/1.1 200 OK\r\ncontent-type: application/json\r\ncontent-encoding: gzip\r\n"
                             b"content-length: %d\r\n\r\n%s" % (len(zipped), zipped))  # fmt: skip
            else:
                not_found(writer)

    with (
        RawUpstream(handler) as up,
        proxy_to(up.url) as (url, _state),
        httpx.Client(base_url=url, timeout=20) as client,
    ):
        r = client.post("/v1/messages", json=anthropic_body(conversation(1)), headers=A)
        assert r.status_code == 429 and r.content == error and r.headers["retry-after"] == "7"
        assert "x-agentcache-error" not in r.headers
        with client.stream("GET", "/v1/models", headers={**A, "accept-encoding": "gzip"}) as g:
            assert g.headers["content-encoding"] == "gzip" and g.read() == b'{"data": []}'
            assert g.num_bytes_downloaded == len(zipped)  # relayed compressed, as the upstream sent it
        get = [h for h in up.heads if h.startswith(b"GET /v1/models")][-1]  # the first: the engine probe
        names = sorted(line.split(b":")[0].lower() for line in get.split(b"\r\n")[1:] if line)
        # the client's headers (minus hop-by-hop) and Host; nothing aiohttp would add (user-agent, accept...)
        assert names == sorted([b"host", b"accept", b"accept-encoding", b"user-agent", b"x-api-key",
                                b"anthropic-version"])  # fmt: skip
        assert b"user-agent: python-httpx" in get.lower() and b"aiohttp" not in get.lower()


def test_connection_refused_is_a_502_in_the_callers_format() -> None:
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        port = s.getsockname()[1]  # bound, never listening: refused
        with proxy_to(f"http://127.0.0.1:{port}") as (url, state), httpx.Client(base_url=url, timeout=20) as client:
            r = client.post("/v1/messages", json=anthropic_body(conversation(1)), headers=A)
            assert r.status_code == 502 and r.headers["x-agentcache-error"] == "1"
            assert r.json()["type"] == "error" and r.json()["error"]["type"] == "api_error"
            assert "connection refused" in r.json()["error"]["message"]
            chat = {"model": "gpt-4o", "messages": [{"role": "user", "content": "hi"}]}
            r = client.post("/v1/chat/completions", json=chat)
            assert r.status_code == 502 and set(r.json()["error"]) == {"message", "type", "param", "code"}
            metrics = state.metrics.render().decode()
            assert 'agentcache_proxy_upstream_errors_total{kind="connect",route="/v1/messages"} 1.0' in metrics


def test_a_silent_upstream_is_a_504_read_timeout() -> None:
    async def handler(reader: asyncio.StreamReader, writer: asyncio.StreamWriter) -> None:
        async for _ in requests_to(reader, writer, b"POST "):
            await asyncio.sleep(30)

    with RawUpstream(handler) as up, proxy_to(up.url, read_timeout=0.3) as (url, _state):
        with httpx.Client(base_url=url, timeout=20) as client:
            r = client.post("/v1/messages", json=anthropic_body(conversation(1)), headers=A)
        assert r.status_code == 504 and "read timeout" in r.json()["error"]["message"]


def _serve_plain(reader: asyncio.StreamReader, writer: asyncio.StreamWriter, close_after: int) -> Awaitable[None]:
    """Answer ``close_after`` requests with a small JSON body each, then close (after 50 ms: once the pool holds
    the connection again)."""

    async def run() -> None:
        for _ in range(close_after):
            await read_request(reader)
            writer.write(b"HTTP/1.1 200 OK\r\ncontent-type: application/json\r\ncontent-length: 2\r\n\r\n{}")
            await writer.drain()
        await asyncio.sleep(0.05)

    return run()


def test_pooled_connection_found_closed_before_writing_is_resent_on_a_new_one() -> None:
    connections: list[int] = []

    async def handler(reader: asyncio.StreamReader, writer: asyncio.StreamWriter) -> None:
        connections.append(1)
        await _serve_plain(reader, writer, 1)

    async def scenario(url: str) -> None:
        seen: list[str] = []
        client = UpstreamClient(AiohttpTransport(httpx.Limits(), on_stale=seen.append), httpx.Timeout(5.0))
        try:
            assert (await client.post(url + "/v1/x", content=b"{}")).status_code == 200
            assert _pooled_socket(client).getsockopt(socket.IPPROTO_TCP, socket.TCP_NODELAY)
            # The upstream closes the idle connection while this loop is busy: the close is in the socket, not yet
            # seen by the pool (the race a busy proxy meets), so only the look right before writing finds it.
            time.sleep(0.3)
            assert (await client.post(url + "/v1/x", content=b"{}")).status_code == 200
            assert seen == ["resent"] and len(connections) == 2
        finally:
            await client.aclose()

    with RawUpstream(handler) as up:
        asyncio.run(scenario(up.url))


def _pooled_socket(client: UpstreamClient) -> Any:
    """The socket of the one idle connection in the aiohttp transport's pool."""
    transport = client.transport
    assert isinstance(transport, AiohttpTransport) and transport._session is not None
    ((proto, _),) = [c for conns in transport._session.connector._conns.values() for c in conns]  # type: ignore[union-attr]
    assert proto.transport is not None
    return proto.transport.get_extra_info("socket")


@pytest.mark.parametrize("method", ["GET", "POST"])
def test_request_read_then_dropped_is_never_resent(method: str) -> None:
    # Written, then the connection closes without an answer: not resent, even an idempotent GET.
    reads: list[bytes] = []

    async def handler(reader: asyncio.StreamReader, writer: asyncio.StreamWriter) -> None:
        await _serve_plain(reader, writer, 1)
        reads.append((await read_request(reader))[0])

    async def scenario(url: str) -> None:
        client = UpstreamClient(AiohttpTransport(httpx.Limits()), httpx.Timeout(5.0))
        try:
            assert (await client.post(url + "/v1/x", content=b"{}")).status_code == 200
            request = client.build_request(method, url + "/v1/y", content=b"{}" if method == "POST" else None)
            with pytest.raises(httpx.RemoteProtocolError):
                await client.send(request)
        finally:
            await client.aclose()

    with RawUpstream(handler) as up:
        asyncio.run(scenario(up.url))
    assert len(reads) == 1 and reads[0].startswith(method.encode())


def test_pool_timeout_when_every_connection_is_busy_and_write_timeout_when_the_upstream_stops_reading() -> None:
    async def handler(reader: asyncio.StreamReader, writer: asyncio.StreamWriter) -> None:
        await reader.readuntil(b"\r\n\r\n")
        await asyncio.sleep(30)  # reads nothing more, answers nothing

    async def scenario(url: str) -> None:
        transport = AiohttpTransport(httpx.Limits(max_connections=1))
        client = UpstreamClient(transport, httpx.Timeout(5.0, pool=0.2, write=0.3))
        try:
            big = client.build_request("POST", url + "/v1/x", content=b"x" * (64 * 1024 * 1024))
            with pytest.raises(httpx.WriteTimeout):
                await client.send(big)
            first = asyncio.create_task(client.send(client.build_request("POST", url + "/v1/x", content=b"{}")))
            await asyncio.sleep(0.1)
            with pytest.raises(httpx.PoolTimeout):
                await client.send(client.build_request("POST", url + "/v1/x", content=b"{}"))
            first.cancel()
            await asyncio.gather(first, return_exceptions=True)
            assert not transport._slots.locked()  # type: ignore[union-attr]  # every slot back
        finally:
            await client.aclose()

    with RawUpstream(handler) as up:
        asyncio.run(scenario(up.url))


def test_a_relayed_chunked_body_over_the_limit_is_a_413_and_an_env_proxy_is_used() -> None:
    got: list[bytes] = []

    async def handler(reader: asyncio.StreamReader, writer: asyncio.StreamWriter) -> None:
        while True:
            head, body = await read_request(reader)
            got.append(head.split(b"\r\n")[0])
            writer.write(b"HTTP/1.1 200 OK\r\ncontent-type: application/json\r\ncontent-length: %d\r\n\r\n%s"
                         % (len(body), body))  # fmt: skip
            await writer.drain()

    def chunks(n: int) -> Iterator[bytes]:
        yield from (b"x" * 500 for _ in range(n))

    with RawUpstream(handler) as up, pytest.MonkeyPatch.context() as mp:
        mp.setenv("HTTP_PROXY", up.url)  # the fake upstream plays the proxy: absolute-form request lines
        mp.delenv("NO_PROXY", raising=False)
        mp.delenv("no_proxy", raising=False)
        with (
            proxy_to("http://upstream.invalid", max_body_bytes=2000) as (url, _),
            httpx.Client(base_url=url, timeout=20, trust_env=False) as client,  # to the agentcache proxy itself
        ):
            r = client.post("/v1/files", content=chunks(3), headers=A)
            assert r.status_code == 200 and r.content == b"x" * 1500
            r = client.post("/v1/files", content=chunks(10), headers=A)
            assert r.status_code == 413 and r.json()["error"]["type"] == "request_too_large"
    assert got[-1] == b"POST http://upstream.invalid/v1/files HTTP/1.1"
    assert json.loads(r.content)["type"] == "error"


def test_without_aiohttp_auto_is_httpx_and_asking_for_it_is_a_config_error(
    monkeypatch: pytest.MonkeyPatch,
) -> None:
    import importlib.util

    from agentcache._exceptions import ConfigError
    from agentcache.proxy._transport import ShardedTransport
    from agentcache.proxy._upstream import client_name, make_transport

    assert client_name(ProxyConfig()) == "aiohttp"  # the proxy extra has it
    find = importlib.util.find_spec
    monkeypatch.setattr(importlib.util, "find_spec", lambda name, *a: None if name == "aiohttp" else find(name, *a))
    config = ProxyConfig(upstream="http://127.0.0.1:9")
    assert client_name(config) == "httpx" and isinstance(make_transport(config), ShardedTransport)
    with pytest.raises(ConfigError, match=r"upstream_client.*aiohttp is not installed"):
        ProxyConfig(upstream_client="aiohttp")


def test_dns_and_refused_failures_say_why() -> None:
    from agentcache.proxy._errors import failure_reason

    async def scenario() -> list[str]:
        client = UpstreamClient(AiohttpTransport(httpx.Limits()), httpx.Timeout(10.0))
        reasons = []
        try:
            for url in ("http://agentcache-test.invalid/x", "http://127.0.0.1:9/x"):
                with pytest.raises(httpx.ConnectError) as info:
                    await client.get(url)
                reasons.append(failure_reason(info.value))
        finally:
            await client.aclose()
        return reasons

    dns, refused = asyncio.run(scenario())
    assert dns.startswith("DNS lookup failed (") and refused == "connection refused"


def test_a_socks_proxy_from_the_environment_stays_with_httpx(monkeypatch: pytest.MonkeyPatch) -> None:
    from agentcache.proxy._upstream import make_transport

    for name in ("HTTP_PROXY", "HTTPS_PROXY", "NO_PROXY", "http_proxy", "https_proxy", "no_proxy"):
        monkeypatch.delenv(name, raising=False)
    monkeypatch.setenv("ALL_PROXY", "http://127.0.0.1:3128")
    config = ProxyConfig(upstream="https://api.example.com")
    assert isinstance(make_transport(config), AiohttpTransport)
    monkeypatch.setenv("ALL_PROXY", "socks5://127.0.0.1:1080")
    with pytest.raises(ImportError, match="socksio"):  # httpx's SOCKS support, as before: its extra is not installed
        make_transport(config)
