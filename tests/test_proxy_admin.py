"""Observability and configuration: ``/metrics``, ``/agentcache/v1/report`` (audit schema), admin tokens,
``ProxyConfig`` loading, and the ``agentcache proxy`` command line."""

from __future__ import annotations

import asyncio
import json
from pathlib import Path
from typing import Any

import httpx
import pytest
from prometheus_client import CollectorRegistry
from typer.testing import CliRunner

from agentcache import PrometheusSink, Sessions, _cli, normalize_usage
from agentcache._config import reset_settings
from agentcache._exceptions import ConfigError
from agentcache._log_output import reset_logging
from agentcache.proxy import ProxyConfig, load_proxy_config
from agentcache.proxy._caller import tenant_of
from tests.test_proxy_support import (
    ANTHROPIC_KEY,
    OTHER_KEY,
    FakeUpstream,
    Seen,
    anthropic_body,
    chat_body,
    conversation,
    proxy,
    settings,
)

A = {"x-api-key": ANTHROPIC_KEY}
ADMIN = {"x-agentcache-admin-token": "s3cret"}
SCHEMA_KEYS = {"provider", "model", "totals", "sessions", "breaks", "misses", "models", "provider_diagnostics"}
METRICS_KEYS = {
    "requests",
    "prompt_tokens",
    "cache_read_tokens",
    "cache_write_tokens",
    "uncached_tokens",
    "hit_rate",
    "cost_usd",
}


def run(coro: Any) -> Any:
    return asyncio.run(coro)


def test_metrics_and_report() -> None:
    async def scenario() -> None:
        async with proxy(admin_token="s3cret") as (client, state, _):
            for n in (1, 3, 5):
                await client.post("/v1/messages", json=anthropic_body(conversation(n)), headers=A)
            await client.post("/v1/messages", json=anthropic_body(conversation(1)), headers={"x-api-key": OTHER_KEY})
            text = (await client.get("/metrics", headers=ADMIN)).text
            assert (
                'agentcache_proxy_requests_total{model="claude-opus-4-8",provider="anthropic",'
                'route="/v1/messages",status="200"} 4.0' in text
            )
            for kind in ("cache_read", "cache_write", "uncached"):
                assert (
                    f'agentcache_prompt_tokens_total{{kind="{kind}",model="claude-opus-4-8",provider="anthropic",'
                    'source="turn"}' in text
                )
            assert "agentcache_proxy_tokens_total" not in text  # one definition: no proxy twin of the turn metrics
            assert "agentcache_proxy_upstream_latency_seconds_bucket" in text
            assert "agentcache_proxy_upstream_ttfb_seconds_bucket" in text
            for arm in ("as_sent", "agentcache", "reported"):
                assert f'agentcache_cost_usd_total{{arm="{arm}",model="claude-opus-4-8",provider="anthropic"}}' in text
            assert "agentcache_saved_usd" in text
            assert 'agentcache_session_events_total{event="turn"} 4.0' in text
            assert "agentcache_proxy_live_sessions 2.0" in text
            doc = (await client.get("/agentcache/v1/report", headers=ADMIN)).json()  # all tenants
            assert set(doc) == SCHEMA_KEYS
            assert doc["provider"] == "anthropic" and doc["model"] == "claude-opus-4-8"
            assert set(doc["totals"]) == {"as_sent", "agentcache", "reported"}
            assert all(set(m) == METRICS_KEYS for m in doc["totals"].values())
            assert doc["totals"]["reported"]["requests"] == 4
            # tau-bench sends no markers: as sent, nothing is cached; agentcache's markers make it cache
            assert doc["totals"]["as_sent"]["cache_read_tokens"] == 0
            assert doc["totals"]["agentcache"]["cache_read_tokens"] > 0
            assert doc["totals"]["agentcache"]["cost_usd"] < doc["totals"]["as_sent"]["cost_usd"]
            assert {m["cause"] for m in doc["misses"] if m["arm"] == "as_sent"} == {"markers.missing"}
            tenant = tenant_of(A, state.config.tenant_salt)
            mine = (await client.get("/agentcache/v1/report", params={"tenant": tenant}, headers=ADMIN)).json()
            assert [s["session"].split("/")[0] for s in mine["sessions"]] == [tenant]
            assert mine["totals"]["reported"]["requests"] == 3
            # the caller's own view, by its API key alone, is the same document
            assert (await client.get("/agentcache/v1/report", headers=A)).json() == mine

    run(scenario())


Samples = dict[tuple[str, tuple[tuple[str, str], ...]], float]
TURN_FAMILIES = {
    "agentcache_session_events",
    "agentcache_prompt_tokens",
    "agentcache_cost_usd",
    "agentcache_breaks",
    "agentcache_misses",
    "agentcache_saved_usd",
    "agentcache_usage_unreported",
    "agentcache_provider_miss_reasons",
    "agentcache_coalesce_held_requests",  # the coalescer's (issue 14), fed through the same sink in every door
    "agentcache_coalesce_hold_seconds",
    "agentcache_coalesce_saved_write_tokens",
}


