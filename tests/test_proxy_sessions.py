"""Sessions without client changes: inference from the prefix index, explicit ids, tenants, and the
lifecycle over HTTP (close endpoint, close header, idle sweep, eviction, late responses, SGLang)."""

from __future__ import annotations

import asyncio
import json
from typing import Any

import httpx

from agentcache._log import capture_logs
from tests.test_proxy_support import ANTHROPIC_KEY, OTHER_KEY, FakeUpstream, anthropic_body, conversation, proxy

A = {"x-api-key": ANTHROPIC_KEY}
B = {"x-api-key": OTHER_KEY}


def run(coro: Any) -> Any:
    return asyncio.run(coro)


async def post(client: httpx.AsyncClient, messages: list[dict[str, Any]], headers: dict[str, str]) -> httpx.Response:
    r = await client.post("/v1/messages", json=anthropic_body(messages), headers=headers)
    assert r.status_code == 200, r.text
    return r


def test_inferred_sessions_follow_the_conversation_and_stay_within_a_tenant() -> None:
    async def scenario() -> None:
        async with proxy() as (client, _state, _):
            s1 = (await post(client, conversation(1), A)).headers["x-agentcache-session"]
            assert (await post(client, conversation(3), A)).headers["x-agentcache-session"] == s1
            assert (await post(client, conversation(5), A)).headers["x-agentcache-session"] == s1
            # the same conversation under another API key is another tenant's session
            other = (await post(client, conversation(7), B)).headers["x-agentcache-session"]
            assert other != s1
            # another conversation of the same tenant starts a new session
            assert (await post(client, conversation(1, run=3), A)).headers["x-agentcache-session"] != s1
            # tenant B can neither close nor see A's session
            r = await client.post(f"/agentcache/v1/sessions/{s1}/close", headers=B)
            assert r.status_code == 404 and r.json()["closed"] is False
            assert (await post(client, conversation(7), A)).headers["x-agentcache-session"] == s1
            r = await client.post(f"/agentcache/v1/sessions/{s1}/close", headers=A)
            assert r.status_code == 200 and r.json() == {"session_id": s1, "closed": True, "generation": 0}

    run(scenario())


def test_edited_history_finds_its_session_and_is_diagnosed() -> None:
    async def scenario() -> None:
        async with proxy() as (client, state, _):
            msgs = conversation(5)
            sid = (await post(client, msgs, A)).headers["x-agentcache-session"]
            edited = [*msgs, *conversation(7)[5:]]
            edited[3] = {"role": "assistant", "content": [{"type": "text", "text": "[output elided]"}]}
            assert (await post(client, edited, A)).headers["x-agentcache-session"] == sid
            breaks = state.report.to_dict()["breaks"]
            assert [b["cause"] for b in breaks] == ["messages.edited"]
            assert breaks[0]["first_divergent"].startswith("messages[3]")

    run(scenario())


def test_same_opening_message_different_conversations_stay_apart() -> None:
    async def scenario() -> None:
        async with proxy() as (client, _, _):
            opening = conversation(1)
            s1 = (await post(client, opening, A)).headers["x-agentcache-session"]
            await post(client, [*opening, *conversation(3)[1:]], A)
            fork = [*opening, {"role": "assistant", "content": [{"type": "text", "text": "Another answer."}]}]
            fork.append({"role": "user", "content": [{"type": "text", "text": "Go on."}]})
            assert (await post(client, fork, A)).headers["x-agentcache-session"] != s1

    run(scenario())


