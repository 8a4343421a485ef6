"""``agentcache plan``: the tiered radix tree (pages, LRU and session-aware eviction, L2/L3 demotion and
promotion), the sweep's monotonicity, the bundled traffic, the CLI, and sizes from a model config."""

from __future__ import annotations

import json
import random
import sys
from pathlib import Path

import pytest
from hypothesis import given, settings
from hypothesis import strategies as st
from typer.testing import CliRunner

from agentcache import ConfigError
from agentcache import _cli as cli
from agentcache.engine import TieredRadixCache, ids_prompt
from agentcache.loaders import load
from agentcache.plan import (
    PlanConfig,
    PlanOptions,
    Step,
    kv_bytes_from_config,
    parse_sizes,
    plan,
    simulate,
)
from agentcache.plan._capacity import Ratio

ROOT = Path(__file__).resolve().parent.parent
TAU = ROOT / "data" / "tau-bench" / "gpt-4o-airline.json"
SWE = ROOT / "data" / "swe-agent" / "marshmallow-code__marshmallow-1867.function_calling.traj"
sys.path.insert(0, str(ROOT))
from benchmarks.subagents import subagent_fanout  # noqa: E402


def _req(cache: TieredRadixCache, ids: list[int], session: str = "s") -> tuple[int, int, int, int]:
    a = cache.request(ids_prompt(ids).page_keys(cache.page_size), len(ids), session)
    return a.l1, a.l2, a.l3, a.prefill


# -- the tree ----------------------------------------------------------------------------------------------------


def test_reuse_is_whole_pages_only() -> None:
    cache = TieredRadixCache(page_size=4, l1_tokens=64)
    assert _req(cache, list(range(10))) == (0, 0, 0, 10)
    # 10 tokens cached as 2 pages (8); the next prompt shares 9 tokens, of which 8 are whole pages.
    assert _req(cache, [*range(9), 99, 98, 97]) == (8, 0, 0, 4)
    assert cache.resident()["l1"] == 12


def test_lru_evicts_the_least_recent_leaf_and_keeps_the_shared_head() -> None:
    cache = TieredRadixCache(page_size=1, l1_tokens=8)
    head = [1, 2]
    _req(cache, [*head, 10, 11, 12, 13], "a")
    assert _req(cache, [*head, 20, 21, 22, 23], "b") == (2, 0, 0, 4)  # a's last 2 tokens go, the head is shared
    assert _req(cache, [*head, 20, 21, 22, 23, 24], "b") == (6, 0, 0, 1)  # and one more of a's
    assert _req(cache, [*head, 10, 11, 12, 13], "a") == (3, 0, 0, 3)


def test_l2_keeps_what_l1_evicts_and_a_hit_there_is_loaded_back() -> None:
    cache = TieredRadixCache(page_size=1, l1_tokens=8, l2_tokens=32)
    _req(cache, list(range(8)), "a")
    _req(cache, list(range(100, 108)), "b")  # a is evicted from L1 but stays in L2 (write-through)
    assert _req(cache, list(range(8)), "a") == (0, 8, 0, 0)
    assert cache.resident() == {"l1": 8, "l2": 16, "l3": 0}
    assert _req(cache, list(range(8)), "a") == (8, 0, 0, 0)  # promoted back to L1


def test_l3_serves_pages_after_l1_and_l2_dropped_them() -> None:
    cache = TieredRadixCache(page_size=2, l1_tokens=8, l2_tokens=0, l3_tokens=64)
    _req(cache, list(range(8)), "a")
    _req(cache, list(range(100, 108)), "b")
    assert _req(cache, [*range(8), 50, 51], "a") == (0, 0, 8, 2)


def test_session_aware_eviction_drops_unreferenced_entries_first() -> None:
    """A live session's prefix older than a closed session's: LRU evicts the live one, session-aware the
    closed one (SGLang: ``(session_ref > 0, session_ref, last_access_time)``)."""
    results = {}
    for eviction in ("lru", "session"):
        cache = TieredRadixCache(page_size=1, l1_tokens=12, eviction=eviction)
        _req(cache, list(range(6)), "live")
        _req(cache, list(range(100, 106)), "done")
        cache.release("done")
        _req(cache, list(range(200, 206)), "new")  # 6 tokens must go: the oldest, or the unreferenced
        results[eviction] = _req(cache, [*range(6), 7], "live")[0]
    assert results == {"lru": 0, "session": 6}