def turn_level(registry: CollectorRegistry) -> tuple[set[str], Samples]:
    """The families of ``registry`` that are not the proxy's own HTTP-level ones, and their samples."""
    names: set[str] = set()
    samples: Samples = {}
    for family in registry.collect():
        if family.name.startswith("agentcache_proxy_"):
            continue
        names.add(family.name)
        for s in family.samples:
            if not s.name.endswith("_created"):
                samples[(s.name, tuple(sorted(s.labels.items())))] = s.value
    return names, samples


def fed_by_events(samples: Samples) -> Samples:
    """Events, tokens and the reported cost: what lifecycle events feed (the ledger feeds the rest)."""
    keep = ("agentcache_session_events_total", "agentcache_prompt_tokens_total")
    return {
        k: v
        for k, v in samples.items()
        if k[0] in keep or (k[0] == "agentcache_cost_usd_total" and ("arm", "reported") in k[1])
    }


@pytest.mark.parametrize(
    ("route", "api", "bodies", "headers"),
    [
        ("/v1/messages", "anthropic.messages", [anthropic_body(conversation(n)) for n in (1, 3)], A),
        (
            "/v1/chat/completions",
            "openai.chat",
            [
                chat_body([{"role": "user", "content": "I want to change my flight."}]),
                chat_body(
                    [
                        {"role": "user", "content": "I want to change my flight."},
                        {"role": "assistant", "content": "Sure."},
                        {"role": "user", "content": "Flight HAT001."},
                    ]
                ),
            ],
            {"authorization": "Bearer sk-o"},
        ),
    ],
)
def test_library_sink_and_proxy_export_the_same_turn_metrics(
    route: str, api: str, bodies: list[dict[str, Any]], headers: dict[str, str]
) -> None:
    """One definition: the same turns through the proxy and through ``Sessions(sinks=[PrometheusSink()])`` give
    the same turn-level families, label sets and values; the proxy adds only its ``agentcache_proxy_*`` ones."""

    async def through_proxy() -> CollectorRegistry:
        async with proxy() as (client, state, _):
            for body in bodies:
                assert (await client.post(route, json=body, headers=headers)).status_code == 200
            return state.metrics.registry

    proxied = run(through_proxy())
    registry = CollectorRegistry()
    sessions = Sessions(settings=settings(), sinks=[PrometheusSink(registry)])
    fake = FakeUpstream()  # a fresh twin of the proxy's upstream: the same bytes get the same usage
    session = sessions.session()
    for body in bodies:
        turn = session.begin(api, body)
        sent = Seen("POST", route, "", httpx.Headers(), json.dumps(turn.body).encode())
        assert turn.succeed(normalize_usage(fake._generate(sent).json(), api)) is not None
    session.close()  # the proxy closed its session at shutdown

    names, samples = turn_level(registry)
    proxy_names, proxy_samples = turn_level(proxied)
    assert names == proxy_names == TURN_FAMILIES  # and the proxy has no turn-level family of its own
    assert fed_by_events(samples) == pytest.approx(fed_by_events(proxy_samples))
    provider, model = ("anthropic", "claude-opus-4-8") if api == "anthropic.messages" else ("openai", "gpt-4o")
    read = (
        "agentcache_prompt_tokens_total",
        (("kind", "cache_read"), ("model", model), ("provider", provider), ("source", "turn")),
    )
    assert samples[read] > 0  # the second turn read the first one's prefix
    assert samples[("agentcache_session_events_total", (("event", "turn"),))] == 2


def test_saved_gauge_follows_the_live_report() -> None:
    async def scenario() -> None:
        async with proxy() as (client, state, _):
            for n in (1, 3, 5):
                await client.post("/v1/messages", json=anthropic_body(conversation(n)), headers=A)
            totals = state.report.to_dict()["totals"]
            saved = state.metrics.registry.get_sample_value("agentcache_saved_usd")
            assert saved == pytest.approx(totals["as_sent"]["cost_usd"] - totals["agentcache"]["cost_usd"], abs=1e-5)
            assert saved is not None and saved > 0
            reported = state.metrics.registry.get_sample_value(
                "agentcache_cost_usd_total", {"provider": "anthropic", "model": "claude-opus-4-8", "arm": "reported"}
            )
            assert reported == pytest.approx(totals["reported"]["cost_usd"], abs=1e-5)

    run(scenario())


def test_admin_token_required_when_set() -> None:
    async def scenario() -> None:
        async with proxy(admin_token="s3cret") as (client, _, _):
            assert (await client.get("/metrics")).status_code == 401
            assert (await client.get("/metrics", headers={"authorization": "Bearer nope"})).status_code == 401
            assert (await client.get("/metrics", headers={"authorization": "Bearer s3cret"})).status_code == 200
            r = await client.get("/agentcache/v1/report", headers={"x-agentcache-admin-token": "s3cret"})
            assert r.status_code == 200

    run(scenario())


