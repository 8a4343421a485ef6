"""OpenAI models with explicit cache breakpoints (gpt-5.6+): capability table, wire placement and the
breakpoint-mode simulator."""

from __future__ import annotations

import copy
from dataclasses import replace

from agentcache import audit
from agentcache.adapters import canonicalize
from agentcache.loaders import load
from agentcache.model import _causes as C
from agentcache.model._rules import openai_rules, supports_breakpoints
from agentcache.session._pipeline import SessionPipeline

from .conftest import DATA


def test_capability_table() -> None:
    assert not supports_breakpoints("gpt-4o") and not supports_breakpoints("gpt-5")
    assert supports_breakpoints("gpt-5.6") and supports_breakpoints("gpt-5.10-mini") and supports_breakpoints("gpt-6")
    rules = openai_rules("gpt-5.6")
    assert rules.breakpoints and rules.breakpoint_ttl_seconds == 1800 and rules.max_explicit_with_implicit == 3


def _as_model(records: list, model: str) -> list:  # type: ignore[type-arg]
    return [replace(r, body={**r.body, "model": model}) for r in records]


def test_system_breakpoint_on_the_wire_keeps_the_clients_shapes_and_breakpoints() -> None:
    rec = load(DATA / "tau-bench" / "gpt-4o-airline.json").records[0]
    body = {**rec.body, "model": "gpt-5.6"}
    text = body["messages"][0]["content"]
    # A string system message stays a string (an OpenAI-compatible server may take nothing else): no breakpoint.
    prep = SessionPipeline("openai").prepare("openai.chat", copy.deepcopy(body))
    assert prep.body["messages"][0] == body["messages"][0] and prep.markers == ()
    # One the client sent as parts gets the breakpoint on its last part.
    parts = copy.deepcopy(body)
    parts["messages"][0]["content"] = [{"type": "text", "text": text}]
    prep = SessionPipeline("openai").prepare("openai.chat", copy.deepcopy(parts))
    system = prep.body["messages"][0]["content"]
    assert system == [{"type": "text", "text": text, "prompt_cache_breakpoint": {"mode": "explicit"}}]
    assert prep.markers == ("messages[0].content[0]",)
    assert "prompt_cache_breakpoint" not in parts["messages"][0]["content"][0]  # the client's body is untouched
    # The client's own breakpoints are kept as sent (markers in = markers out), and take the slots first.
    own = copy.deepcopy(parts)
    last = own["messages"][-1]
    last["content"] = [
        {"type": "text", "text": last["content"], "prompt_cache_breakpoint": {"mode": "explicit", "x": 1}}
    ]
    prep = SessionPipeline("openai").prepare("openai.chat", copy.deepcopy(own))
    assert prep.body["messages"][-1] == own["messages"][-1]
    assert set(prep.markers) == {"messages[0].content[0]", f"messages[{len(own['messages']) - 1}].content[0]"}


def test_breakpoint_mode_simulation_reads_exact_prefix() -> None:
    records = _as_model(load(DATA / "tau-bench" / "gpt-4o-airline.json").records[:40], "gpt-5.6")
    r = audit(records, "openai")
    t = r.turns[1]
    # Implicit breakpoint at the end of the newest message: turn 1 reads all of turn 0, unrounded.
    assert t.arms["as_sent"].cache_read_tokens == r.turns[0].arms["as_sent"].prompt_tokens
    assert r.totals["agentcache"].cache_read_tokens >= r.totals["as_sent"].cache_read_tokens


def test_rewrite_window_breakpoint_beats_implicit_only() -> None:
    records = _as_model(
        load(DATA / "swe-agent" / "marshmallow-code__marshmallow-1867.function_calling.traj").records, "gpt-5.6"
    )
    r = audit(records, "openai")
    sent, ours = r.totals["as_sent"], r.totals["agentcache"]
    assert ours.cache_read_tokens > sent.cache_read_tokens
    assert any(m.cause == C.MARKERS_MISSING for m in r.misses if m.arm == "as_sent")


def test_explicit_mode_without_breakpoints_caches_nothing() -> None:
    rec = load(DATA / "tau-bench" / "gpt-4o-airline.json").records[:3]
    bodies = [{**r.body, "model": "gpt-5.6", "prompt_cache_options": {"mode": "explicit"}} for r in rec]
    reqs = [canonicalize("openai.chat", b) for b in bodies]
    from agentcache.simulate import OpenAISimulator

    sim = OpenAISimulator()
    results = [sim.run(q, float(i)) for i, q in enumerate(reqs)]
    assert all(x.usage.cache_read_tokens == 0 for x in results)
    assert results[1].loss_cause == C.MARKERS_MISSING
