"""Subagent fan-out (issue 14) without a network: the simulator's concurrency (an entry is readable only at its
writer's first byte; coalescing waits for it), the sibling-prefix breakpoint learned per lineage, and the
generated fan-out workload audited against every baseline and against agentcache without coalescing."""

from __future__ import annotations

import sys
from collections import Counter
from pathlib import Path
from typing import Any

import pytest

from agentcache import Identity, Sessions, audit
from agentcache.model import _causes as C
from agentcache.policies import STRATEGIES
from agentcache.simulate import AnthropicSimulator, Concurrency
from tests.test_simulate import req

sys.path.insert(0, str(Path(__file__).resolve().parent.parent / "benchmarks"))
from _subagents import subagents


def test_an_entry_is_readable_only_after_its_writers_first_byte() -> None:
    sim = AnthropicSimulator(concurrency=Concurrency(ttft=1.0))
    first = sim.run(req(20, {19: "5m"}), 0.0)
    assert first.usage.cache_write_tokens == 2000
    sibling = sim.run(req(21, {20: "5m"}), 0.5)  # sent while the first has not answered yet: writes again
    assert (sibling.usage.cache_read_tokens, sibling.usage.cache_write_tokens) == (0, 2100)
    assert sibling.loss_cause == C.WRITE_IN_FLIGHT and sibling.matched_tokens == 2000
    later = sim.run(req(22, {21: "5m"}), 1.5)  # after the first byte: reads
    assert later.usage.cache_read_tokens == 2100 and later.loss_cause is None
    # A recorded first-byte delay wins over the given TTFT.
    sim2 = AnthropicSimulator(concurrency=Concurrency(ttft=1.0))
    sim2.run(req(20, {19: "5m"}), 0.0, first_byte=0.2)
    assert sim2.run(req(21, {20: "5m"}), 0.5).usage.cache_read_tokens == 2000
    # Without concurrency an entry is readable at once (the recorded-order model).
    plain = AnthropicSimulator()
    plain.run(req(20, {19: "5m"}), 0.0)
    assert plain.run(req(21, {20: "5m"}), 0.0).usage.cache_read_tokens == 2000


def test_a_coalescing_simulator_waits_for_the_writer_within_the_bound() -> None:
    sim = AnthropicSimulator(concurrency=Concurrency(ttft=1.0, coalesce=True, hold=3.0))
    sim.run(req(20, {19: "5m"}), 0.0)
    held = sim.run(req(21, {20: "5m"}), 0.25)
    assert held.usage.cache_read_tokens == 2000 and held.held_s == pytest.approx(0.75)
    assert sim.holds == [pytest.approx(0.75)]
    # Its own new entry is readable at its own first byte, 0.25 + 0.75 (held) + 1.0 = 2.0: a request at 1.9 waits
    # 0.1 s for it too.
    third = sim.run(req(22, {21: "5m"}), 1.9)
    assert third.usage.cache_read_tokens == 2100 and third.held_s == pytest.approx(0.1)
    bounded = AnthropicSimulator(concurrency=Concurrency(ttft=5.0, coalesce=True, hold=3.0))
    bounded.run(req(20, {19: "5m"}), 0.0)
    late = bounded.run(req(21, {20: "5m"}), 1.0)  # the writer answers at +5 s: beyond the bound, no hold
    assert late.held_s == 0 and late.usage.cache_read_tokens == 0 and late.loss_cause == C.WRITE_IN_FLIGHT


def _first_request(i: int, context: str) -> dict[str, Any]:
    from tests.test_proxy_support import anthropic_body

    blocks = [
        {"type": "text", "text": context},
        {"type": "text", "text": f"Subagent task {i}: check the refund rules for case {i}."},
        {"type": "text", "text": "<env>cwd: /work\ndate: 2026-12-01</env>", "cache_control": {"type": "ephemeral"}},
    ]
    return anthropic_body([{"role": "user", "content": blocks}])


