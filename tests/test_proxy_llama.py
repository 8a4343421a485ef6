"""The proxy under uvicorn in front of a real llama.cpp ``llama-server`` (SmolLM2-135M), driven by the real SDKs.

A real tau-bench session (the first airline run: its system prompt and first turns, tool calls and results
rendered as text) is replayed turn by turn through the proxy on ``/v1/messages`` (Anthropic SDK) and
``/v1/chat/completions`` (OpenAI SDK), alternating plain and streamed requests. The cached tokens the
server itself reports must grow with every turn, and the proxy's usage tap must read the same numbers.

Skips when the binary (``scripts/build-llama-server``) or the model is missing; CI builds both.
"""

from __future__ import annotations

import itertools
import json
import warnings
from collections.abc import Iterator
from typing import Any

import anthropic
import httpx
import openai
import pytest

from agentcache.proxy import ProxyConfig, create_app
from agentcache.serve.llama import LlamaServer, find_llama_server, smollm2_model_path
from tests import needs
from tests.conftest import policy, real_turns
from tests.test_proxy_support import ServerThread, eventually, settings

LLAMA_SERVER = find_llama_server()
SMOLLM2 = smollm2_model_path()
pytestmark = [
    pytest.mark.llama,
    pytest.mark.skipif(
        LLAMA_SERVER is None or SMOLLM2 is None,
        reason=needs.LLAMA,
    ),
]
TURNS = 4
T0 = {"temperature": 0}  # as a raw field: newer Anthropic SDKs dropped the keyword


def _text_turns(run: int = 0) -> list[tuple[str, str]]:
    """The run's messages as (role, text): tool calls and tool results become plain text, roles alternate."""
    out: list[tuple[str, str]] = []
    for m in real_turns(run):
        role = "assistant" if m["role"] == "assistant" else "user"
        text = m.get("content") or ""
        if m.get("tool_calls"):
            text = (text + "\n" if text else "") + "Calling tools: " + json.dumps(m["tool_calls"])
        if m["role"] == "tool":
            text = f"Tool result: {text}"
        if out and out[-1][0] == role:
            out[-1] = (role, out[-1][1] + "\n" + text)
        else:
            out.append((role, text))
    return out


def _requests(label: str) -> tuple[str, list[list[tuple[str, str]]]]:
    """System prompt and, for each of the first TURNS turns, the conversation so far (ending with a user
    message, as an agent sends it)."""
    turns = _text_turns()
    convs = [turns[: 2 * k + 1] for k in range(TURNS)]
    assert all(c[-1][0] == "user" for c in convs)
    return f"[{label}] {policy()}", convs


@pytest.fixture(scope="module")
def engine(tmp_path_factory: pytest.TempPathFactory) -> Iterator[LlamaServer]:
    """One llama-server for the module (its tests use distinct prompts, so they share no prefix)."""
    assert SMOLLM2 is not None
    log = tmp_path_factory.mktemp("llama") / "server.log"
    with LlamaServer(SMOLLM2, log_path=log, ctx_size=16384) as server:
        yield server


@pytest.fixture(scope="module")
def proxied(engine: LlamaServer) -> Iterator[tuple[ServerThread, Any]]:
    app = create_app(ProxyConfig(upstream=engine.base_url, engine="llama"), settings=settings())
    with ServerThread(app) as server:
        yield server, app.state.proxy


def _grows(cached: list[int], shown: str) -> None:
    assert all(b > a for a, b in itertools.pairwise(cached)), shown
    assert cached[-1] > 1000, shown  # the policy alone is thousands of tokens


