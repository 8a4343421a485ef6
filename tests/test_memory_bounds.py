"""Memory bounds (issue 12, item 6): every structure that grows with client-chosen input has a bound, and the
proxy's ``max_state_mb`` counts what the process holds for it."""

from __future__ import annotations

import asyncio
from typing import Any

from agentcache._config import Settings
from agentcache.adapters import canonicalize
from agentcache.model._types import Api, TargetKind
from agentcache.proxy._live import SIM_PREFIX_BYTES
from agentcache.session import Sessions
from agentcache.session._store import INDEX_ENTRY_BYTES, TOMBSTONE_BYTES, MemoryStore
from agentcache.simulate import AnthropicSimulator, OpenAISimulator
from agentcache.simulate._base import MAX_MODEL_SCOPES, OTHER_MODEL, ModelScopes
from policies.cache_key import FAMILY_BYTES, KeyPlanner
from tests.test_proxy_support import FakeUpstream, anthropic_body, chat_body, proxy

A = {"x-api-key": "sk-ant-test"}


def test_model_scopes_fold_models_beyond_the_cap_into_other() -> None:
    scopes: ModelScopes[list[str]] = ModelScopes(list, limit=4)
    a, b, c = scopes.get("gpt-4o"), scopes.get("GPT-4o"), scopes.get("claude-sonnet-4-5")
    assert a is b and a is not c  # normalised names share a scope
    d = scopes.get("model-3")
    assert len(scopes) == 3
    rest = [scopes.get(f"model-{i}-{'x' * 20_000}") for i in range(4, 1000)]
    assert len(scopes) == 4 and all(r is rest[0] for r in rest)  # the fourth slot is the shared one
    assert scopes.get(OTHER_MODEL) is rest[0]
    assert scopes.get("model-3") is d and scopes.get("gpt-4o") is a  # scopes made before the cap stay


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
    assert sessions.planner_bytes() == 10 * FAMILY_BYTES
    assert keys.shards("family-99") == 1 and "family-0" not in keys._times and "family-90" in keys._times


def test_key_planner_default_bound() -> None:
    planner = KeyPlanner()
    for i in range(5000):
        planner.record(f"f{i}", float(i))
    assert len(planner._times) == planner.max_families == 4096 == Settings().openai_key_families


def test_tombstones_take_at_most_an_eighth_of_the_budget() -> None:
    store = MemoryStore(max_tombstones=50_000, max_bytes=4 * 1024 * 1024)
    assert store.max_tombstones == 4 * 1024 * 1024 // 8 // TOMBSTONE_BYTES
    assert MemoryStore(max_tombstones=50_000).max_tombstones == 50_000  # the default budget keeps them all


def test_store_budget_counts_index_tombstones_and_held_bytes() -> None:
    async def scenario() -> None:
        async with proxy(FakeUpstream(), max_state_mb=1) as (client, state, _):
            store = state.store
            assert store.held is not None
            for i in range(60):  # each a new session: a new first message
                body = anthropic_body([{"role": "user", "content": f"session {i} " + "words " * 800}])
                r = await client.post("/v1/messages", json=body, headers=A)
                assert r.status_code == 200
            live = store.live()
            assert 1 <= live < 60  # ~48 KB of state each: the 1 MB budget holds a few
            assert store.budget_bytes() <= 1024 * 1024 + max(s.size for s in store.sessions())
            index = len(store._index) * INDEX_ENTRY_BYTES
            tombs = len(store._tombs) * TOMBSTONE_BYTES
            assert store.state_bytes == sum(s.size for s in store.sessions()) + index + tombs
            assert store.budget_bytes() == store.state_bytes + state._held_bytes()
            assert state._held_bytes() >= state.report.estimated_bytes() > 0

    asyncio.run(scenario())


def test_report_held_bytes_evict_sessions() -> None:
    # What the report and the planners hold leaves less of the budget to sessions.
    async def scenario() -> None:
        async with proxy(FakeUpstream(), max_state_mb=1) as (client, state, _):
            store = state.store
            for i in range(6):
                body = anthropic_body([{"role": "user", "content": f"s{i} " + "words " * 800}])
                assert (await client.post("/v1/messages", json=body, headers=A)).status_code == 200
            before = store.live()
            store.held = lambda: 1024 * 1024 - store.state_bytes // 2
            body = anthropic_body([{"role": "user", "content": "one more " + "words " * 800}])
            assert (await client.post("/v1/messages", json=body, headers=A)).status_code == 200
            assert store.live() < before

    asyncio.run(scenario())


def test_report_simulated_prefixes_take_a_quarter_of_the_budget() -> None:
    async def scenario() -> None:
        async with proxy(FakeUpstream(), max_state_mb=64) as (_client, state, _):
            assert state.report.ledger.max_chain == 64 * 1024 * 1024 // 4 // SIM_PREFIX_BYTES

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
