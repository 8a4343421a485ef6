"""``agentcache proxy --workers N`` (issue 26): several processes on one port, sessions shared through Redis.

A real proxy with two workers in front of a real upstream: one session's turns, each on a new connection (so the
kernel spreads them over the workers), are numbered as one session's; a stream in flight when SIGTERM comes is
finished, then the proxy says ``proxy.stopped`` and exits 0. Without Redis, more than one worker is refused.
"""

from __future__ import annotations

import json
import signal
import socket
import subprocess
import sys
import time
import urllib.request
from typing import Any

import pytest
from starlette.applications import Starlette
from starlette.requests import Request
from starlette.responses import JSONResponse
from starlette.routing import Route

from agentcache._exceptions import ConfigError
from agentcache.proxy import load_proxy_config
from tests.test_proxy_redis import redis_url  # noqa: F401  # the module's redis-server fixture
from tests.test_proxy_stop import CHUNKS, _slow_upstream, signal_mid_stream
from tests.test_proxy_support import ServerThread


def test_the_server_runs_on_httptools_and_uvloop() -> None:
    """The proxy extra's ``uvicorn[standard]`` brings uvicorn's C parser and loop; benchmarks/proxy_layers.py measured
    its pure-Python parser (h11) adding ~0.3 ms a request."""
    from uvicorn.protocols.http.httptools_impl import HttpToolsProtocol
    from uvloop import Loop

    from agentcache.proxy._config import ProxyConfig
    from agentcache.proxy._server import uvicorn_config

    config = uvicorn_config(_upstream(), ProxyConfig(port=0))
    config.load()
    assert issubclass(config.http_protocol_class, HttpToolsProtocol)
    factory = config.get_loop_factory()
    assert factory is not None
    loop = factory()
    try:
        assert isinstance(loop, Loop)
    finally:
        loop.close()


def test_more_than_one_worker_needs_redis() -> None:
    with pytest.raises(ConfigError, match="redis_url"):
        load_proxy_config(workers=2)
    assert load_proxy_config(workers=2, redis_url="redis://127.0.0.1:1").workers == 2
    assert load_proxy_config().workers == 1


def _upstream() -> Starlette:
    """The slow stream of tests/test_proxy_stop.py, plus ``/v1/messages`` answering every request at once."""

    async def messages(request: Request) -> JSONResponse:
        usage = {"input_tokens": 5, "output_tokens": 1}
        return JSONResponse({"type": "message", "role": "assistant", "content": [], "usage": usage})

    return Starlette(routes=[*_slow_upstream().routes, Route("/v1/messages", messages, methods=["POST"])])


def _post(port: int, session: str) -> dict[str, str]:
    body = json.dumps({"model": "claude-opus-4-8", "max_tokens": 5, "messages": [{"role": "user", "content": "hi"}]})
    req = urllib.request.Request(
        f"http://127.0.0.1:{port}/v1/messages",
        data=body.encode(),
        headers={"content-type": "application/json", "x-api-key": "sk-test", "x-agentcache-session": session},
    )
    with urllib.request.urlopen(req, timeout=30) as r:  # a new connection each time
        r.read()
        return dict(r.headers)


def _events(text: str) -> list[dict[str, Any]]:
    return [json.loads(line) for line in text.splitlines() if line.startswith("{")]


def test_two_workers_share_sessions_and_drain_on_sigterm(redis_url: str) -> None:  # noqa: F811
    with ServerThread(_upstream()) as upstream:
        argv = [sys.executable, "-m", "agentcache", "--log-format", "json", "proxy", "--port", "0", "--workers", "2"]
        proc = subprocess.Popen(
            [*argv, "--upstream", upstream.url, "--redis-url", redis_url], stderr=subprocess.PIPE, text=True
        )
        try:
            assert proc.stderr is not None
            start = json.loads(proc.stderr.readline())
            assert start["event"] == "proxy.start" and start["workers"] == 2
            port = start["port"]
            for _ in range(6):
                _post(port, "shared-1")
            received, rest, code = signal_mid_stream(proc, port, signal.SIGTERM)
        finally:
            proc.kill()
    assert code == 0, rest
    assert [line for line in received if line.startswith(b"data: ")] == [
        f"data: chunk {i}\n".encode() for i in range(CHUNKS)
    ]
    events = _events(rest)
    turns = sorted(
        e["session_signal"]["turn"]
        for e in events
        if e["event"] == "proxy.request" and (e.get("session_signal") or {}).get("session_id") == "shared-1"
    )
    assert turns == list(range(6)), rest  # one session, whichever worker served each turn
    assert events[-1]["event"] == "proxy.stopped", rest
    assert "Traceback" not in rest


def test_workers_exit_when_their_supervisor_is_killed(redis_url: str) -> None:  # noqa: F811
    """SIGKILL leaves the supervisor no chance to stop its workers: each notices and drains itself, freeing the port."""
    argv = [sys.executable, "-m", "agentcache", "--log-format", "json", "proxy", "--port", "0", "--workers", "2"]
    proc = subprocess.Popen(
        [*argv, "--upstream", "http://127.0.0.1:9", "--redis-url", redis_url], stderr=subprocess.PIPE, text=True
    )
    try:
        assert proc.stderr is not None
        port = json.loads(proc.stderr.readline())["port"]
        deadline = time.monotonic() + 60
        while not _listening(port):  # the workers serve
            assert time.monotonic() < deadline, "the workers never listened"
            time.sleep(0.2)
    finally:
        proc.kill()
        proc.wait(timeout=30)
    deadline = time.monotonic() + 30
    while _accepting(port):
        assert time.monotonic() < deadline, "orphaned workers still serve the port"
        time.sleep(0.2)


def _listening(port: int) -> bool:
    try:
        return bool(_post_health(port))
    except OSError:
        return False


def _accepting(port: int) -> bool:
    try:
        with socket.create_connection(("127.0.0.1", port), timeout=1):
            return True
    except OSError:
        return False


def _post_health(port: int) -> bytes:
    with urllib.request.urlopen(f"http://127.0.0.1:{port}/agentcache/v1/health", timeout=5) as r:
        return bytes(r.read())
