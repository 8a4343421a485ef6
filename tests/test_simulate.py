"""The provider cache simulators against the published rules, on requests with known token counts."""

from __future__ import annotations

import pytest

from agentcache.model import _causes as C
from agentcache.model._build import Builder
from agentcache.model._canonical import CanonicalRequest
from agentcache.model._rules import anthropic_rules, openai_rules
from agentcache.model._tokens import TokenCounter
from agentcache.simulate import AnthropicSimulator, IdealSimulator, OpenAISimulator, cached_tokens


class FixedCounter(TokenCounter):
    """Every block costs ``n`` tokens, so expected numbers are exact."""

    def __init__(self, n: int = 100):
        super().__init__()
        self.n = n

    def count(self, key: bytes, text: str) -> int:
        return self.n


def req(
    n_blocks: int,
    marks: dict[int, str] | None = None,
    *,
    tokens: int = 100,
    model: str = "claude-opus-4-8",
    top: bool = False,
    key: str | None = None,
    empty: set[int] | None = None,
) -> CanonicalRequest:
    """A request of ``n_blocks`` message blocks (block i has text 'b{i}'); ``marks`` maps a block
    index to a TTL."""
    b = Builder("anthropic.messages", model, FixedCounter(tokens))
    for i in range(n_blocks):
        unit: dict[str, object] = {"type": "text", "text": "" if empty and i in empty else f"b{i}"}
        if marks and i in marks:
            unit["cache_control"] = {"type": "ephemeral", "ttl": marks[i]}
        b.add(f"messages[{i}].content[0]", "message", unit, env=b'{"role":"user"}', message=i)
    from agentcache.model._canonical import Marker

    return b.build(top_marker=Marker() if top else None, cache_key=key)


def test_write_then_read_with_prices() -> None:
    sim = AnthropicSimulator()
    r1 = sim.run(req(20, {19: "5m"}), 0.0)
    assert (r1.usage.cache_read_tokens, r1.usage.cache_write_tokens, r1.usage.uncached_tokens) == (0, 2000, 0)
    assert r1.usage.cost_usd == pytest.approx(2000 * 5.0 / 1e6 * 1.25)
    r2 = sim.run(req(22, {21: "5m"}), 10.0)
    assert (r2.usage.cache_read_tokens, r2.usage.cache_write_tokens) == (2000, 200)
    assert r2.usage.cost_usd == pytest.approx((2000 * 0.1 + 200 * 1.25) * 5.0 / 1e6)


def test_lookback_window_is_twenty_blocks() -> None:
    for gap, hit in ((20, True), (21, False)):
        sim = AnthropicSimulator()
        sim.run(req(15, {14: "5m"}), 0.0)
        r = sim.run(req(15 + gap, {14 + gap: "5m"}), 1.0)
        assert (r.usage.cache_read_tokens == 1500) is hit
        if not hit:
            assert r.loss_cause == C.LOOKBACK_EXCEEDED


def test_minimum_cacheable_length() -> None:
    sim = AnthropicSimulator()
    r1 = sim.run(req(10, {9: "5m"}), 0.0)  # 1000 tokens < 1024
    assert r1.usage.cache_write_tokens == 0 and r1.usage.uncached_tokens == 1000
    r2 = sim.run(req(12, {11: "5m"}), 1.0)
    assert r2.usage.cache_read_tokens == 0 and r2.loss_cause == C.BELOW_MINIMUM
    opus = AnthropicSimulator()
    opus.run(req(30, {29: "5m"}, model="claude-opus-4-5"), 0.0)  # 3000 < 4096
    assert opus.run(req(32, {31: "5m"}, model="claude-opus-4-5"), 1.0).usage.cache_read_tokens == 0


def test_ttl_refreshed_on_hit_and_expiry() -> None:
    sim = AnthropicSimulator()
    sim.run(req(20, {19: "5m"}), 0.0)
    assert sim.run(req(20, {19: "5m"}), 250.0).usage.cache_read_tokens == 2000
    assert sim.run(req(20, {19: "5m"}), 500.0).usage.cache_read_tokens == 2000  # refreshed at 250
    late = sim.run(req(20, {19: "5m"}), 900.0)
    assert late.usage.cache_read_tokens == 0 and late.loss_cause == C.TTL_EXPIRED


def test_one_hour_ttl_price_and_life() -> None:
    sim = AnthropicSimulator()
    r = sim.run(req(20, {19: "1h"}), 0.0)
    assert r.usage.cache_write_1h_tokens == 2000
    assert r.usage.cost_usd == pytest.approx(2000 * 2.0 * 5.0 / 1e6)
    assert sim.run(req(20, {19: "1h"}), 3000.0).usage.cache_read_tokens == 2000


