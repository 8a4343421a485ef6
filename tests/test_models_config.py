"""Users add or override price-table rows in the config file (``[models.<provider>."<id>"]``)."""

from __future__ import annotations

from collections.abc import Iterator
from pathlib import Path

import pytest

from agentcache import ConfigError, UsageTotals
from agentcache._config import configure, load_settings, reset_settings
from agentcache.model._rules import anthropic_rules, openai_rules
from agentcache.model._usage import CacheUsage
from agentcache.session._metrics import model_label
from agentcache.targets import cost_usd


@pytest.fixture(autouse=True)
def _reset() -> Iterator[None]:
    reset_settings()
    yield
    reset_settings()


def test_config_file_adds_and_overrides_models(tmp_path: Path) -> None:
    path = tmp_path / "agentcache.toml"
    path.write_text(
        """
markers = "merge"

[models.anthropic."claude-next-1"]
input_usd_per_mtok = 7.0
cache_read_usd_per_mtok = 0.35
min_cacheable_tokens = 2048
aliases = ["claude-next-1-20270101"]
source = "our contract, 2026-12-01"

[models.openai."gpt-4o"]
cache_read_usd_per_mtok = 0.5
"""
    )
    assert not anthropic_rules("claude-next-1-20270101").known  # before: unknown, the default's numbers
    configure(path)
    rules = anthropic_rules("claude-next-1-20270101")
    assert (rules.model, rules.known, rules.input_usd_per_mtok, rules.min_cacheable_tokens) == (
        "claude-next-1",
        True,
        7.0,
        2048,
    )
    assert rules.read_multiplier == pytest.approx(0.05) and rules.write_5m_multiplier == 1.25
    usage = CacheUsage(
        prompt_tokens=1000, cache_read_tokens=800, cache_write_tokens=0, uncached_tokens=200, source="anthropic"
    )
    assert cost_usd(usage, "anthropic", "claude-next-1") == pytest.approx((200 * 7.0 + 800 * 0.35) / 1e6)
    assert model_label("anthropic", "claude-next-1-20270101") == "claude-next-1"  # the metrics label
    gpt = openai_rules("gpt-4o")
    assert (gpt.input_usd_per_mtok, gpt.cached_usd_per_mtok) == (2.5, 0.5)  # one field overridden, the rest kept
    reset_settings()
    assert not anthropic_rules("claude-next-1").known and openai_rules("gpt-4o").cached_usd_per_mtok == 1.25
    assert UsageTotals().unpriced == 0


def test_agentcache_table_form_and_bad_rows(tmp_path: Path) -> None:
    path = tmp_path / "c.toml"
    path.write_text('[agentcache.models.openai."my-gpt"]\ninput_usd_per_mtok = 1.0\ncache_read_usd_per_mtok = 0.1\n')
    assert openai_rules("my-gpt").known is False
    configure(path)
    assert openai_rules("MY-GPT").known is True
    bad = tmp_path / "bad.toml"
    bad.write_text('[models.openai."new-model"]\ninput_usd_per_mtok = 1.0\n')
    with pytest.raises(ConfigError, match=r"models\.openai\.new-model: a new model needs cache_read_usd_per_mtok"):
        load_settings(bad)
    bad.write_text('[models.anthropic."claude-x"]\ninput_usd_per_mtok = "cheap"\n')
    with pytest.raises(ConfigError, match=r"input_usd_per_mtok: expected a number"):
        load_settings(bad)
    bad.write_text('[models.mistral."m"]\ninput_usd_per_mtok = 1.0\n')
    with pytest.raises(ConfigError, match=r"models\.mistral: unknown provider"):
        load_settings(bad)
    bad.write_text('[models.anthropic."claude-opus-4-8"]\nprice = 1.0\n')
    with pytest.raises(ConfigError, match=r"unknown field\(s\) price"):
        load_settings(bad)


def test_codex_default_model_is_priced_from_its_page_with_writes_and_long_context() -> None:
    """gpt-6.2-sol (Codex 0.171's default): $2 input, $0.10 cached, $2.50 writes; over 272K prompt tokens every
    input-side rate doubles for the whole request (developers.openai.com/api/docs/models/gpt-6.2-sol)."""
    rules = openai_rules("gpt-6.2-sol")
    assert rules.known and rules.model == "gpt-6.2-sol"
    short = CacheUsage(160_000, 50_000, 10_000, 100_000, "openai.responses")
    assert cost_usd(short, "openai", "gpt-6.2-sol") == pytest.approx((100_000 * 2 + 50_000 * 0.1 + 10_000 * 2.5) / 1e6)
    long = CacheUsage(300_000, 100_000, 0, 200_000, "openai.responses")
    assert cost_usd(long, "openai", "gpt-6.2-sol") == pytest.approx(2 * (200_000 * 2 + 100_000 * 0.1) / 1e6)
    edge = CacheUsage(272_000, 0, 0, 272_000, "openai.responses")  # exactly 272K: the short-context rate
    assert cost_usd(edge, "openai", "gpt-6.2-sol") == pytest.approx(272_000 * 2 / 1e6)
    # a model without a write price or threshold: writes at the input price, no doubling (as before)
    assert cost_usd(long, "openai", "gpt-5.4") == pytest.approx((200_000 * 2.5 + 100_000 * 0.25) / 1e6)
    wrote = CacheUsage(20_000, 0, 10_000, 10_000, "openai.responses")
    assert cost_usd(wrote, "openai", "gpt-5.4") == pytest.approx(20_000 * 2.5 / 1e6)