def test_explicit_ids_parent_lineage_and_prompt_cache_key() -> None:
    async def scenario() -> None:
        async with proxy(upstream="openai") as (client, _state, fake):
            base = [{"role": "system", "content": "You are terse."}, {"role": "user", "content": "Plan the trip."}]
            body = {"model": "gpt-4o", "messages": base}
            r = await client.post("/v1/chat/completions", json=body, headers={"x-agentcache-session": "root"})
            assert r.headers["x-agentcache-session"] == "root"
            root_key = fake.requests[-1].json()["prompt_cache_key"]
            sub = {"x-agentcache-session": "root/sub1", "x-agentcache-parent": "root"}
            body2 = {"model": "gpt-4o", "messages": [*base[:1], {"role": "user", "content": "Find flights."}]}
            r = await client.post("/v1/chat/completions", json=body2, headers=sub)
            assert r.headers["x-agentcache-session"] == "root/sub1"
            assert fake.requests[-1].json()["prompt_cache_key"] == root_key  # the subagent shares the lineage key
            assert "x-agentcache-parent" not in fake.requests[-1].headers
            # a client's own prompt_cache_key names the session, and is kept
            r = await client.post("/v1/chat/completions", json={**body, "prompt_cache_key": "k-42"})
            assert r.headers["x-agentcache-session"] == "k-42"
            assert fake.requests[-1].json()["prompt_cache_key"] == "k-42"

    run(scenario())


def test_close_then_reuse_starts_next_generation_and_close_header() -> None:
    async def scenario() -> None:
        async with proxy() as (client, state, _):
            h = {**A, "x-agentcache-session": "task-1"}
            with capture_logs() as logs:
                r = await post(client, conversation(1), h)
                assert r.headers["x-agentcache-generation"] == "0"
                assert (await client.post("/agentcache/v1/sessions/task-1/close", headers=A)).status_code == 200
                r = await post(client, conversation(3), h)
                assert r.headers["x-agentcache-generation"] == "1"
                await post(client, conversation(5), {**h, "x-agentcache-close": "true"})
            assert state.store.live() == 0
            events = [(e["event"], e.get("reason")) for e in logs if e["event"] in ("session.open", "session.close")]
            assert events == [
                ("session.open", "new"),
                ("session.close", "closed"),
                ("session.open", "restart"),
                ("session.close", "closed"),
            ]
            line = [e for e in logs if e["event"] == "proxy.request"][-1]
            assert set(line) >= {"prefix_identity", "reuse_boundary", "session_signal", "storage_tier"}
            assert line["session_signal"]["generation"] == 1 and line["session_signal"]["turn"] == 1
            assert ANTHROPIC_KEY not in json.dumps(logs, default=str)  # keys are never logged

    run(scenario())


def test_idle_sweep_and_eviction() -> None:
    async def scenario() -> None:
        async with proxy(max_sessions=2, idle_timeout=60) as (client, state, _):
            with capture_logs() as logs:
                for run_ in (0, 1, 2):
                    await post(client, conversation(1, run=run_), A)
                assert state.store.live() == 2
                closed = await state.sweep()
                assert closed == []
                for sess in list(state.store._live.values()):  # type: ignore[attr-defined]
                    sess.last_active -= 120
                assert len(await state.sweep()) == 2 and state.store.live() == 0
            reasons = [e.get("reason") for e in logs if e["event"] == "session.close"]
            assert reasons == ["evicted", "idle", "idle"]

    run(scenario())


def test_late_response_of_a_closed_session_changes_nothing() -> None:
    async def scenario() -> None:
        fake = FakeUpstream(gate=asyncio.Event())
        async with proxy(fake) as (client, state, _):
            h = {**A, "x-agentcache-session": "slow"}
            pending = asyncio.create_task(client.post("/v1/messages", json=anthropic_body(conversation(1)), headers=h))
            while not fake.requests:
                await asyncio.sleep(0.01)
            assert (await client.post("/agentcache/v1/sessions/slow/close", headers=A)).status_code == 200
            fake.gate.set()  # type: ignore[union-attr]
            r = await pending
            assert r.status_code == 200  # the client still gets its answer
            assert "agentcache_proxy_stale_commits_total 1.0" in state.metrics.render().decode()
            # no turn, but the upstream processed the prompt: its tokens are counted apart, never as a turn's
            tokens = {"provider": "anthropic", "model": "claude-opus-4-8", "kind": "uncached"}
            sample = state.metrics.registry.get_sample_value
            assert (sample("agentcache_prompt_tokens_total", {**tokens, "source": "uncommitted"}) or 0) > 0
            assert sample("agentcache_prompt_tokens_total", {**tokens, "source": "turn"}) is None
            assert sample("agentcache_session_events_total", {"event": "turn"}) == 0
            r = await post(client, conversation(3), h)
            assert r.headers["x-agentcache-generation"] == "1"
            assert state.report.to_dict()["breaks"] == []  # generation 1 starts fresh: nothing to diverge from

    run(scenario())


