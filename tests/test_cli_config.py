"""Custom model prices for every command that prices (issue 22): ``audit`` and ``replay`` take the proxy's
``--config FILE`` (and ``AGENTCACHE_CONFIG``), whose ``[models.<provider>."<id>"]`` rows price models the built-in
table lacks; the unknown-model error says how to write one."""

from __future__ import annotations

import json
from collections.abc import Iterator
from pathlib import Path

import httpx
import pytest

from agentcache import replay as replay_pkg
from agentcache._config import reset_settings
from agentcache.model._rules import anthropic_rules, unknown_model
from tests.test_cli import K01, error_lines, invoke
from tests.test_replay import FakeEngine

PRICE = 7.0  # USD per million input tokens of the made-up model


@pytest.fixture(autouse=True)
def _reset() -> Iterator[None]:
    reset_settings()
    yield
    reset_settings()


@pytest.fixture
def config(tmp_path: Path) -> Path:
    path = tmp_path / "agentcache.toml"
    path.write_text(f'[models.anthropic."my-model"]\ninput_usd_per_mtok = {PRICE}\n')
    return path


@pytest.mark.parametrize("how", ["option", "env"])
def test_audit_prices_a_model_from_the_config_file(config: Path, how: str) -> None:
    args = ["audit", K01, "--provider", "anthropic", "--model", "my-model", "--json"]
    result = (
        invoke(*args, "--config", config) if how == "option" else invoke(*args, env={"AGENTCACHE_CONFIG": str(config)})
    )
    assert result.exit_code == 0, result.stderr
    doc = json.loads(result.stdout)
    assert doc["models"] == [
        {"provider": "anthropic", "model": "my-model", "known": True, "priced_as": "my-model", "requests": 3}
    ]
    sent = doc["totals"]["as_sent"]  # every token written once at 1.25x the base price
    assert sent["cache_read_tokens"] == 0 and sent["uncached_tokens"] == 0
    assert sent["cost_usd"] == pytest.approx(sent["cache_write_tokens"] * PRICE * 1.25 / 1e6, abs=1e-6)


def test_a_bad_config_file_is_one_error_line(tmp_path: Path) -> None:
    bad = tmp_path / "bad.toml"
    bad.write_text('[models.anthropic."my-model"]\naliases = ["x"]\n')  # a new model without its price
    for command in (["audit", K01], ["replay", K01, "--endpoint", "http://fake"]):
        result = invoke(*command, "--config", bad)
        assert result.exit_code == 2
        lines = error_lines(result)
        assert len(lines) == 1 and "models.anthropic.my-model: a new model needs input_usd_per_mtok" in lines[0]


def test_replay_installs_the_config_file(monkeypatch: pytest.MonkeyPatch, config: Path) -> None:
    engine = FakeEngine("llama.cpp")
    real = replay_pkg.replay
    monkeypatch.setattr(
        replay_pkg, "replay", lambda r, c, **kw: real(r, c, transport=httpx.MockTransport(engine), **kw)
    )
    assert not anthropic_rules("my-model").known
    result = invoke("replay", K01, "--endpoint", "http://fake", "--via", "agentcache", "--json", "--config", config)
    assert result.exit_code == 0 and json.loads(result.stdout)["completed"] == 3
    rules = anthropic_rules("my-model")
    assert rules.known and rules.input_usd_per_mtok == PRICE


def test_the_unknown_model_error_shows_the_config_table() -> None:
    message = str(unknown_model("openai", "gpt-next"))
    assert message.startswith("unknown openai model 'gpt-next': give its prices in a config file (--config FILE")
    assert '[models.openai."gpt-next"] with input_usd_per_mtok and cache_read_usd_per_mtok' in message
    assert "models.toml" not in message  # not the installed package's own table
