"""Cache rules as components with a veto: for each component, a request where it alone refuses reuse and is named
as the miss cause, with exact token counts (every block costs 100 tokens: ``tests/test_simulate.req``)."""

from __future__ import annotations

from agentcache.model import _causes as C
from agentcache.model._build import Builder
from agentcache.model._canonical import CanonicalRequest
from agentcache.model._rules import anthropic_rules, openai_rules
from agentcache.simulate import AnthropicSimulator, Concurrency, OpenAISimulator
from agentcache.simulate._components import (
    ANTHROPIC,
    AnthropicProbe,
    Breakpoints,
    Entry,
    EntryAlive,
    EntryReadable,
    Lookback,
    MarkerRules,
    MinimumLength,
    deepest,
)
from agentcache.simulate._components_openai import (
    OPENAI,
    OPENAI_BREAKPOINTS,
    ExpiryTTL,
    Granularity,
    LastUseTTL,
    OpenAIBreakpoints,
    RoutingKey,
)
from tests.test_simulate import FixedCounter, req


def path(i: int) -> str:
    """The path of block ``i`` of a ``req`` request (one block per message)."""
    return f"messages[{i}].content[0]"


def test_the_documented_orders() -> None:
    anthropic = [MarkerRules, MinimumLength, EntryAlive, EntryReadable, Lookback, Breakpoints]
    assert [type(c) for c in ANTHROPIC] == anthropic
    assert [type(c) for c in OPENAI] == [MinimumLength, RoutingKey, LastUseTTL, Granularity]
    assert [type(c) for c in OPENAI_BREAKPOINTS] == [MinimumLength, RoutingKey, ExpiryTTL, OpenAIBreakpoints]
    assert [c.cause for c in ANTHROPIC] == [
        C.MARKERS_INVALID,
        C.BELOW_MINIMUM,
        C.TTL_EXPIRED,
        C.WRITE_IN_FLIGHT,
        C.LOOKBACK_EXCEEDED,
        C.MARKERS_MISSING,
    ]
    assert Granularity.cause is None  # OpenAI's rounding loss has no cause name


def test_deepest_is_the_first_block_every_check_accepts() -> None:
    assert deepest(range(9, -1, -1), [lambda i: i % 3 == 0, lambda i: i < 8]) == 6
    assert deepest(range(9, -1, -1), [lambda i: i > 20]) == -1
    assert deepest(range(3, -1, -1), []) == 3


# ---- Anthropic ----------------------------------------------------------------------------------------------------


def test_marker_rules_reject_invalid_markers() -> None:
    sim = AnthropicSimulator()
    sim.run(req(20, {19: "5m"}), 0.0)
    five = sim.run(req(20, {3: "5m", 6: "5m", 9: "5m", 12: "5m", 19: "5m"}), 1.0)
    assert five.rejected and (five.loss_cause, five.loss_where) == (C.MARKERS_INVALID, None)
    assert (five.matched_tokens, five.usage.cache_read_tokens, five.usage.uncached_tokens) == (2000, 0, 2000)
    rules = anthropic_rules("claude-opus-4-8")
    assert MarkerRules.rejects(req(20, {3: "5m", 6: "5m", 9: "5m", 12: "5m", 19: "5m"}), rules)
    assert not MarkerRules.rejects(req(20, {3: "5m", 6: "5m", 9: "5m", 19: "5m"}), rules)


def _trailing_request(n_msgs: int, trailing: bool, mark_last: bool = True) -> CanonicalRequest:
    """``n_msgs`` one-block messages; with ``trailing``, the last message also has a second block (a per-turn
    status block) carrying the marker, else the marker sits on the last block."""
    b = Builder("anthropic.messages", "claude-opus-4-8", FixedCounter(100))
    for k in range(n_msgs):
        texts = [f"b{k}", f"status{k}"] if trailing and k == n_msgs - 1 else [f"b{k}"]
        for j, text in enumerate(texts):
            unit: dict[str, object] = {"type": "text", "text": text}
            if mark_last and k == n_msgs - 1 and j == len(texts) - 1:
                unit["cache_control"] = {"type": "ephemeral"}
            b.add(f"messages[{k}].content[{j}]", "message", unit, env=b'{"role":"user"}', message=k)
    return b.build()


