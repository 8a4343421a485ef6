"""Sessions: identity, generations, attempts, forks, closing, idle timeout, bounded tombstones, stale responses,
lifecycle events (structlog, callable, Prometheus sinks), and the subagent must-shows: a forked subagent reads
the parent's prefix in the Anthropic simulator and carries the parent's ``prompt_cache_key`` on OpenAI."""

from __future__ import annotations

import json
from collections.abc import Iterator
from typing import Any

import pytest

from agentcache import LifecycleEvent, PrometheusSink, Session, Sessions, normalize_usage
from agentcache._log import capture_logs
from agentcache.model._canonical import static_end
from agentcache.simulate import AnthropicSimulator

from .conftest import anthropic_tools, openai_tools, policy

API = "anthropic.messages"
SECRET = "TOP-SECRET-PROMPT-TEXT-4711"


class Clock:
    """A fake wall clock (seconds)."""

    def __init__(self, t: float = 1_000_000.0) -> None:
        self.t = t

    def __call__(self) -> float:
        return self.t


@pytest.fixture
def quiet() -> Iterator[None]:
    """Nothing to silence any more: the library prints nothing unless the host configures logging."""
    yield


def body(turns: int, tag: str = "", tools: list[dict[str, Any]] | None = None) -> dict[str, Any]:
    msgs: list[dict[str, Any]] = []
    for i in range(turns):
        msgs.append({"role": "user", "content": f"{tag} question {i}"})
        if i < turns - 1:
            msgs.append({"role": "assistant", "content": f"{tag} answer {i}"})
    return {
        "model": "claude-opus-4-8",
        "max_tokens": 64,
        "system": policy(),
        "tools": tools or anthropic_tools(),
        "messages": msgs,
    }


USAGE = normalize_usage({"usage": {"input_tokens": 10, "cache_read_input_tokens": 1000, "output_tokens": 5}})


def turn(session: Session, b: dict[str, Any], now: float | None = None) -> Any:
    t = session.begin(API, b, now=now)
    return t.succeed(USAGE)


def test_ids_forks_and_lineage(quiet: None) -> None:
    sessions = Sessions(provider="anthropic")
    root = sessions.session("root")
    a = root.fork("researcher")
    b = root.fork("researcher")
    grandchild = a.fork("critic")
    assert (a.session_id, b.session_id, grandchild.session_id) == (
        "root/researcher",
        "root/researcher-2",
        "root/researcher/critic",
    )
    assert (a.parent, grandchild.parent, grandchild.lineage) == ("root", "root/researcher", "root")
    assert sessions.session("root") is root  # get-or-open
    assert len(sessions) == 4
    assert sessions.session().session_id != sessions.session().session_id


def test_totals_per_session_and_per_lineage(quiet: None) -> None:
    sessions = Sessions(provider="anthropic")
    root = sessions.session("r")
    turn(root, body(1))
    child = root.fork("sub")
    turn(child, body(1, "sub"))
    turn(child, body(2, "sub"))
    assert root.totals.requests == 1 and child.totals.requests == 2
    lineage = sessions.lineage_totals("r")
    assert lineage is not None and lineage.requests == 3 and lineage.cache_read_tokens == 3000
    assert lineage.cost_usd == pytest.approx(3 * (10 + 100) * 5 / 1e6)  # claude-opus-4-8: $5/MTok
    child.close()
    tomb = sessions.tombstone("r/sub")
    assert tomb is not None and tomb.totals.requests == 2 and sessions.totals("r/sub") is tomb.totals


def test_restart_is_a_new_generation_and_late_responses_change_nothing(quiet: None) -> None:
    events: list[LifecycleEvent] = []
    sessions = Sessions(provider="anthropic", sinks=[events.append])
    s = sessions.session("agent")
    turn(s, body(1))
    late = s.begin(API, body(2))
    s.restart()
    assert (s.generation, s.turns, s.attempt, s.last_report) == (1, 0, 0, None)
    assert [e.event for e in events[-2:]] == ["close", "open"] and events[-1].reason == "restart"
    assert late.succeed(USAGE) is None  # older generation: stale
    late_fail = s.begin(API, body(1))
    turn(s, body(1))
    late_fail.fail(TimeoutError())  # a newer turn was committed since: stale
    assert (s.turns, s.attempt, s.generation) == (1, 0, 1)
    assert sessions.accepts("agent", 1) and not sessions.accepts("agent", 0)