def test_failed_request_is_a_retry_in_the_same_generation() -> None:
    async def scenario() -> None:
        fake = FakeUpstream()
        calls = {"n": 0}

        def overloaded(seen: Any) -> httpx.Response | None:
            calls["n"] += 1
            if calls["n"] == 2:
                return httpx.Response(
                    529, json={"type": "error", "error": {"type": "overloaded_error", "message": "x"}}
                )
            return None

        fake.fault = overloaded
        async with proxy(fake) as (client, state, _):
            h = {**A, "x-agentcache-session": "r"}
            with capture_logs() as logs:
                await post(client, conversation(1), h)
                r = await client.post("/v1/messages", json=anthropic_body(conversation(3)), headers=h)
                assert r.status_code == 529 and r.json()["error"]["type"] == "overloaded_error"
                await post(client, conversation(3), h)
            retry = [e for e in logs if e["event"] == "session.retry"]
            assert len(retry) == 1 and retry[0]["session_signal"]["attempt"] == 1
            assert retry[0]["reason"] == "http_529"
            lines = [e for e in logs if e["event"] == "proxy.request"]
            assert [e["session_signal"]["attempt"] for e in lines] == [0, 0, 1]
            assert [e["committed"] for e in lines] == [True, False, True]
            sess = state.store._live[(lines[0]["tenant"], "r")]  # type: ignore[attr-defined]
            assert sess.turns == 2 and sess.attempt == 0 and sess.generation == 0

    run(scenario())


def test_sglang_gets_session_id_and_close_session() -> None:
    async def scenario() -> None:
        async with proxy(upstream="http://sglang.local:30000", engine="sglang") as (client, _state, fake):
            body = {"model": "qwen", "messages": [{"role": "user", "content": "hi"}]}
            h = {"x-agentcache-session": "job-7"}
            r = await client.post("/v1/chat/completions", json=body, headers=h)
            assert r.status_code == 200
            assert fake.requests[-1].json()["session_id"] == "job-7"
            assert str(fake.requests[-1].path) == "/v1/chat/completions"
            await client.post("/agentcache/v1/sessions/job-7/close")
            await asyncio.sleep(0.05)
            closes = [s for s in fake.requests if s.path == "/close_session"]
            assert [c.json() for c in closes] == [{"session_id": "job-7"}]
            await client.post("/v1/chat/completions", json=body, headers=h)  # generation 1: a fresh SGLang id
            assert fake.requests[-1].json()["session_id"] == "job-7:g1"

    run(scenario())


