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

import pytest

from agentcache._engines.llama import LlamaServer, find_llama_server, smollm2_model_path
from agentcache.engine import LlamaCppCache
from agentcache.loaders import Record
from agentcache.replay import ReplayConfig, ReplayResult, replay
from tests.conftest import policy, real_turns

LLAMA_SERVER = find_llama_server()
SMOLLM2 = smollm2_model_path()
TEMPLATE = Path(__file__).resolve().parent.parent / "agentcache" / "_engines" / "templates" / "tools_first.jinja"
pytestmark = [
    pytest.mark.llama,
    pytest.mark.skipif(
        LLAMA_SERVER is None or SMOLLM2 is None,
        reason="llama-server or SmolLM2 GGUF missing (scripts/build-llama-server --with-model; CI builds them)",
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