def test_out_of_order_completion_keeps_the_newest_commit(quiet: None) -> None:
    s = Sessions(provider="anthropic").session()
    turn(s, body(1))
    older = s.begin(API, body(2))
    newer = s.begin(API, body(3))
    newer.succeed(USAGE)
    sent = s.pipeline.sent
    assert older.succeed(USAGE) is None
    assert s.pipeline.sent is sent and s.turns == 2


def test_close_tombstones_and_reopen(quiet: None) -> None:
    events: list[LifecycleEvent] = []
    sessions = Sessions(provider="anthropic", sinks=[events.append], max_tombstones=3)
    with sessions.session("x") as s:
        pending = s.begin(API, body(1))
    assert s.closed and s.close_reason == "closed"
    assert pending.succeed(USAGE) is None and s.turns == 0  # a late response for a closed session
    assert sessions.tombstone("x") is not None and sessions.tombstone("x").generation == 0  # type: ignore[union-attr]
    # A request on the closed id starts its next generation (the same rule as the proxy's): nothing is refused.
    turn(s, body(1))
    assert (s.closed, s.generation, s.turns) == (False, 1, 1) and sessions.session("x") is s
    assert [(e.event, e.reason) for e in events] == [
        ("open", "new"),
        ("close", "closed"),
        ("open", "restart"),
        ("turn", None),
    ]
    s.close()
    again = sessions.session("x")
    assert again is not s and again.generation == 2  # the tombstone continues the generation count
    for i in range(5):
        sessions.session(f"t{i}").close()
    assert sessions.tombstone("t0") is None and sessions.tombstone("t4") is not None  # bounded, oldest dropped
    assert [e.event for e in events].count("close") == 7


def test_idle_timeout_closes_forgotten_sessions_and_they_resume(quiet: None) -> None:
    clock = Clock()
    events: list[LifecycleEvent] = []
    sessions = Sessions(provider="anthropic", idle_timeout=60, clock=clock, sinks=[events.append])
    busy, forgotten = sessions.session("busy"), sessions.session("forgotten")
    turn(forgotten, body(1))
    for _ in range(4):
        clock.t += 20
        turn(busy, body(1))
    assert forgotten.closed and forgotten.close_reason == "idle" and not busy.closed
    assert sessions.tombstone("forgotten") is not None
    clock.t += 1
    turn(forgotten, body(2))  # resumes as a new generation
    assert (forgotten.closed, forgotten.generation, forgotten.turns) == (False, 1, 1)
    assert [(e.event, e.reason) for e in events if e.session_signal.session_id == "forgotten"] == [
        ("open", "new"),
        ("turn", None),
        ("close", "idle"),
        ("open", "resumed"),
        ("turn", None),
    ]


def test_max_open_evicts_the_least_recently_active(quiet: None) -> None:
    sessions = Sessions(provider="anthropic", max_open=2)
    a, b = sessions.session("a"), sessions.session("b")
    turn(a, body(1))
    sessions.session("c")
    assert b.closed and b.close_reason == "evicted" and not a.closed and len(sessions) == 2