def test_match_rule_prefers_heads_then_resumes_and_never_an_opening_alone() -> None:
    from agentcache.session._identity import checkpoints_of, index_entries, match_checkpoints

    def cps(msgs: list[dict[str, Any]]) -> Any:
        return checkpoints_of("anthropic.messages", {"messages": msgs})

    msgs = [{"role": "user" if i % 2 == 0 else "assistant", "content": f"m{i}"} for i in range(8)]
    assert checkpoints_of("openai.chat", {"messages": msgs}).chain != cps(msgs).chain  # one API per session
    index: dict[bytes, tuple[str, bool]] = {}
    for sid, last in (("long", msgs[:6]), ("short", msgs[:2])):
        index.update({h: (sid, head) for h, head in index_entries(cps(last), 2)})
    assert match_checkpoints(cps(msgs[:8]), index.get, 2) == "long"  # the deepest head it extends
    assert match_checkpoints(cps(msgs[:3]), index.get, 2) == "short"
    # equal to "long"'s last request: not its continuation (it extends "short"'s, the same task run again)
    assert match_checkpoints(cps(msgs[:6]), index.get, 2) == "short"
    index = {h: v for h, v in index.items() if v[0] != "short"}
    assert match_checkpoints(cps(msgs[:6]), index.get, 2) is None
    # a resume that rewrote an answer in place still carries "long"'s final message, after the same opening
    resumed = [*msgs[:3], {"role": "assistant", "content": " m3, re-rendered\n"}, *msgs[4:8]]
    resumed[5] = {"role": "assistant", "content": [{"type": "text", "text": "  m5 \n"}]}  # "long"'s final item
    assert match_checkpoints(cps(resumed), index.get, 2) == "long"
    assert match_checkpoints(cps(resumed[:6]), index.get, 2) is None  # it must go beyond that item
    assert match_checkpoints(cps(resumed[:2]), index.get, 2) is None  # (a prefix of history: no one's continuation)
    # sharing only the opening is not enough: another chat after the same two example messages
    other = [*msgs[:2], {"role": "user", "content": "another task"}, {"role": "assistant", "content": "m3"}]
    assert match_checkpoints(cps([*other, *msgs[4:8]]), index.get, 2) == "long"  # (it carries m5: a resume)
    assert match_checkpoints(cps([*other, {"role": "user", "content": "go on"}]), index.get, 2) is None
    # its first message rewritten (Qwen Code's --continue drops a date reminder from it): under the same tools and
    # system it still carries "long"'s final item; under others, nothing ties it to "long"
    rewritten = [{"role": "user", "content": "x"}, *msgs[1:8]]
    assert match_checkpoints(cps(rewritten), index.get, 2) == "long"
    other_prefix = checkpoints_of("anthropic.messages", {"messages": rewritten, "system": "another agent"})
    assert match_checkpoints(other_prefix, index.get, 2) is None
    marked = [dict(m) for m in msgs]
    marked[1] = {
        "role": "assistant",
        "content": [{"type": "text", "text": "m1", "cache_control": {"type": "ephemeral"}}],
    }
    plain = [dict(m) for m in msgs]
    plain[1] = {"role": "assistant", "content": [{"type": "text", "text": "m1"}]}
    assert cps(marked) == cps(plain) and cps(plain) == cps(msgs)
    # a message's other keys are part of it, in either form (Claude Code 2.1.332's role: "system" message)
    sys_list = {"role": "system", "content": [{"type": "text", "text": "env", "cache_control": {"type": "ephemeral"}}]}
    sys_str = {"role": "system", "content": "env"}
    extra = {"output_config": {"effort": "medium"}}
    assert cps([msgs[0], {**sys_list, **extra}]).chain == cps([msgs[0], {**sys_str, **extra}]).chain
    assert cps([msgs[0], {**sys_str, **extra}]).chain != cps([msgs[0], sys_str]).chain


def test_memory_budget_evicts_least_recently_used_sessions() -> None:
    async def scenario() -> None:
        async with proxy(max_state_mb=1) as (client, state, _):
            with capture_logs() as logs:
                for run_ in range(8):  # ~25 KB bodies: ~250 KB of estimated state each
                    await post(client, conversation(1, run=run_), A)
                await post(client, conversation(1, run=0), A)  # the next open announces the evictions
            assert state.store.state_bytes <= 1024 * 1024
            assert 2 <= state.store.live() < 8
            assert {e["reason"] for e in logs if e["event"] == "session.close"} == {"evicted"}

    run(scenario())


def test_report_simulators_stay_within_their_budget() -> None:
    from agentcache.analysis._ledger import _size

    async def scenario() -> None:
        async with proxy() as (client, state, _):
            ledger = state.report.ledger
            ledger.max_chain = 400  # a few requests' worth of prefixes
            for run_ in range(6):
                await post(client, conversation(3, run=run_), A)
            sizes = [_size(s) for s in ledger._scopes.values()]
            assert 0 < sum(sizes) <= 400 and state.report.to_dict()["totals"]["as_sent"]["requests"] == 6

    run(scenario())