def test_admin_endpoints_disabled_beyond_loopback_without_token() -> None:
    async def scenario() -> None:
        async with proxy(host="0.0.0.0") as (client, _, _):
            assert (await client.get("/metrics")).status_code == 403
            # the report is per tenant: a caller sees its own (empty so far), never all of them
            assert (await client.get("/agentcache/v1/report", params={"tenant": "0" * 16})).status_code == 403
            # the API itself is still served
            r = await client.post("/v1/messages", json=anthropic_body(conversation(1)), headers=A)
            assert r.status_code == 200

    run(scenario())


def test_config_file_environment_and_arguments(tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> None:
    path = tmp_path / "agentcache.toml"
    path.write_text('[proxy]\nupstream = "http://127.0.0.1:8080/v1"\nport = 9000\nmax_body_bytes = 1000\n')
    monkeypatch.setenv("AGENTCACHE_PROXY_PORT", "9100")
    cfg = load_proxy_config(path, max_body_bytes=None, idle_timeout=5.0)
    assert cfg.upstream_url == "http://127.0.0.1:8080" and cfg.upstream_kind == "url"
    assert cfg.port == 9100 and cfg.max_body_bytes == 1000 and cfg.idle_timeout == 5.0
    assert cfg.upstream_is_loopback
    with pytest.raises(ConfigError, match="upstream"):
        load_proxy_config(None, upstream="ftp://nowhere")
    with pytest.raises(ConfigError, match="cannot read"):
        load_proxy_config(tmp_path / "missing.toml")


def test_misplaced_or_unknown_options_are_refused_not_ignored(tmp_path: Path) -> None:
    """A keep_warm under [proxy] (or a typo) used to be dropped silently; now the file is refused, and the
    pipeline settings read both an [agentcache] table and top-level keys next to a [proxy] table."""
    from agentcache._config import load_settings
    from agentcache.proxy._config import unknown_env

    path = tmp_path / "agentcache.toml"
    path.write_text("[proxy]\nport = 9000\nkeep_warm = true\n")
    with pytest.raises(ConfigError, match=r"keep_warm: a pipeline setting, it goes under \[agentcache\]"):
        load_proxy_config(path)
    path.write_text("[proxy]\nprot = 9000\n")
    with pytest.raises(ConfigError, match=r"unknown \[proxy\] option.*prot"):
        load_proxy_config(path)
    path.write_text("[agentcache]\nkeep_warm = true\nkeepwarm = true\n")
    with pytest.raises(ConfigError, match=r"unknown setting.*keepwarm"):
        load_settings(path)
    path.write_text("keep_warm = true\n[proxy]\nport = 9000\n")
    assert load_settings(path).keep_warm is True and load_proxy_config(path).port == 9000
    path.write_text("[agentcache]\nkeep_warm = true\n[proxy]\nport = 9001\n")
    assert load_settings(path).keep_warm is True and load_proxy_config(path).port == 9001
    env = {"AGENTCACHE_PROXY_PORT": "1", "AGENTCACHE_PROXY_KEEP_WARM": "1", "AGENTCACHE_KEEP_WARM": "1"}
    assert unknown_env(env) == ["AGENTCACHE_PROXY_KEEP_WARM"]


def test_tenant_hash_hides_the_key() -> None:
    salt = "s"
    a = tenant_of({"x-api-key": "k1"}, salt)
    assert a == tenant_of({"authorization": "Bearer k1"}, salt) != tenant_of({"x-api-key": "k2"}, salt)
    assert "k1" not in a and len(a) == 16
    assert tenant_of({}, salt) == "anonymous"


def test_cli_proxy_command_builds_the_config(tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> None:
    seen: dict[str, Any] = {}

    def fake_serve(config: ProxyConfig, settings: Any = None) -> None:
        seen["config"] = config

    monkeypatch.setattr("agentcache.proxy.serve", fake_serve)
    try:
        result = CliRunner().invoke(
            _cli.app,
            [
                "proxy",
                "--upstream",
                "http://127.0.0.1:30000",
                "--engine",
                "sglang",
                "--port",
                "0",
                "--admin-token",
                "t",
            ],
        )
    finally:
        reset_logging()
        reset_settings()
    assert result.exit_code == 0, result.output
    cfg = seen["config"]
    assert cfg.upstream_url == "http://127.0.0.1:30000" and cfg.engine == "sglang" and cfg.admin_token == "t"
    bad = CliRunner().invoke(_cli.app, ["proxy", "--upstream", "gopher://x"])
    reset_logging()
    assert bad.exit_code == 2 and "upstream" in bad.output
