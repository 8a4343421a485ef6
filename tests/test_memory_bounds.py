"""Memory bounds (issue 12, item 6; issue 24, items 2 and 3): every structure the proxy holds for its traffic is
inside one budget (``max_state_mb``), each with its own share, measured and evicted least recently used; what a
client chooses (model names, ids, keys) is kept bounded in bytes; no scope is pinned for the process's life."""

from __future__ import annotations

import asyncio
from typing import Any

import pytest

from agentcache._config import Settings
from agentcache.adapters import canonicalize
from agentcache.model._bounded import MAX_NAME_BYTES, bounded
from agentcache.model._types import Api, TargetKind
from agentcache.proxy._budget import PARSE_MEMO_BYTES_PER_CHAR, SHARES, Budget
from agentcache.proxy._caller import tenant_of
from agentcache.session import Sessions
from agentcache.session._pipeline import SCOPE_BYTES
from agentcache.session._store import TOMBSTONE_BYTES
from agentcache.simulate import AnthropicSimulator, OpenAISimulator
from agentcache.simulate._base import MAX_MODEL_SCOPES, ModelScopes
from policies.cache_key import FAMILY_BYTES, KeyPlanner
from tests.memsize import deep_size
from tests.test_proxy_support import FakeUpstream, anthropic_body, chat_body, conversation, proxy

A = {"x-api-key": "sk-ant-test"}


def test_model_scopes_keep_the_most_recently_used_models() -> None:
    scopes: ModelScopes[list[str]] = ModelScopes(list, limit=4)
    a, b, c = scopes.get("gpt-4o"), scopes.get("GPT-4o"), scopes.get("claude-sonnet-4-5")
    assert a is b and a is not c  # normalised names share a scope
    d = scopes.get("model-3")
    assert len(scopes) == 3
    assert scopes.get("gpt-4o") is a  # used again: the most recent
    rest = [scopes.get(f"model-{i}-{'x' * 20_000}") for i in range(4, 1000)]
    assert len(scopes) == 4 and len({id(r) for r in rest}) == len(rest)  # each its own scope, none shared
    assert scopes.get("model-3") is not d and scopes.get("gpt-4o") is not a  # no scope pinned for good
    assert all(len(k) <= MAX_NAME_BYTES for k in scopes._scopes)  # a client's 20 KB name is kept bounded


def _request(model: str, text: str) -> Any:
    body = {"model": model, "max_tokens": 8, "messages": [{"role": "user", "content": text}]}
    return canonicalize(Api.ANTHROPIC_MESSAGES, body)


def test_simulators_keep_at_most_max_model_scopes() -> None:
    for sim in (AnthropicSimulator(), OpenAISimulator()):
        for i in range(300):
            sim.run(_request(f"client-model-{i}-" + "m" * 2000, f"hello {i}"), float(i))
        assert len(sim._scopes) == MAX_MODEL_SCOPES


def test_key_planner_remembers_the_setting_s_families_least_recently_used_first() -> None:
    sessions = Sessions(settings=Settings(openai_key_families=10))
    keys = sessions.scope("t", TargetKind.OPENAI).keys
    assert keys.max_families == 10
    for i in range(100):
        keys.record(f"family-{i}", 1000.0 + i)
    assert keys.estimated_bytes() == 10 * FAMILY_BYTES
    assert sessions.scope_bytes() == SCOPE_BYTES + 10 * FAMILY_BYTES
    assert keys.shards("family-99") == 1 and "family-0" not in keys._times and "family-90" in keys._times


def test_key_planner_default_bound() -> None:
    planner = KeyPlanner()
    for i in range(5000):
        planner.record(f"f{i}", float(i))
    assert len(planner._times) == planner.max_families == 4096 == Settings().openai_key_families


def test_each_part_has_its_share_of_the_budget() -> None:
    assert sum(SHARES.values()) == pytest.approx(1.0)
    budget = Budget.of_mb(64)

    async def scenario() -> None:
        async with proxy(FakeUpstream(), max_state_mb=64) as (_client, state, _):
            assert state.store.max_bytes == budget.share("sessions")
            assert state.store.max_tombstones == budget.share("tombstones") // TOMBSTONE_BYTES
            assert state.report.max_bytes == budget.share("report")
            assert state.sessions.max_scope_bytes == budget.share("scopes")
            assert state.parse_memo.budget * PARSE_MEMO_BYTES_PER_CHAR <= budget.share("parse_memo")
            metrics = dict(ln.rsplit(" ", 1) for ln in state.metrics.render().decode().splitlines() if ln[:1] != "#")
            for part in SHARES:
                assert float(metrics[f'agentcache_proxy_state_budget_bytes{{part="{part}"}}']) == budget.share(part)
                assert float(metrics[f'agentcache_proxy_state_bytes{{part="{part}"}}']) >= 0

    asyncio.run(scenario())