def test_rejections() -> None:
    rules = anthropic_rules("claude-opus-4-8")
    sim = AnthropicSimulator()
    five = sim.run(req(20, {3: "5m", 6: "5m", 9: "5m", 12: "5m", 19: "5m"}), 0.0)
    assert five.rejected and five.loss_cause == C.MARKERS_INVALID
    four_plus_top = sim.run(req(20, {3: "5m", 6: "5m", 9: "5m", 12: "5m"}, top=True), 0.0)
    assert four_plus_top.rejected
    assert sim.run(req(20, {19: "5m"}, empty={19}), 0.0).rejected
    assert sim.run(req(20, {10: "5m", 19: "1h"}), 0.0).rejected
    assert not sim.run(req(20, {10: "1h", 19: "5m"}), 0.0).rejected
    assert rules.max_breakpoints == 4


def test_top_level_marker_caches_last_block() -> None:
    sim = AnthropicSimulator()
    sim.run(req(20, top=True), 0.0)
    assert sim.run(req(23, top=True), 1.0).usage.cache_read_tokens == 2000


def test_sessions_share_one_scope() -> None:
    sim = AnthropicSimulator()
    sim.run(req(20, {19: "5m"}), 0.0)
    # Another session, same prefix, later: it reads what the first wrote.
    assert sim.run(req(25, {19: "5m", 24: "5m"}), 5.0).usage.cache_read_tokens == 2000


def test_no_markers_is_markers_missing() -> None:
    sim = AnthropicSimulator()
    sim.run(req(20), 0.0)
    r = sim.run(req(22), 1.0)
    assert r.matched_tokens == 2000 and r.usage.cache_read_tokens == 0
    assert r.loss_cause == C.MARKERS_MISSING


def test_openai_increments_minimum_and_partitions() -> None:
    rules = openai_rules("gpt-4o")
    assert cached_tokens(1023, rules) == 0
    assert cached_tokens(1024, rules) == 1024
    assert cached_tokens(1500, rules) == 1408
    sim = OpenAISimulator()
    sim.run(req(15, model="gpt-4o", tokens=100), 0.0)
    r = sim.run(req(16, model="gpt-4o", tokens=100), 1.0)
    assert r.usage.cache_read_tokens == 1408  # 1500 matched → 1024 + 3 * 128
    assert r.usage.cost_usd == pytest.approx((1408 * 1.25 + 192 * 2.5) / 1e6)
    keyed = sim.run(req(17, model="gpt-4o", key="other"), 2.0)
    assert keyed.usage.cache_read_tokens == 0 and keyed.loss_cause == C.CACHE_KEY_CHANGED


def test_ideal_reuses_everything_sent_and_writes_only_what_is_read() -> None:
    ideal = IdealSimulator("anthropic")
    assert ideal.run(req(10)) == 0
    assert ideal.run(req(12)) == 1000
    assert ideal.run(req(5)) == 500
    first, second, third = ideal.finish()
    assert first.cache_write_tokens == 1000 and first.uncached_tokens == 0
    assert second.cache_write_tokens == 0 and second.uncached_tokens == 200
    assert third.cache_read_tokens == 500


@pytest.mark.parametrize(
    ("model", "key", "known"),
    [
        ("claude-opus-4-20250514", "claude-opus-4", True),  # a dated snapshot listed as an alias
        ("claude-opus-4-1-20250805", "claude-opus-4-1", True),
        ("anthropic/claude-opus-4.8", "claude-opus-4-8", True),  # provider prefix and dotted version
        ("claude-opus-4-8-20261001", "claude-opus-4-8", False),  # a snapshot nobody listed: unknown, default price
        ("claude-3-5-sonnet-20241022-v2:0", "claude-opus-4-8", False),  # a Bedrock id is not an alias
        ("claude-opus-4-9", "claude-opus-4-8", False),  # a newer minor version: unknown, not Opus 4's price
        ("claude-opus-4", "claude-opus-4", True),
    ],
)
def test_model_ids_match_exact_names_and_aliases(model: str, key: str, known: bool) -> None:
    rules = anthropic_rules(model)
    assert (rules.model, rules.known) == (key, known)
    assert rules.input_usd_per_mtok == anthropic_rules(key).input_usd_per_mtok


def test_openai_model_ids_match_exact_names_and_aliases() -> None:
    assert (openai_rules("gpt-4o-2024-08-06").model, openai_rules("gpt-4o-2024-08-06").known) == ("gpt-4o", True)
    assert openai_rules("gpt-4o-mini").model == "gpt-4o-mini"
    assert (openai_rules("gpt-4.1").model, openai_rules("gpt-4-1").model) == ("gpt-4.1", "gpt-4.1")
    assert openai_rules("gpt-5.1").known is False  # gpt-5.1 is not gpt-5
    assert openai_rules("gpt-5.1").model == "gpt-5.4"  # priced as the documented default