def test_marker_rules_name_a_marker_on_a_dropped_trailing_block() -> None:
    sim = AnthropicSimulator()
    first = sim.run(_trailing_request(12, trailing=True), 0.0)  # marker on messages[11].content[1]: 1300 tokens
    assert first.usage.cache_write_tokens == 1300
    # The next turn drops the status block and appends a message: the entry ends past what it still sends.
    r = sim.run(_trailing_request(13, trailing=False), 1.0)
    assert (r.matched_tokens, r.usage.cache_read_tokens, r.usage.cache_write_tokens) == (1200, 0, 1300)
    assert (r.loss_cause, r.loss_where) == (C.MARKERS_INVALID, "messages[11].content[0]")
    # The same turn after a client that marked its message's own block: nobody marked the matched end.
    plain = AnthropicSimulator()
    plain.run(_trailing_request(12, trailing=False), 0.0)
    fresh = plain.run(_trailing_request(14, trailing=False, mark_last=False), 1.0)
    assert fresh.usage.cache_read_tokens == 0 and (fresh.loss_cause, fresh.loss_where) == (C.MARKERS_MISSING, None)


def test_minimum_length_refuses_a_short_prefix() -> None:
    sim = AnthropicSimulator()
    first = sim.run(req(10, {9: "5m"}), 0.0)  # 1000 tokens < 1024: nothing written
    assert (first.usage.cache_write_tokens, first.usage.uncached_tokens) == (0, 1000)
    r = sim.run(req(12, {11: "5m"}), 1.0)
    assert (r.matched_tokens, r.usage.cache_read_tokens, r.usage.cache_write_tokens) == (1000, 0, 1200)
    assert (r.loss_cause, r.loss_where) == (C.BELOW_MINIMUM, None)
    long = req(12)
    probe = AnthropicProbe(long, anthropic_rules(long.model), {}, {}, 0.0, -1.0, [])
    accepts = MinimumLength.reaches(probe)
    assert [accepts(i) for i in (9, 10, 11)] == [False, True, True]  # 1000, 1100, 1200 tokens


def test_entry_alive_refuses_an_expired_entry() -> None:
    sim = AnthropicSimulator()
    sim.run(req(20, {19: "5m"}), 0.0)
    r = sim.run(req(21, {20: "5m"}), 301.0)  # 5m = 300 s
    assert (r.matched_tokens, r.usage.cache_read_tokens, r.usage.cache_write_tokens) == (2000, 0, 2100)
    assert (r.loss_cause, r.loss_where) == (C.TTL_EXPIRED, path(19))


def test_entry_readable_refuses_an_entry_still_being_written() -> None:
    sim = AnthropicSimulator(concurrency=Concurrency(ttft=1.0))
    sim.run(req(20, {19: "5m"}), 0.0)
    r = sim.run(req(21, {20: "5m"}), 0.5)  # its writer answers at 1.0
    assert (r.matched_tokens, r.usage.cache_read_tokens, r.usage.cache_write_tokens) == (2000, 0, 2100)
    assert (r.loss_cause, r.loss_where) == (C.WRITE_IN_FLIGHT, path(19))
    entries = {req(20).chain[19]: Entry(300.0, 300.0, readable=1.0)}
    probe = AnthropicProbe(req(20), anthropic_rules("claude-opus-4-8"), entries, {}, 0.5, 3.0, [])
    assert EntryReadable().validator(probe)(19)  # within a coalescer's hold: accepted (the request waits)


def test_lookback_refuses_an_entry_out_of_reach() -> None:
    sim = AnthropicSimulator()
    sim.run(req(15, {14: "5m"}), 0.0)
    r = sim.run(req(36, {35: "5m"}), 1.0)  # 21 content blocks past the entry: one more than the window
    assert (r.matched_tokens, r.usage.cache_read_tokens, r.usage.cache_write_tokens) == (1500, 0, 3600)
    assert (r.loss_cause, r.loss_where) == (C.LOOKBACK_EXCEEDED, path(35))
    # Nothing stored at all, and the matched end lies more than the window past the start.
    sim = AnthropicSimulator()
    sim.run(req(30), 0.0)
    end = sim.run(req(31, {30: "5m"}), 1.0)
    assert (end.matched_tokens, end.usage.cache_read_tokens) == (3000, 0)
    assert (end.loss_cause, end.loss_where) == (C.LOOKBACK_EXCEEDED, path(29))