def test_close_dereferences_a_session_and_references_move_with_its_frontier() -> None:
    cache = TieredRadixCache(page_size=1, l1_tokens=100, eviction="session")
    _req(cache, [1, 2, 3], "a")
    _req(cache, [1, 2, 3, 4, 5], "a")  # the frontier advances: one reference per node, not two
    _req(cache, [1, 2, 9], "b")
    node = cache._root.children[ids_prompt([1]).page_keys(1)[0]]
    assert node.refs == 2
    assert [n.refs for n in _chain(node)] == [2, 2, 1, 1, 1]
    cache.release("a")
    assert node.refs == 1 and cache._frontier == {"b": {_chain(node)[1].children[_key(9)]}}
    cache.release("b")
    assert node.refs == 0 and not cache._frontier


def _key(i: int) -> object:
    return ids_prompt([i]).page_keys(1)[0]


def _chain(node: object) -> list:  # type: ignore[type-arg]
    out = [node]
    while out[-1].children:  # type: ignore[attr-defined]
        out.append(next(iter(out[-1].children.values())))  # type: ignore[attr-defined]
    return out


def test_idle_timeout_dereferences_like_close() -> None:
    steps = [
        Step(0.0, "old", ids_prompt(list(range(6)))),
        Step(10.0, "idle", ids_prompt(list(range(100, 106)))),
        Step(70.0, "done", ids_prompt(list(range(300, 306))), last=True),  # closed after its request
        Step(100.0, "new", ids_prompt(list(range(200, 206)))),  # 6 tokens must go
        Step(101.0, "old", ids_prompt([*range(6), 6])),
    ]
    timed_out = simulate(steps, PlanConfig(18, eviction="session"), 1, idle_timeout=50.0)
    held = simulate(steps, PlanConfig(18, eviction="session"), 1, idle_timeout=None)
    # Idle > 50 s at t=100: `old` and `idle` are dereferenced like `done`, and LRU order evicts `old`.
    assert timed_out.l1_hit_tokens == 0
    # No idle timeout: `old` is still referenced, so the closed `done` goes instead.
    assert held.l1_hit_tokens == 6


def test_slot_eviction_keeps_only_the_last_prompt() -> None:
    cache = TieredRadixCache(page_size=1, l1_tokens=1000, eviction="slot")
    _req(cache, [1, 2, 3, 4], "a")
    _req(cache, [1, 2, 7, 8], "b")
    assert _req(cache, [1, 2, 3, 4, 5], "a") == (2, 0, 0, 3)  # like llama.cpp's one slot: LCP with b only


# -- the sweep ---------------------------------------------------------------------------------------------------


@st.composite
def workloads(draw: st.DrawFn) -> tuple[list[Step], int]:
    seed = draw(st.integers(0, 10_000))
    rng = random.Random(seed)
    heads = [list(range(1000 * h, 1000 * h + rng.randint(0, 12))) for h in range(3)]
    sessions: dict[int, list[int]] = {}
    steps, t = [], 0.0
    for _ in range(draw(st.integers(3, 40))):
        s = rng.randrange(6)
        cur = sessions.get(s)
        if cur is None or rng.random() < 0.1:
            cur = [*rng.choice(heads), 10_000 * s + rng.randrange(50)]
        cur = cur + [rng.randrange(100_000) for _ in range(rng.randint(1, 10))]
        sessions[s] = cur
        t += rng.choice([0.5, 1.0, 50.0])
        steps.append(Step(t, f"s{s}", ids_prompt(cur), rng.random() < 0.1))
    return steps, draw(st.sampled_from([1, 2, 4]))


@settings(max_examples=60, deadline=None)
@given(
    work=workloads(),
    eviction=st.sampled_from(["lru", "session"]),
    l2_ratio=st.sampled_from([0, 2, 3]),
    idle=st.sampled_from([None, 20.0]),
)
def test_hit_rate_never_falls_as_l1_grows(
    work: tuple[list[Step], int], eviction: str, l2_ratio: int, idle: float | None
) -> None:
    """Over L1 sizes that hold the largest prompt (an engine cannot serve a longer one), with L2 a multiple of
    L1 (SGLang's ``--hicache-ratio``) or none."""
    steps, page = work
    largest = max(s.prompt.tokens for s in steps)
    hits = [
        simulate(steps, PlanConfig(l1, l2_ratio * l1, 0, eviction), page, idle_timeout=idle).hit_tokens
        for l1 in range(largest + page, largest + 160, 7)
    ]
    assert hits == sorted(hits), hits


def _tau(sessions: int) -> list:  # type: ignore[type-arg]
    records = load(TAU).records
    keep = list(dict.fromkeys(r.session for r in records))[:sessions]
    return [r for r in records if r.session in keep]