def test_the_second_sibling_marks_the_end_of_the_shared_task_context() -> None:
    from tests.conftest import policy

    sessions = Sessions(provider="anthropic")
    context = policy()[:4000]  # the task context the parent hands each subagent
    main = sessions.begin("anthropic.messages", _first_request(9, context), identity=Identity(session="run"))
    assert "sibling" not in main.prepared.marker_reasons  # the main agent has no siblings
    main.succeed()
    turns = []
    for i in range(3):
        turn = sessions.begin(
            "anthropic.messages", _first_request(i, context), identity=Identity(session=f"run/agent-{i}", parent="run")
        )
        turns.append(turn)
    first, second, third = (dict(zip(t.prepared.markers, t.prepared.marker_reasons, strict=True)) for t in turns)
    assert "sibling" not in first.values()  # nothing learned yet
    # Siblings 2 and 3 diverge from the latest sibling at content[1]: the marker ends their shared part.
    assert second.get("messages[0].content[0]") == "sibling" and third.get("messages[0].content[0]") == "sibling"
    assert len(second) <= 4 and "messages[0].content[2]" in second  # the client's own tail marker is kept
    body = turns[1].body
    assert body["messages"][0]["content"][0]["cache_control"] == {"type": "ephemeral"}
    # A later turn of a subagent is no first request: nothing sibling-specific.
    for t in turns:
        t.succeed()
    nxt = _first_request(1, context)
    nxt["messages"] += [{"role": "assistant", "content": "ok"}, {"role": "user", "content": "go on"}]
    later = sessions.begin("anthropic.messages", nxt, identity=Identity(session="run/agent-1", parent="run"))
    assert "sibling" not in later.prepared.marker_reasons


def test_fanout_workload_costs_less_with_coalescing_than_every_baseline_and_than_without() -> None:
    records = subagents(parents=3)
    assert Counter(r.meta["parent"] is not None for r in records)[True] >= 12 * 2
    plain = audit(records, "anthropic", "claude-opus-4-8", compare=True)
    report = audit(records, "anthropic", "claude-opus-4-8", compare=True, ttft=1.0)
    cost = {arm: m.cost_usd for arm, m in report.totals.items()}
    ours, without = cost["agentcache_coalesced"], cost["agentcache"]
    assert ours < without * 0.9  # siblings launched together read one write instead of each writing it
    for arm in STRATEGIES:
        assert ours < cost[arm]
    misses = Counter((m.arm, m.cause) for m in report.misses)
    assert misses[("agentcache", C.WRITE_IN_FLIGHT)] >= 6 and misses[("agentcache_coalesced", C.WRITE_IN_FLIGHT)] == 0
    # Coalescing recovers what the recorded-order model (every entry readable at once) already assumed.
    assert ours == pytest.approx(plain.totals["agentcache"].cost_usd, rel=1e-9)
    assert "agentcache_coalesced" not in plain.totals
    with pytest.raises(Exception, match="ttft"):
        audit(records[:2], "openai", ttft=1.0)


def _launch(spacing: float, count: int = 10) -> list[tuple[str, str]]:
    """``count`` subagents of one parent launched ``spacing`` seconds apart: each first request's TTL and reason."""
    from tests.conftest import policy

    sessions = Sessions(provider="anthropic")
    context = policy()[:4000]
    main = sessions.begin("anthropic.messages", _first_request(9, context), identity=Identity(session="run"), at=0.0)
    main.succeed()
    out = []
    for i in range(count):
        who = Identity(session=f"run/agent-{i}", parent="run")
        turn = sessions.begin("anthropic.messages", _first_request(i, context), identity=who, at=10.0 + i * spacing)
        turn.succeed()
        assert turn.prepared.ttl is not None
        out.append((turn.prepared.ttl.ttl, turn.prepared.ttl.reason))
    return out


def test_subagent_ttl_follows_the_lineages_launch_gaps() -> None:
    # Siblings launched together: their entries are read again within seconds, 5m every time (claude-code#74318:
    # a blanket 1h TTL for subagents costs more).
    together = _launch(2.0)
    assert [ttl for ttl, _ in together] == ["5m"] * 10
    assert "9 sibling launch gaps seen" in together[-1][1]
    # Launched ten minutes apart: once the long launch gaps are established, the 2x write pays for itself.
    apart = [ttl for ttl, _ in _launch(600.0)]
    assert apart[:3] == ["5m"] * 3 and apart[-1] == "1h" and apart.index("1h") >= 3
    assert apart[apart.index("1h") :] == ["1h"] * (10 - apart.index("1h"))
