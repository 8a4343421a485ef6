"""The engine model against a real llama.cpp ``llama-server`` (SmolLM2-135M, the tools-first template): replays
where sessions interleave turn by turn and thrash the slots (one slot; two slots with the host-memory prompt
cache restoring evicted prompts), then the same server through ``via="agentcache"`` with slot affinity. The
model's ``predicted_cached_tokens`` must equal the ``cached_tokens`` the server reports on at least 90% of the
turns, totals within 2%. Short prompts and ``max_tokens=4``: CPU prefill is ~100-200 tokens/s.
"""

from __future__ import annotations

from collections.abc import Iterator
from dataclasses import replace
from pathlib import Path
from typing import Any

import pytest

from agentcache.engine import LlamaCppCache
from agentcache.loaders import Record
from agentcache.replay import ReplayConfig, ReplayResult, replay
from agentcache.serve.llama import LlamaServer, find_llama_server, smollm2_model_path
from tests import needs
from tests.conftest import policy, real_turns

LLAMA_SERVER = find_llama_server()
SMOLLM2 = smollm2_model_path()
TEMPLATE = Path(__file__).resolve().parent.parent / "agentcache" / "serve" / "llama" / "templates" / "tools_first.jinja"
pytestmark = [
    pytest.mark.llama,
    pytest.mark.skipif(
        LLAMA_SERVER is None or SMOLLM2 is None,
        reason=needs.LLAMA,
    ),
]
SESSIONS, TURNS = 3, 3


def _sessions(prefix: str) -> list[list[Record]]:
    """Three sessions of three turns: a shared policy head for two of them (cross-session reuse), a distinct
    system prompt for the third (no similarity: LRU and the prompt cache decide), real tau-bench user text."""
    head = policy()[:400]
    out = []
    for s in range(SESSIONS):
        system = f"[{prefix}] {head}" if s < 2 else f"({prefix}) You are session {s}. Answer in one word."
        texts = [m["content"][:160] for m in real_turns(s) if m["role"] == "user" and m.get("content")]
        conv: list[dict[str, str]] = [{"role": "system", "content": system + f" Session {s}."}]
        records = []
        for t in range(TURNS):
            conv = [*conv, {"role": "user", "content": texts[t % len(texts)]}]
            records.append(Record(f"{prefix}{s}", "openai.chat", {"model": "m", "messages": conv, "temperature": 0}))
            conv = [*conv, {"role": "assistant", "content": f"Noted, step {t}."}]
        out.append(records)
    return out


def _interleaved(prefix: str) -> list[Record]:
    """Turn by turn across sessions, each request its own replay session (so they run in this order)."""
    groups = _sessions(prefix)
    order = [groups[s][t] for t in range(TURNS) for s in range(SESSIONS)]
    return [replace(r, session=f"{r.session}.{i}") for i, r in enumerate(order)]


def _check(results: list[ReplayResult]) -> dict[str, float]:
    turns = [t for r in results for t in r.turns]
    assert all(t.ok for t in turns), [t.error for t in turns if not t.ok]
    assert all(t.predicted_cached_tokens is not None for t in turns)
    equal = sum(1 for t in turns if t.predicted_cached_tokens == t.cached_tokens)
    predicted = sum(t.predicted_cached_tokens or 0 for t in turns)
    reported = sum(t.cached_tokens or 0 for t in turns)
    assert reported > 0
    assert equal / len(turns) >= 0.9, [(t.session, t.predicted_cached_tokens, t.cached_tokens) for t in turns]
    assert abs(predicted / reported - 1) <= 0.02, (predicted, reported)
    return {"turns": len(turns), "equal": equal, "predicted": predicted, "reported": reported}


@pytest.fixture(params=[1, 2], ids=["1-slot", "2-slots"])
def engine(request: pytest.FixtureRequest, tmp_path: Path) -> Iterator[LlamaServer]:
    """A fresh server per slot count (the model starts from empty slots), a small context per slot."""
    assert SMOLLM2 is not None
    slots = int(request.param)
    with LlamaServer(
        SMOLLM2,
        parallel=slots,
        ctx_size=1024 * slots,
        chat_template_file=TEMPLATE,
        extra_args=["--jinja"],
        log_path=tmp_path / "server.log",
    ) as server:
        yield server


def test_predicted_cached_tokens_match_llama_cpp(engine: LlamaServer) -> None:
    model = LlamaCppCache(slots=engine_slots(engine))
    config = ReplayConfig(engine.base_url, concurrency=1, max_tokens=4)
    thrash = replay(_interleaved("a"), config, engine_model=model)
    # the same server, its state carried on: sessions pinned to slots through the session core
    pinned = replay([r for g in _sessions("b") for r in g], replace(config, via="agentcache"), engine_model=model)
    figures = _check([thrash, pinned])
    print(f"\nengine model vs llama.cpp, {engine_slots(engine)} slot(s): {figures}")  # shown with pytest -s
    assert thrash.prediction() is not None and pinned.to_dict()["prediction"]["turns"] == SESSIONS * TURNS
    assert figures["turns"] == 2 * SESSIONS * TURNS


def engine_slots(server: LlamaServer) -> int:
    """The server's ``--parallel``."""
    return int(server.options.parallel or 1)


def test_live_report_engine_arm_predicts_what_llama_cpp_reports(tmp_path: Path) -> None:
    """In front of llama.cpp the live report gets an ``engine`` arm beside ``reported`` (the cloud simulators'
    minimum lengths show 0 there): one agent session, its replies sent back as generated."""
    from agentcache.proxy import ProxyConfig, create_app
    from tests.test_proxy_support import ServerThread, settings

    assert SMOLLM2 is not None
    with LlamaServer(
        SMOLLM2, parallel=1, ctx_size=2048, chat_template_file=TEMPLATE, log_path=tmp_path / "s.log"
    ) as llm:
        app = create_app(ProxyConfig(upstream=llm.base_url, engine="llama"), settings=settings())
        with ServerThread(app) as proxy:
            totals, reported = _live_session(proxy.url, app.state.proxy)
    assert reported > 0 and totals["reported"]["cache_read_tokens"] == reported
    assert totals["engine"]["requests"] == 3
    assert abs(totals["engine"]["cache_read_tokens"] - reported) <= 0.02 * reported, (totals["engine"], reported)
    assert totals["engine"]["prompt_tokens"] == totals["reported"]["prompt_tokens"]
    print(f"\nlive engine arm: {totals['engine']}; reported: {totals['reported']}")  # shown with pytest -s


def _live_session(url: str, state: Any) -> tuple[dict[str, Any], int]:
    """Three turns of one session through the proxy at ``url``; the live report's totals and the cached tokens
    the engine reported."""
    import openai

    from tests.test_proxy_support import eventually

    client = openai.OpenAI(base_url=url + "/v1", api_key="local", max_retries=0, timeout=300)
    messages: list[dict[str, str]] = [{"role": "system", "content": policy()[:300]}]
    texts = [m["content"][:120] for m in real_turns(0) if m["role"] == "user" and m.get("content")]
    reported = 0
    for text in texts[:3]:
        messages.append({"role": "user", "content": text})
        done = client.chat.completions.create(model="m", messages=messages, max_tokens=4, temperature=0)  # type: ignore[arg-type]
        assert done.usage is not None and done.usage.prompt_tokens_details is not None
        reported += done.usage.prompt_tokens_details.cached_tokens or 0
        messages.append({"role": "assistant", "content": done.choices[0].message.content or ""})
    eventually(lambda: state.report.engine is not None and state.report.engine.total.requests == 3, timeout=60)
    return state.report.to_dict()["totals"], reported