@pytest.mark.parametrize("name", ["taubench", "swe-agent", "fanout"])
def test_bundled_traffic_sweeps_are_monotone_and_session_aware_is_at_least_lru(name: str) -> None:
    records = {"taubench": lambda: _tau(24), "swe-agent": lambda: load(SWE).records, "fanout": subagent_fanout}[name]()
    report = plan(records, PlanOptions(l2=(0, Ratio(2))))
    assert report.requests == len(records) and not report.errors
    by = {(c.config.l1_tokens, c.config.l2_tokens, c.config.eviction): c for c in report.configs}
    l1s = sorted({k[0] for k in by})
    assert len(l1s) >= 3
    for eviction in ("lru", "session"):
        for ratio in (0, 2):
            rates = [by[(l1, ratio * l1, eviction)].hit_rate for l1 in l1s]
            assert rates == sorted(rates), (eviction, ratio, rates)
    for l1 in l1s:
        assert by[(l1, 0, "session")].hit_tokens >= by[(l1, 0, "lru")].hit_tokens
    top = by[(l1s[-1], 0, "lru")]
    assert top.evicted_tokens == 0 and top.hit_rate == pytest.approx(report.unbounded_hit_rate)


def test_fanout_session_aware_beats_lru_where_l1_is_tight() -> None:
    report = plan(subagent_fanout(), PlanOptions())
    tight = min(c.config.l1_tokens for c in report.configs)
    lru, session = (
        next(c for c in report.configs if c.config.l1_tokens == tight and c.config.eviction == e)
        for e in ("lru", "session")
    )
    assert lru.evicted_tokens > 0
    assert session.hit_tokens > lru.hit_tokens and session.prefill_tokens < lru.prefill_tokens


# -- the command and the sizes -----------------------------------------------------------------------------------


def test_plan_json_has_every_config_and_recommends_serve_flags() -> None:
    args = ["plan", str(SWE), "--json", "--l1-tokens", "4096,16k", "--l2-tokens", "0,2x", "--prefill-tps", "5000",
            "--kv-bytes-per-token", "147456", "--model", "Qwen/Qwen3-8B"]  # fmt: skip
    result = CliRunner().invoke(cli.app, args, catch_exceptions=False)
    assert result.exit_code == 0, result.output
    doc = json.loads(result.stdout)
    configs = doc["configs"]
    assert [(c["l1_tokens"], c["l2_tokens"], c["eviction"]) for c in configs] == [
        (4096, 0, "lru"), (4096, 0, "session"), (4096, 8192, "lru"), (4096, 8192, "session"),
        (16384, 0, "lru"), (16384, 0, "session"), (16384, 32768, "lru"), (16384, 32768, "session"),
    ]  # fmt: skip
    for c in configs:
        assert c["prompt_tokens"] == c["hit_tokens"] + c["prefill_tokens"]
        assert 0 <= c["hit_rate"] <= 1 and set(c["ttft_s"]) == {"p50", "p95", "p99"}
    assert configs[0]["evicted_tokens"] > 0
    assert all(r["command"].startswith("agentcache serve Qwen/Qwen3-8B") for r in doc["recommendations"])
    assert any("tiktoken" in a for a in doc["assumptions"])
    assert doc["checklist"][0]["item"] == "tokens each turn shares with the previous one"


def test_plan_table_and_bad_flags() -> None:
    ok = CliRunner().invoke(cli.app, ["plan", str(SWE), "--l1-tokens", "8k"], catch_exceptions=False)
    assert ok.exit_code == 0 and "Pre-launch checklist" in ok.stdout and "Recommended" in ok.stdout
    for bad in (["--eviction", "fifo"], ["--l1-tokens", "4GB"], ["--l1-tokens", "2x"], ["--rate", "0"]):
        result = CliRunner().invoke(cli.app, ["plan", str(SWE), *bad], catch_exceptions=False)
        assert result.exit_code == 2 and result.stderr.startswith("agentcache: error: --"), (bad, result.output)


def test_sizes_and_kv_bytes_from_a_model_config(tmp_path: Path) -> None:
    qwen3_8b = {"num_hidden_layers": 36, "num_attention_heads": 32, "num_key_value_heads": 8, "head_dim": 128,
                "hidden_size": 4096, "torch_dtype": "bfloat16"}  # fmt: skip
    path = tmp_path / "config.json"
    path.write_text(json.dumps(qwen3_8b))
    kv = kv_bytes_from_config(path)
    assert kv == 2 * 36 * 8 * 128 * 2 == 147_456
    assert parse_sizes("64k,1M,16GB", "--l1-tokens", kv) == [65_536, 1_048_576, 16_000_000_000 // kv]
    assert parse_sizes("0,2x", "--l2-tokens", None, ratio=True) == [0, Ratio(2.0)]
    path.write_text(json.dumps({"num_hidden_layers": 61, "kv_lora_rank": 512, "qk_rope_head_dim": 64}))
    assert kv_bytes_from_config(path) == 61 * 576 * 2
    with pytest.raises(ConfigError):
        parse_sizes("16GB", "--l1-tokens", None)
