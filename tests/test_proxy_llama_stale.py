"""Streamed then plain requests through the proxy to a real llama.cpp ``llama-server`` (issue 12, item 5).

llama-server closes its keep-alive connection after every streamed response (without ``Connection: close``),
up to a few milliseconds after the last chunk; a request sent on that connection in between failed with
"502 upstream unavailable (RemoteProtocolError)" (4 of 30 alternating requests before the fix). The proxy runs
under uvicorn (uvloop when installed, as ``agentcache proxy`` does) with the engine declared (``agentcache
serve``) or recognised at start-up; every request must succeed, and reach the engine once.

Skips when the binary (``scripts/build-llama-server``) or the model is missing; CI builds both.
"""

from __future__ import annotations

from collections.abc import Iterator
from typing import Any

import httpx
import pytest

from agentcache._engines.llama import LlamaServer, find_llama_server, smollm2_model_path
from agentcache.proxy import ProxyConfig, create_app
from tests.test_proxy_support import ServerThread, settings

LLAMA_SERVER = find_llama_server()
SMOLLM2 = smollm2_model_path()
pytestmark = [
    pytest.mark.llama,
    pytest.mark.skipif(
        LLAMA_SERVER is None or SMOLLM2 is None,
        reason="llama-server or SmolLM2 GGUF missing (scripts/build-llama-server --with-model; CI builds them)",
    ),
]
REQUESTS = 10


@pytest.fixture(scope="module")
def engine(tmp_path_factory: pytest.TempPathFactory) -> Iterator[LlamaServer]:
    assert SMOLLM2 is not None
    log = tmp_path_factory.mktemp("llama") / "server.log"
    with LlamaServer(SMOLLM2, log_path=log) as server:
        yield server


def _count(text: str, prefix: str) -> float:
    return sum(float(line.rsplit(" ", 1)[1]) for line in text.splitlines() if line.startswith(prefix))


@pytest.mark.parametrize("declared", ["llama.cpp", "none"])
def test_streamed_then_plain_requests_all_succeed(engine: LlamaServer, declared: str) -> None:
    app = create_app(ProxyConfig(upstream=engine.base_url, engine=declared), settings=settings())
    statuses: list[tuple[bool, int]] = []
    with ServerThread(app) as server, httpx.Client(base_url=server.url, timeout=60) as client:
        for i in range(REQUESTS):
            stream = i % 2 == 0
            doc: dict[str, Any] = {
                "messages": [{"role": "system", "content": "Be brief."}, {"role": "user", "content": f"Say {i}."}],
                "max_tokens": 4,
                "temperature": 0,
                "stream": stream,
            }
            with client.stream("POST", "/v1/chat/completions", json=doc) as r:
                body = r.read()
                statuses.append((stream, r.status_code))
                if stream and r.status_code == 200:
                    assert body.rstrip().endswith(b"data: [DONE]")
        metrics = app.state.proxy.metrics.render().decode()
    assert statuses == [(i % 2 == 0, 200) for i in range(REQUESTS)]
    assert _count(metrics, "agentcache_proxy_upstream_errors_total{") == 0
    # Every streamed response's connection was closed by the proxy, never reused.
    assert _count(metrics, 'agentcache_proxy_stale_connections_total{action="closed_after_stream"}') == REQUESTS // 2