def test_events_carry_the_four_fields_and_logs_no_prompt_text(quiet: None) -> None:
    events: list[LifecycleEvent] = []

    def broken(event: LifecycleEvent) -> None:
        raise RuntimeError("sink down")

    sessions = Sessions(provider="anthropic", sinks=[broken, events.append])
    with capture_logs() as logs, sessions.session("s") as s:
        b = body(1, SECRET)
        b["metadata"] = {"user_id": "sk-ant-api03-SECRETKEY"}
        turn(s, b)
        child = s.fork("sub")
        child.begin(API, body(1, SECRET)).fail(ConnectionError())
        child.close()
    assert [e.event for e in events] == ["open", "turn", "fork", "retry", "close", "close"]
    t = events[1]
    assert t.prefix_identity is not None and t.reuse_boundary is not None and t.storage_tier is not None
    assert t.session_signal.session_id == "s" and t.report is not None and t.report.usage == USAGE
    assert events[2].prefix_identity == t.prefix_identity  # the fork starts from the parent's prefix
    assert events[3].reason == "ConnectionError" and events[3].session_signal.attempt == 1
    assert events[3].prefix_identity is not None and events[3].prefix_identity.static == t.prefix_identity.static
    names = [entry["event"] for entry in logs]
    assert names.count("session.sink_failed") == 6  # the broken sink is logged, and skipped
    session_logs = [entry for entry in logs if entry["event"].startswith("session.")]
    assert {"session.open", "session.turn", "session.fork", "session.retry", "session.close"} <= set(names)
    for entry in session_logs:
        if entry["event"] != "session.sink_failed":
            assert {"prefix_identity", "reuse_boundary", "session_signal", "storage_tier"} <= set(entry)
    dumped = json.dumps(logs, default=str)
    assert SECRET not in dumped and "SECRETKEY" not in dumped and policy()[:40] not in dumped


def test_prometheus_sink_counts_events_and_tokens(quiet: None) -> None:
    prometheus_client = pytest.importorskip("prometheus_client")
    registry = prometheus_client.CollectorRegistry()
    sessions = Sessions(provider="anthropic", sinks=[PrometheusSink(registry)])
    with sessions.session() as s:
        reports = [turn(s, body(1)), turn(s, body(2))]
        s.fork("sub").close()

    def value(name: str, **labels: str) -> float:
        v = registry.get_sample_value(name, labels)
        return v if v is not None else -1.0

    assert value("agentcache_session_events_total", event="open") == 1
    assert value("agentcache_session_events_total", event="turn") == 2
    assert value("agentcache_session_events_total", event="fork") == 1
    assert value("agentcache_session_events_total", event="close") == 2
    assert value("agentcache_session_events_total", event="retry") == 0
    tokens = {"provider": "anthropic", "model": "claude-opus-4-8", "source": "turn"}
    assert value("agentcache_prompt_tokens_total", kind="cache_read", **tokens) == 2000
    assert value("agentcache_prompt_tokens_total", kind="uncached", **tokens) == 20
    cost = value("agentcache_cost_usd_total", provider="anthropic", model="claude-opus-4-8", arm="reported")
    assert cost == pytest.approx(sum(r.cost_usd for r in reports)) and cost > 0


# ---- subagents: the must-shows --------------------------------------------------------------------------------


def test_subagent_reads_the_parents_prefix_in_the_anthropic_simulator(quiet: None) -> None:
    sessions = Sessions(provider="anthropic")
    parent = sessions.session("lead")
    agentcache_sim, as_sent_sim = AnthropicSimulator("claude-opus-4-8"), AnthropicSimulator("claude-opus-4-8")
    now = 0.0
    for n in (1, 2, 3):
        t = parent.begin(API, body(n), now=now)
        agentcache_sim.run(t.prepared.planned, now)
        as_sent_sim.run(t.prepared.client, now)
        t.succeed(None)
        now += 10
    child = parent.fork("researcher")
    # The subagent framework hands the subagent the same tools in another order, and its own task.
    sub = body(1, "research the baggage policy", tools=list(reversed(anthropic_tools())))
    t = child.begin(API, sub, now=now)
    shared = t.prepared.planned.tokens_before(static_end(t.prepared.planned))
    result = agentcache_sim.run(t.prepared.planned, now)
    assert result.usage.cache_read_tokens >= shared > 3000  # tools + system read from the parent's entries
    assert "tools.reordered" in t.prepared.repairs  # adopted the scope's first-seen order
    assert as_sent_sim.run(t.prepared.client, now).usage.cache_read_tokens == 0  # as sent: nothing reusable
    report = t.succeed(None)
    assert report is not None and report.session_signal.parent == "lead" and report.session_signal.lineage == "lead"


