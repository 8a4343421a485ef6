"""The proxy's boundary (issue 24, items 5-7), under uvicorn as ``agentcache proxy`` runs it: one path normalisation
before routing, a stream the upstream cuts counted once with no traceback, and the server's own timeouts (keep-alive
above clients' pool expiry, header and body read deadlines)."""

from __future__ import annotations

import http.client
import logging
import socket
import time
from collections.abc import AsyncIterator, Iterator
from typing import Any

import httpx
import pytest

from agentcache._config import Settings
from agentcache.proxy import ProxyConfig, create_app
from agentcache.proxy._boundary import clean_path, own_path
from tests.test_proxy_support import ANTHROPIC_KEY, FakeUpstream, Seen, ServerThread, anthropic_body, conversation

A = {"x-api-key": ANTHROPIC_KEY, "content-type": "application/json"}


def _serve(fake: FakeUpstream, **config: Any) -> tuple[ServerThread, Any]:
    cfg = ProxyConfig(**config)
    app = create_app(cfg, settings=Settings(), transport=fake.transport())
    return ServerThread(app, proxy=cfg), app.state.proxy


def _raw(
    port: int, method: str, path: str, body: bytes = b"", headers: dict[str, str] | None = None
) -> tuple[int, dict[str, str], bytes]:
    """One request with its path exactly as given (http.client does not normalise it)."""
    conn = http.client.HTTPConnection("127.0.0.1", port, timeout=20)
    try:
        conn.request(method, path, body=body or None, headers={**A, **(headers or {})})
        r = conn.getresponse()
        return r.status, {k.lower(): v for k, v in r.getheaders()}, r.read()
    finally:
        conn.close()


def test_clean_path_removes_dot_segments_as_the_upstream_would() -> None:
    assert clean_path(b"/v1/../agentcache/v1/report") == b"/agentcache/v1/report"
    assert clean_path(b"/./agentcache/v1/sessions/x/close") == b"/agentcache/v1/sessions/x/close"
    assert clean_path(b"/v1/%2E%2e/agentcache") == b"/agentcache"
    assert clean_path(b"/v1/messages/..") == b"/v1/" and clean_path(b"/../..") == b"/"
    assert clean_path(b"/a%2Fb/c") == b"/a%2Fb/c"  # an encoded slash is no separator
    assert clean_path(b"//agentcache/x") == b"//agentcache/x"  # kept: the namespace check folds it


@pytest.mark.parametrize(
    "path",
    ["/agentcache", "/agentcache/v1/x", "//agentcache/v1/report", "/agentcache\x00/v1/report", "/METRICS",
     "/Agentcache/v1/report", "/%61gentcache/v1/report", "/%2561gentcache/x", "/v1\\..\\agentcache/x", "/metrics/"],
)  # fmt: skip
def test_own_path_however_it_is_spelt(path: str) -> None:
    assert own_path(path)


@pytest.mark.parametrize("path", ["/v1/messages", "/v1/models", "/agentcachex", "/metricsx", "/v1/agentcache"])
def test_other_paths_are_not_own(path: str) -> None:
    assert not own_path(path)


@pytest.fixture(scope="module")
def served() -> Iterator[tuple[ServerThread, FakeUpstream, Any]]:
    fake = FakeUpstream()
    server, state = _serve(fake, upstream="http://upstream.test/base", header_timeout=1.0, body_timeout=1.0)
    with server:
        yield server, fake, state


@pytest.mark.parametrize(
    ("method", "path"),
    [("GET", "/v1/../agentcache/v1/report"), ("POST", "/./agentcache/v1/sessions/x/close"),
     ("GET", "//agentcache/v1/report"), ("GET", "/agentcache%00/v1/report"), ("GET", "/METRICS"),
     ("GET", "/v1/%2e%2e/agentcache/v1/report"), ("POST", "/AGENTCACHE/v1/sessions/x/close"),
     ("GET", "/%61gentcache/v1/report"), ("GET", "/v1/..%2F..%2Fagentcache/v1/report")],
)  # fmt: skip
def test_no_spelling_of_the_namespace_reaches_the_upstream(
    served: tuple[ServerThread, FakeUpstream, Any], method: str, path: str
) -> None:
    server, fake, _ = served
    before = len(fake.requests)
    status, headers, body = _raw(server.port, method, path)
    assert len(fake.requests) == before, fake.requests[-1].path  # never relayed with the caller's key
    assert status in (200, 404, 405)
    assert status == 200 or headers.get("x-agentcache-error") == "1" or b'"closed":false' in body  # ours


def test_a_dot_segment_path_is_routed_and_forwarded_as_normalised(
    served: tuple[ServerThread, FakeUpstream, Any],
) -> None:
    server, fake, _ = served
    status, _, body = _raw(server.port, "GET", "/v1/../agentcache/v1/report")
    assert status == 200 and b'"totals"' in body  # the report endpoint itself, the caller's own tenant
    status, _, _ = _raw(server.port, "GET", "/v1/models/../models?x=1")
    assert status == 200 and fake.requests[-1].path == "/base/v1/models"  # the path the check saw, under the base
    _raw(server.port, "GET", "/v1/../../../etc/passwd")
    assert fake.requests[-1].path == "/base/etc/passwd"  # dot segments never climb above the configured base
    status, _, _ = _raw(server.port, "POST", "/v1/x/../messages", body=_body(), headers={"x-agentcache-session": "d"})
    assert status == 200 and fake.requests[-1].path == "/base/v1/messages"


