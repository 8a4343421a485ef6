"""SIGTERM ends the proxy as Ctrl-C does (issue 22): what systemd, Docker and Kubernetes send. A real
``agentcache proxy`` process in front of a real slow upstream: a stream in flight when the signal comes is
finished, then the proxy says ``proxy.stopped`` and exits 0."""

from __future__ import annotations

import asyncio
import json
import signal
import subprocess
import sys
import threading
import urllib.request
from collections.abc import AsyncIterator
from typing import Any

import pytest
from starlette.applications import Starlette
from starlette.requests import Request
from starlette.responses import StreamingResponse
from starlette.routing import Route

from tests.test_proxy_support import ServerThread

CHUNKS = 6
GAP_S = 0.25  # between chunks: the stream lasts about 1.5 s, well within the proxy's drain bound (10 s)


def _slow_upstream() -> Starlette:
    async def slow(request: Request) -> StreamingResponse:
        async def chunks() -> AsyncIterator[bytes]:
            for i in range(CHUNKS):
                yield f"data: chunk {i}\n\n".encode()
                await asyncio.sleep(GAP_S)

        return StreamingResponse(chunks(), media_type="text/event-stream")

    return Starlette(routes=[Route("/slow", slow)])


def signal_mid_stream(proc: subprocess.Popen[str], port: int, sig: signal.Signals) -> tuple[list[bytes], str, int]:
    """Read ``/slow`` through the proxy ``proc`` listening on ``port``, send ``sig`` once the first chunk arrived,
    and return the lines the client received, the proxy's remaining stderr and its exit code."""
    assert proc.stderr is not None
    received: list[bytes] = []
    first = threading.Event()

    def read() -> None:
        with urllib.request.urlopen(f"http://127.0.0.1:{port}/slow", timeout=30) as r:
            for line in r:
                received.append(line)
                first.set()

    reader = threading.Thread(target=read)
    reader.start()
    assert first.wait(timeout=20), "no first chunk"
    proc.send_signal(sig)  # mid-stream
    reader.join(timeout=30)
    rest = proc.stderr.read()
    return received, rest, proc.wait(timeout=30)


def _events(lines: list[str]) -> list[dict[str, Any]]:
    return [json.loads(line) for line in lines if line.startswith("{")]


@pytest.mark.parametrize("sig", [signal.SIGTERM, signal.SIGINT], ids=["SIGTERM", "SIGINT"])
def test_a_signal_drains_the_stream_in_flight_then_stops_with_exit_0(sig: signal.Signals) -> None:
    with ServerThread(_slow_upstream()) as upstream:
        argv = [sys.executable, "-m", "agentcache", "--log-format", "json", "proxy", "--port", "0"]
        proc = subprocess.Popen([*argv, "--upstream", upstream.url], stderr=subprocess.PIPE, text=True)
        try:
            assert proc.stderr is not None
            start = json.loads(proc.stderr.readline())
            assert start["event"] == "proxy.start" and start["port"] > 0
            received, rest, code = signal_mid_stream(proc, start["port"], sig)
        finally:
            proc.kill()
    chunks = [line for line in received if line.startswith(b"data: ")]
    assert chunks == [f"data: chunk {i}\n".encode() for i in range(CHUNKS)]  # the whole stream, not cut
    assert code == 0, rest
    events = _events(rest.splitlines())
    assert [e["event"] for e in events][-1] == "proxy.stopped" and events[-1]["port"] == start["port"], rest
    assert "Traceback" not in rest


def test_sigterm_before_serving_still_ends_with_proxy_stopped() -> None:
    """A SIGTERM while uvicorn is still starting (its own handlers not yet installed) ends the same way."""
    code = (
        "import os, signal, uvicorn\n"
        "from agentcache._log_output import configure_logging\n"
        "from agentcache.proxy import load_proxy_config, serve\n"
        "def run(self, sockets=None):\n"
        "    os.kill(os.getpid(), signal.SIGTERM)\n"
        "uvicorn.Server.run = run\n"
        "configure_logging('json', 'info')\n"
        "serve(load_proxy_config(port=0, upstream='http://127.0.0.1:9'))\n"
    )
    done = subprocess.run([sys.executable, "-c", code], capture_output=True, text=True, timeout=60, check=False)
    assert done.returncode == 0, done.stderr
    assert [e["event"] for e in _events(done.stderr.splitlines())] == ["proxy.start", "proxy.stopped"], done.stderr