def test_messages_through_proxy_reuse_grows(proxied: tuple[ServerThread, Any]) -> None:
    server, state = proxied
    client = anthropic.Anthropic(base_url=server.url, api_key="local", max_retries=0, timeout=300)
    system, convs = _requests("messages")
    cached: list[int] = []
    for k, conv in enumerate(convs):
        msgs: Any = [{"role": r, "content": t} for r, t in conv]
        with warnings.catch_warnings():
            warnings.simplefilter("ignore")  # the SDK warns about model names it does not know
            if k % 2 == 0:
                resp = client.messages.create(
                    model="smollm2", system=system, messages=msgs, max_tokens=4, extra_body=T0
                )
                usage = resp.usage
            else:
                with client.messages.stream(
                    model="smollm2", system=system, messages=msgs, max_tokens=4, extra_body=T0
                ) as stream:
                    usage = stream.get_final_message().usage
        cached.append(usage.cache_read_input_tokens or 0)
    shown = f"cached per turn: {cached}"
    _grows(cached, shown)
    eventually(lambda: sum(s["requests"] for s in state.report.to_dict()["sessions"]) >= TURNS)
    sessions = state.report.to_dict()["sessions"]
    mine = [s for s in sessions if s["requests"] == TURNS and s["arms"]["reported"]["cache_read_tokens"] == sum(cached)]
    assert mine, f"{shown}; proxy report: {json.dumps(sessions)}"
    assert state.report.to_dict()["breaks"] == []


def test_chat_completions_through_proxy_reuse_grows(proxied: tuple[ServerThread, Any]) -> None:
    server, state = proxied
    client = openai.OpenAI(base_url=server.url + "/v1", api_key="local", max_retries=0, timeout=300)
    system, convs = _requests("chat")
    cached: list[int] = []
    for k, conv in enumerate(convs):
        msgs: Any = [{"role": "system", "content": system}, *({"role": r, "content": t} for r, t in conv)]
        if k % 2 == 0:
            done = client.chat.completions.create(model="smollm2", messages=msgs, max_tokens=4, temperature=0)
            usage = done.usage
        else:
            chunks = list(
                client.chat.completions.create(
                    model="smollm2",
                    messages=msgs,
                    max_tokens=4,
                    temperature=0,
                    stream=True,
                    stream_options={"include_usage": True},
                )
            )
            usage = next(c.usage for c in reversed(chunks) if c.usage is not None)
        assert usage is not None and usage.prompt_tokens_details is not None
        cached.append(usage.prompt_tokens_details.cached_tokens or 0)
    shown = f"cached per turn: {cached}"
    _grows(cached, shown)
    eventually(lambda: sum(s["requests"] for s in state.report.to_dict()["sessions"]) >= 2 * TURNS)
    doc = state.report.to_dict()
    mine = [s for s in doc["sessions"] if s["arms"]["reported"]["cache_read_tokens"] == sum(cached)]
    assert len(mine) == 1 and mine[0]["requests"] == TURNS, f"{shown}; report: {json.dumps(doc['sessions'])}"


# ---- stale keep-alive connections (issue 12, item 5) ------------------------------------------------------------
# llama-server closes its keep-alive connection after every streamed response (without ``Connection: close``), up
# to a few milliseconds after the last chunk; a request sent on that connection in between failed with "502
# upstream unavailable (RemoteProtocolError)" (4 of 30 alternating requests before the fix). With the engine
# declared (``agentcache serve``) or recognised at start-up, every request must succeed, and reach the engine once.
STALE_REQUESTS = 10


def _count(text: str, prefix: str) -> float:
    return sum(float(line.rsplit(" ", 1)[1]) for line in text.splitlines() if line.startswith(prefix))


@pytest.mark.parametrize("declared", ["llama.cpp", "none"])
def test_streamed_then_plain_requests_all_succeed(engine: LlamaServer, declared: str) -> None:
    app = create_app(ProxyConfig(upstream=engine.base_url, engine=declared), settings=settings())
    statuses: list[tuple[bool, int]] = []
    with ServerThread(app) as server, httpx.Client(base_url=server.url, timeout=60) as client:
        for i in range(STALE_REQUESTS):
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
    assert statuses == [(i % 2 == 0, 200) for i in range(STALE_REQUESTS)]
    assert _count(metrics, "agentcache_proxy_upstream_errors_total{") == 0
    # Every streamed response's connection was closed by the proxy, never reused.
    closed = _count(metrics, 'agentcache_proxy_stale_connections_total{action="closed_after_stream"}')
    assert closed == STALE_REQUESTS // 2