def test_subagent_carries_the_parents_prompt_cache_key(quiet: None) -> None:
    clock = Clock()
    sessions = Sessions(provider="openai", clock=clock)
    o_body = {
        "model": "gpt-4o",
        "tools": openai_tools(),
        "messages": [{"role": "system", "content": policy()}, {"role": "user", "content": "hi"}],
    }
    parent = sessions.session("lead")
    t = parent.begin("openai.chat", o_body)
    key = t.body["prompt_cache_key"]
    t.succeed(None)
    # 90 other agent sessions of the same family within a minute: the family is sharded over several keys.
    keys = set()
    for i in range(90):
        clock.t += 0.5
        other = sessions.session(f"other-{i}")
        ot = other.begin("openai.chat", o_body)
        keys.add(ot.body["prompt_cache_key"])
        ot.succeed(None)
    assert len(keys) > 1
    child = parent.fork("researcher")
    sub = {**o_body, "messages": [{"role": "system", "content": policy()}, {"role": "user", "content": "subtask"}]}
    ct = child.begin("openai.chat", sub)
    assert ct.body["prompt_cache_key"] == key
    ct.succeed(None)
    grandchild = child.fork("critic")
    assert grandchild.begin("openai.chat", sub).body["prompt_cache_key"] == key
    parent.restart()  # a new incarnation of the lead still routes where its lineage's prefixes live
    assert parent.begin("openai.chat", o_body).body["prompt_cache_key"] == key


def test_sglang_sink_fails_open_when_the_engine_is_down(quiet: None) -> None:
    pytest.importorskip("httpx")
    from agentcache import SGLangSink

    sink = SGLangSink("http://127.0.0.1:9/v1", timeout=0.5)  # nothing listens on port 9
    sessions = Sessions(provider="openai", sinks=[sink])
    s = sessions.session("down")
    t = s.begin(
        "openai.chat", {"model": "m", "messages": [{"role": "user", "content": "hi"}]}, base_url="http://127.0.0.1:9/v1"
    )
    assert t.body["session_id"] == "down"
    t.succeed(None)
    with capture_logs() as logs:
        s.close()
        sink.flush(10)
    assert [e["event"] for e in logs if e["log_level"] == "warning"] == ["sglang.close_session_failed"]
    sink.shutdown()


def test_a_commit_failure_fails_open(quiet: None, monkeypatch: pytest.MonkeyPatch) -> None:
    s = Sessions(provider="anthropic").session()
    t = s.begin(API, body(1))

    def broken(self: Any, prepared: Any) -> None:
        raise RuntimeError("bug")

    monkeypatch.setattr("agentcache.session._pipeline.SessionPipeline.commit", broken)
    with capture_logs() as logs:
        assert t.succeed(USAGE) is None
    assert s.turns == 0 and [e["event"] for e in logs] == ["session.commit_failed"]


def test_reuse_boundary_says_what_the_repair_saved_and_which_counter_counted(quiet: None) -> None:
    """A tools.reordered turn that agentcache repaired: ``tokens_lost`` is what is lost after the repair (only
    what follows the shared prefix of what was sent), ``tokens_lost_unrepaired`` what the client's own order
    would have lost, and each count names its counter (issue 15 item 6)."""
    sessions = Sessions(provider="anthropic")
    session = sessions.session("s")
    first = session.begin(API, body(1)).succeed(USAGE)
    assert first is not None and first.reuse_boundary.cause is None and first.reuse_boundary.tokens_lost == 0
    turn = session.begin(API, body(2, tools=list(reversed(anthropic_tools()))))
    report = turn.succeed(USAGE)
    assert report is not None
    rb = report.reuse_boundary
    before = turn.prepared.before
    assert before is not None
    assert rb.cause == "tools.reordered" and rb.repaired and "tools.reordered" in report.repairs
    assert rb.tokens_lost_unrepaired > 3000  # the tools come first: nearly all of turn one, as the client sent it
    assert rb.tokens_lost == before.tokens - rb.matched_tokens < 20  # repaired: only turn one's tail differs
    assert rb.token_source == "tiktoken-estimate"
    assert rb.reported_tokens == 1000 and rb.reported_source == "provider-tokenizer"
    engine = Sessions(provider="llama.cpp").session("e")
    done = engine.begin("openai.chat", {"model": "m", "messages": [{"role": "user", "content": "hi"}]}).succeed(
        normalize_usage({"usage": {"prompt_tokens": 9, "prompt_tokens_details": {"cached_tokens": 4}}})
    )
    assert done is not None and done.reuse_boundary.reported_source == "engine-tokenizer"