def _body() -> bytes:
    import json

    return json.dumps(anthropic_body(conversation(1))).encode()


# ---- a stream the upstream cuts -------------------------------------------------------------------------------


class _Records(logging.Handler):
    def __init__(self) -> None:
        super().__init__()
        self.records: list[logging.LogRecord] = []

    def emit(self, record: logging.LogRecord) -> None:
        self.records.append(record)


def _cut(seen: Seen) -> httpx.Response | None:
    if seen.path != "/v1/messages":
        return None

    async def body() -> AsyncIterator[bytes]:
        yield b'event: message_start\ndata: {"type":"message_start","message":{"usage":{"input_tokens":5}}}\n\n'
        raise httpx.RemoteProtocolError("peer closed connection without sending complete message body")

    return httpx.Response(200, headers={"content-type": "text/event-stream"}, content=body())


def test_a_cut_stream_is_counted_once_and_logs_no_traceback() -> None:
    fake = FakeUpstream(fault=_cut)
    server, state = _serve(fake)
    records = _Records()
    uvicorn_log = logging.getLogger("uvicorn.error")
    uvicorn_log.addHandler(records)
    try:
        with server, httpx.Client(base_url=server.url, timeout=20) as client:
            for _ in range(3):
                with (
                    pytest.raises(httpx.RemoteProtocolError),
                    client.stream("POST", "/v1/messages", content=_body(), headers=A) as r,
                ):
                    assert r.status_code == 200
                    b"".join(r.iter_raw())
            deadline = time.monotonic() + 10
            while "stream_cut" not in state.metrics.render().decode() and time.monotonic() < deadline:
                time.sleep(0.02)
            time.sleep(0.2)
            metrics = state.metrics.render().decode()
    finally:
        uvicorn_log.removeHandler(records)
    counted = [ln for ln in metrics.splitlines() if ln.startswith("agentcache_proxy_requests_total{")]
    assert len(counted) == 1 and 'status="200"' in counted[0] and counted[0].endswith(" 3.0"), counted
    assert 'agentcache_proxy_upstream_errors_total{kind="stream_cut",route="/v1/messages"} 3.0' in metrics
    assert "agentcache_proxy_fail_open_total{" not in metrics
    assert [r for r in records.records if r.exc_info] == []  # no traceback from the server


# ---- the server's timeouts ------------------------------------------------------------------------------------


def test_a_request_after_an_idle_keep_alive_longer_than_clients_pool_expiry_is_served(
    served: tuple[ServerThread, FakeUpstream, Any],
) -> None:
    """httpx (the Anthropic and OpenAI SDKs) keeps an idle connection 5 s: a request it sends at 5 s goes on the
    connection the server must not have closed."""
    server, _, _ = served
    with socket.create_connection(("127.0.0.1", server.port), timeout=20) as sock:
        request = b"GET /agentcache/v1/health HTTP/1.1\r\nhost: proxy\r\n\r\n"
        sock.sendall(request)
        first = _response(sock)
        time.sleep(5.5)
        sock.sendall(request)
        second = _response(sock)
    assert first.startswith(b"HTTP/1.1 200") and second.startswith(b"HTTP/1.1 200")


def _response(sock: socket.socket) -> bytes:
    data = b""
    while b"\r\n\r\n" not in data:
        chunk = sock.recv(65536)
        if not chunk:
            return data
        data += chunk
    head, _, rest = data.partition(b"\r\n\r\n")
    length = next(int(ln.split(b":")[1]) for ln in head.split(b"\r\n") if ln.lower().startswith(b"content-length"))
    while len(rest) < length:
        rest += sock.recv(65536)
    return data


def test_headers_that_never_complete_lose_their_connection(served: tuple[ServerThread, FakeUpstream, Any]) -> None:
    server, _, _ = served
    with socket.create_connection(("127.0.0.1", server.port), timeout=10) as idle:
        started = time.monotonic()
        assert idle.recv(1) == b""  # nothing sent at all: closed at the header deadline (1 s here)
        assert time.monotonic() - started < 5
    with socket.create_connection(("127.0.0.1", server.port), timeout=10) as slow:
        slow.sendall(b"GET /agentcache/v1/health HTTP/1.1\r\nhost: proxy\r\n")
        time.sleep(0.3)
        slow.sendall(b"x-slow: 1\r\n")  # trickling: the deadline counts from the first byte, not the last
        started = time.monotonic()
        assert slow.recv(1) == b"" and time.monotonic() - started < 5


def test_a_body_that_stops_coming_gets_a_408(served: tuple[ServerThread, FakeUpstream, Any]) -> None:
    server, fake, _ = served
    before = len(fake.requests)
    for path in ("/v1/messages", "/v1/other"):  # a pipeline route, and a relayed one
        with socket.create_connection(("127.0.0.1", server.port), timeout=10) as sock:
            head = f"POST {path} HTTP/1.1\r\nhost: proxy\r\nx-api-key: k\r\ncontent-type: application/json\r\n"
            sock.sendall(head.encode() + b'content-length: 100\r\n\r\n{"model":')
            started = time.monotonic()
            answer = _response(sock)
        assert answer.startswith(b"HTTP/1.1 408"), answer[:200]
        assert time.monotonic() - started < 5
    assert all(r.path != "/base/v1/other" for r in fake.requests[before:])