def _traffic(i: int, huge: bool = False) -> tuple[str, dict[str, Any], dict[str, str]]:
    """Request ``i`` of a varied load: a new session, one of 40 prefixes and 25 model names, 4 tenants, 2 APIs;
    ``huge``: a model name of 1 MiB."""
    system = f"agent {i % 40}: " + "policy words " * 80
    tools = [{"name": f"t{i % 40}_{j}", "description": "d " * 20, "input_schema": {"type": "object"}} for j in range(4)]
    msgs = [{"role": "user", "content": f"conversation {i} " + "words " * 60}]
    headers = {"x-api-key": f"sk-ant-{i % 4}", "authorization": f"Bearer sk-{i % 4}"}
    if i % 2:
        model = f"gpt-4o-huge-{i}-" + "m" * (1 << 20) if huge else f"gpt-4o-ft-{i % 25}"
        fns = [{"type": "function", "function": {"name": t["name"], "parameters": t["input_schema"]}} for t in tools]
        body = {"model": model, "tools": fns, "messages": [{"role": "system", "content": system}, *msgs]}
        return "/v1/chat/completions", body, headers
    model = f"claude-huge-{i}-" + "c" * (1 << 20) if huge else f"claude-sonnet-4-5-ft-{i % 25}"
    return (
        "/v1/messages",
        {"model": model, "max_tokens": 8, "system": system, "tools": tools, "messages": msgs},
        headers,
    )


def test_every_part_stays_within_its_share_and_its_estimate_is_its_measured_size() -> None:
    """Driven past every share at ``max_state_mb = 2``: each part's estimate is within its share, and its measured
    size (a ``sys.getsizeof`` walk) at most a quarter over its estimate."""

    async def scenario() -> None:
        async with proxy(FakeUpstream(), max_state_mb=2) as (client, state, _):
            for i in range(400):
                path, body, headers = _traffic(i, huge=i % 100 == 99)
                assert (await client.post(path, json=body, headers=headers)).status_code == 200
            parts = {part: measure() for part, measure in state.state_parts().items()}
            for part, held in parts.items():
                assert held <= state.budget.share(part) * 1.02, (part, held)
            store, sessions, ledger = state.store, state.sessions, state.report.ledger
            shared = [sessions, state.settings, *sessions._scopes.values()]
            shared += [s.pipeline.target for s in store.sessions()]
            measured = {
                "sessions": deep_size([[s.pipeline.state, s.pipeline.cache] for s in store.sessions()], shared)
                + deep_size([store._index]),
                "tombstones": deep_size([store._tombs]),
                "report": deep_size([ledger], [sc.target for sc in ledger._scopes.values()]),
                "scopes": deep_size([sessions._scopes, sessions._lineages]),
                "parse_memo": deep_size([state.parse_memo._groups, state.parse_memo._lru]),
            }
            for part, size in measured.items():
                assert size <= 1.25 * parts[part] + 64 * 1024, (part, size, parts[part])

    asyncio.run(scenario())


def test_two_sessions_taking_turns_keep_their_generation_whatever_else_fills_the_budget() -> None:
    """Issue 24, item 2: the report, planners, tombstones, memos and the parse memo full, new sessions coming all the
    time: two sessions that take turns are never evicted, so every turn of theirs is generation 0."""

    async def scenario() -> None:
        async with proxy(FakeUpstream(), max_state_mb=2) as (client, _state, _):
            turns: dict[str, list[dict[str, Any]]] = {sid: [{"role": "user", "content": f"hi {sid}"}] for sid in "AB"}
            generations = []
            for i in range(300):
                path, body, headers = _traffic(i, huge=i % 60 == 59)
                assert (await client.post(path, json=body, headers=headers)).status_code == 200
                if i % 10 == 9:
                    for sid, msgs in turns.items():
                        headers = {**A, "x-agentcache-session": sid}
                        r = await client.post("/v1/messages", json=anthropic_body(msgs), headers=headers)
                        generations.append(r.headers["x-agentcache-generation"])
                        msgs += [{"role": "assistant", "content": "ok"}, {"role": "user", "content": f"more {i}"}]
            assert generations == ["0"] * 60

    asyncio.run(scenario())