def test_breakpoints_refuse_an_unmarked_prefix() -> None:
    sim = AnthropicSimulator()
    sim.run(req(20), 0.0)
    r = sim.run(req(22), 1.0)  # no breakpoint at all
    assert (r.matched_tokens, r.usage.cache_read_tokens, r.usage.uncached_tokens) == (2000, 0, 2200)
    assert (r.loss_cause, r.loss_where) == (C.MARKERS_MISSING, None)
    # An entry alive and readable, but no breakpoint of this request at or past it.
    sim = AnthropicSimulator()
    sim.run(req(15, {14: "5m"}), 0.0)
    live = sim.run(req(20, {5: "5m"}), 1.0)
    assert (live.matched_tokens, live.usage.cache_read_tokens) == (1500, 0)
    assert (live.loss_cause, live.loss_where) == (C.MARKERS_MISSING, path(14))
    # Nothing stored within reach of the matched end: nobody marked it.
    sim = AnthropicSimulator()
    sim.run(req(15), 0.0)
    end = sim.run(req(16, {15: "5m"}), 1.0)
    assert (end.matched_tokens, end.usage.cache_read_tokens, end.usage.cache_write_tokens) == (1500, 0, 1600)
    assert (end.loss_cause, end.loss_where) == (C.MARKERS_MISSING, path(14))


# ---- OpenAI -------------------------------------------------------------------------------------------------------


def test_openai_minimum_caps_a_short_prefix_to_nothing() -> None:
    sim = OpenAISimulator()
    sim.run(req(8, model="gpt-4o"), 0.0)
    r = sim.run(req(9, model="gpt-4o"), 1.0)
    assert (r.matched_tokens, r.usage.cache_read_tokens, r.usage.uncached_tokens) == (800, 0, 900)
    assert (r.loss_cause, r.loss_where) == (C.BELOW_MINIMUM, None)


def test_routing_key_refuses_another_partition() -> None:
    sim = OpenAISimulator()
    sim.run(req(15, model="gpt-4o", key="a"), 0.0)
    r = sim.run(req(16, model="gpt-4o", key="b"), 1.0)
    assert (r.matched_tokens, r.usage.cache_read_tokens) == (1500, 0)
    assert (r.loss_cause, r.loss_where) == (C.CACHE_KEY_CHANGED, "prompt_cache_key")


def test_last_use_ttl_refuses_an_idle_prefix() -> None:
    ttl = openai_rules("gpt-4o").in_memory_ttl_seconds
    sim = OpenAISimulator()
    sim.run(req(15, model="gpt-4o"), 0.0)
    r = sim.run(req(16, model="gpt-4o"), ttl + 1.0)
    assert (r.matched_tokens, r.usage.cache_read_tokens) == (1500, 0)
    assert (r.loss_cause, r.loss_where) == (C.TTL_EXPIRED, path(0))


def test_granularity_rounds_to_steps_without_a_cause_name() -> None:
    sim = OpenAISimulator()
    sim.run(req(15, model="gpt-4o"), 0.0)
    r = sim.run(req(16, model="gpt-4o"), 1.0)
    assert (r.matched_tokens, r.usage.cache_read_tokens) == (1500, 1408)  # 1024 + 3 * 128
    assert (r.loss_cause, r.loss_where) == (None, None)


def test_openai_breakpoint_ttl_refuses_an_expired_entry() -> None:
    ttl = openai_rules("gpt-5.6").breakpoint_ttl_seconds
    sim = OpenAISimulator()
    sim.run(req(15, model="gpt-5.6"), 0.0)  # the implicit breakpoint: the end of the newest message
    assert sim.run(req(16, model="gpt-5.6"), 1.0).usage.cache_read_tokens == 1500  # unrounded
    r = sim.run(req(17, model="gpt-5.6"), 1.0 + ttl + 1.0)
    assert (r.matched_tokens, r.usage.cache_read_tokens) == (1600, 0)
    assert (r.loss_cause, r.loss_where) == (C.TTL_EXPIRED, None)


def test_openai_breakpoints_refuse_a_prefix_nobody_marked() -> None:
    sim = OpenAISimulator()
    sim.run(req(15, model="gpt-5.6"), 0.0)  # an entry at block 14 only
    other = Builder("anthropic.messages", "gpt-5.6", FixedCounter(100))
    for i in range(14):  # the first 12 blocks as before, then two others
        text = f"b{i}" if i < 12 else f"other{i}"
        other.add(path(i), "message", {"type": "text", "text": text}, env=b'{"role":"user"}', message=i)
    r = sim.run(other.build(), 1.0)
    assert (r.matched_tokens, r.usage.cache_read_tokens) == (1200, 0)
    assert (r.loss_cause, r.loss_where) == (C.MARKERS_MISSING, None)