def test_a_session_too_large_for_the_sessions_share_is_not_kept_and_evicts_no_other() -> None:
    async def scenario() -> None:
        async with proxy(FakeUpstream(), max_state_mb=1) as (client, state, _):
            await client.post(
                "/v1/messages", json=anthropic_body(conversation(1)), headers={**A, "x-agentcache-session": "s"}
            )
            big = anthropic_body([{"role": "user", "content": "x" * 200_000}])
            r = await client.post("/v1/messages", json=big, headers={**A, "x-agentcache-session": "big"})
            assert r.status_code == 200
            tenant = tenant_of(A, state.config.tenant_salt)
            assert state.store.get(tenant, "s") is not None and state.store.get(tenant, "big") is None
            tomb = state.store.tombstone(tenant, "big")
            assert tomb is not None and tomb.reason == "evicted"

    asyncio.run(scenario())


def test_client_chosen_model_names_stay_bounded_in_the_live_report() -> None:
    async def scenario() -> None:
        async with proxy(FakeUpstream()) as (client, state, _):
            for i in range(150):
                model = f"model-{i}-" + "x" * 5000
                msgs = [{"role": "user", "content": f"hello {i}"}]
                if i % 2:
                    r = await client.post("/v1/chat/completions", json=chat_body(msgs, model=model))
                else:
                    r = await client.post("/v1/messages", json=anthropic_body(msgs, model=model), headers=A)
                assert r.status_code == 200
            assert len(state.report.models) <= state.report.max_names
            for scope in state.report.ledger._scopes.values():
                for sim in scope.sims.values():
                    assert len(sim._scopes) <= MAX_MODEL_SCOPES  # type: ignore[attr-defined]
            text = state.metrics.render().decode()
            assert "x" * 100 not in text  # no model name became a label value

    asyncio.run(scenario())


def test_bounded_keeps_short_names_and_tells_long_ones_apart() -> None:
    assert bounded("claude-sonnet-4-5") == "claude-sonnet-4-5"
    assert bounded("é" * 128) == "é" * 128  # 256 bytes exactly
    long_a, long_b = "x" * 5000 + "a", "x" * 5000 + "b"
    assert bounded(long_a) != bounded(long_b) and bounded(long_a) == bounded(long_a)
    assert all(
        len(bounded(t).encode("utf-8", "surrogatepass")) <= MAX_NAME_BYTES for t in (long_a, "é" * 300, "a\ud800" * 200)
    )


def test_huge_model_names_are_held_nowhere_in_full() -> None:
    """Issue 24, item 3: a tenant's requests with 1 MiB model names leave no such string in the report, the
    simulators, the session core or the rule caches (the sessions that carry them in their bodies are themselves
    too large for the sessions' share)."""
    from agentcache.model import _rules

    async def scenario() -> None:
        async with proxy(FakeUpstream(), max_state_mb=4) as (client, state, _):
            for i in range(8):
                path, body, headers = _traffic(2 * i + i % 2, huge=True)
                assert (await client.post(path, json=body, headers=headers)).status_code == 200
            roots = [state.report, state.sessions._scopes, state.sessions._lineages, _rules._anthropic_rules,
                     _rules._openai_rules]  # fmt: skip
            assert _longest_string(roots) < 4096
            assert state.store.live() == 0  # each too large to keep: evicted at its commit

    asyncio.run(scenario())


def _longest_string(roots: list[Any]) -> int:
    """The longest string or bytes object ``roots`` reach (not through modules, functions or types)."""
    import gc
    import types

    seen: set[int] = set()
    stack = list(roots)
    longest = 0
    while stack:
        obj = stack.pop()
        if id(obj) in seen or isinstance(obj, type | types.ModuleType | types.FunctionType | types.CodeType):
            continue
        seen.add(id(obj))
        if isinstance(obj, str | bytes):
            longest = max(longest, len(obj))
            continue
        stack.extend(gc.get_referents(obj))
    return longest
