"""Client-declared identity (issue 11, item 2) and inference that never switches conversations (item 3), through
:class:`~agentcache.Sessions` and through the proxy against a fake upstream."""

from __future__ import annotations

import asyncio
import copy
from typing import Any

from agentcache import Sessions
from agentcache.session import Identity, declared_by
from tests.client_shapes import (
    CC_SESSION,
    aider_anthropic,
    aider_chat,
    aider_restored,
    cc_headers,
    check_sent,
    claude_code_run,
    claude_code_title,
    codex_body,
    codex_headers,
)
from tests.test_proxy_support import anthropic_body, conversation, proxy

A = {"x-api-key": "sk-ant-test-key-one"}


def test_the_declaration_table_reads_each_clients_headers() -> None:
    cc = declared_by({"x-claude-code-session-id": "S"})
    assert cc is not None and (cc.client, cc.session, cc.parent, cc.lineage) == ("claude-code", "S", None, True)
    sub = declared_by({"x-claude-code-session-id": "S", "x-claude-code-agent-id": "a1"})
    assert sub is not None and (sub.session, sub.parent, sub.lineage) == ("S/a1", "S", False)
    nested = declared_by(
        {"x-claude-code-session-id": "S", "x-claude-code-agent-id": "a2", "x-claude-code-parent-agent-id": "a1"}
    )
    assert nested is not None and (nested.session, nested.parent) == ("S/a2", "S/a1")
    root = declared_by(codex_headers("T", "T"))
    assert root is not None and (root.client, root.session, root.parent, root.lineage) == ("codex", "T", None, False)
    child = declared_by(codex_headers("U", "T", parent="T"))
    assert child is not None and (child.session, child.parent) == ("U", "T")
    oc = declared_by({"x-session-id": "ses_1", "session-id": "ses_1"})
    assert oc is not None and (oc.client, oc.session, oc.lineage) == ("opencode", "ses_1", True)
    oc_sub = declared_by({"x-session-id": "ses_2", "x-parent-session-id": "ses_1"})
    assert oc_sub is not None and (oc_sub.session, oc_sub.parent, oc_sub.lineage) == ("ses_2", "ses_1", False)
    assert declared_by({"x-app": "cli", "thread-id": " "}) is None


def _signal(state: Any, sid: str) -> tuple[str | None, str]:
    sess = next(s for s in state.store.sessions() if s.session_id == sid)
    return sess.parent, sess.lineage


def test_codex_subagent_is_its_own_session_in_its_parents_lineage() -> None:
    async def scenario() -> None:
        async with proxy(upstream="openai") as (client, state, fake):
            root, child = "019a-root-thread", "019a-child-thread"
            opening = [{"type": "message", "role": "user", "content": [{"type": "input_text", "text": "Plan a trip."}]}]
            call = {"type": "function_call", "call_id": "c1", "name": "spawn_agent", "arguments": "{}"}
            out = {"type": "function_call_output", "call_id": "c1", "output": "spawned"}
            sids = []
            for items, thread, parent in [
                (opening, root, None),
                ([*opening, call, out], root, None),
                (opening, child, root),  # the subagent: its own thread, the root's prompt_cache_key
                ([*opening, call], child, root),
                ([*opening, call, out, {"type": "message", "role": "user", "content": "done"}], root, None),
            ]:
                body = codex_body(root, items, sub=thread == child)
                r = await client.post("/v1/responses", json=body, headers=codex_headers(thread, root, parent))
                assert r.status_code == 200, r.text
                sids.append(r.headers["x-agentcache-session"])
                assert fake.requests[-1].json()["prompt_cache_key"] == root  # the client's own key, kept
            assert sids == [root, root, child, child, root]
            assert _signal(state, child) == (root, root) and _signal(state, root) == (None, root)
            doc = state.report.to_dict()
            assert doc["breaks"] == []  # no false tools.removed at the subagent's first request
            # the live report links the subagent to its parent (session keys are tenant/id)
            links = {s["session"].split("/", 1)[1]: (s.get("parent"), s.get("lineage")) for s in doc["sessions"]}
            tenant = doc["sessions"][0]["session"].split("/", 1)[0]
            assert links == {root: (None, None), child: (f"{tenant}/{root}", f"{tenant}/{root}")}

    asyncio.run(scenario())


def test_claude_code_title_main_loop_and_subagent_get_their_own_sessions() -> None:
    async def scenario() -> None:
        async with proxy() as (client, state, fake):
            title = await client.post("/v1/messages", json=claude_code_title(), headers=cc_headers())
            main = claude_code_run(prompts=2, steps=2)
            sub = claude_code_run(prompts=1, steps=2, variant="subagent")
            seen = []
            for n, body in enumerate(main):
                r = await client.post("/v1/messages", json=body, headers=cc_headers())
                seen.append(r.headers["x-agentcache-session"])
                check_sent(body, fake.requests[-1].json())
                if n == 2:  # the main loop spawns a subagent, which runs to its end
                    for sb in sub:
                        rs = await client.post("/v1/messages", json=sb, headers=cc_headers(agent="a5f3c9e1d2b4a6c7"))
                        assert rs.headers["x-agentcache-session"] == f"{CC_SESSION}/a5f3c9e1d2b4a6c7"
                        check_sent(sb, fake.requests[-1].json())
            side = title.headers["x-agentcache-session"]
            assert set(seen) == {CC_SESSION}  # the agent loop is the lineage's main session, every turn
            assert side.startswith(CC_SESSION + "/") and _signal(state, side) == (CC_SESSION, CC_SESSION)
            assert _signal(state, f"{CC_SESSION}/a5f3c9e1d2b4a6c7") == (CC_SESSION, CC_SESSION)
            breaks = [b for b in state.report.to_dict()["breaks"] if not b.get("repaired")]
            assert breaks == []  # neither the title request nor the subagent reads as a break of the main loop

    asyncio.run(scenario())


def test_claude_code_continue_keeps_its_session() -> None:
    run = claude_code_run(prompts=2, steps=1)
    sessions = Sessions(provider="anthropic")
    ident = Identity("t", declared=CC_SESSION, declared_lineage=True)
    for b in run[:2]:
        t = sessions.begin("anthropic.messages", b, identity=ident)
        assert t.commit()
        t.succeed()
    later = copy.deepcopy(run[2])
    later["system"][2]["text"] += " Today is another day."  # --continue: the client changed system[2]
    turn = sessions.begin("anthropic.messages", later, identity=ident)
    assert turn.session.session_id == CC_SESSION
    assert turn.prepared.divergence is not None and turn.prepared.divergence.cause is not None
    assert turn.prepared.divergence.cause.value == "system.changed"


def _post_all(bodies: list[tuple[str, dict[str, Any]]]) -> list[tuple[str, str]]:
    """Post ``(conversation name, body)`` pairs through the proxy; returns ``(name, session)`` per request."""

    async def scenario() -> list[tuple[str, str]]:
        out = []
        async with proxy() as (client, _state, _fake):
            for name, body in bodies:
                r = await client.post("/v1/messages", json=body, headers=A)
                assert r.status_code == 200, r.text
                out.append((name, r.headers["x-agentcache-session"]))
        return out

    return asyncio.run(scenario())


def _one_session_per_conversation(seen: list[tuple[str, str]]) -> None:
    by_name: dict[str, set[str]] = {}
    for name, sid in seen:
        by_name.setdefault(name, set()).add(sid)
    assert all(len(s) == 1 for s in by_name.values()), by_name
    assert len({next(iter(s)) for s in by_name.values()}) == len(by_name), by_name


def test_two_conversations_with_other_systems_and_identical_turns_stay_apart() -> None:
    bodies = []
    for n in (1, 3, 5, 7):  # interleaved turn by turn
        bodies.append(("a", anthropic_body(conversation(n))))
        bodies.append(("b", {**anthropic_body(conversation(n)), "system": "You are another agent."}))
    _one_session_per_conversation(_post_all(bodies))


def test_a_new_conversation_equal_to_an_older_sessions_last_request_is_new() -> None:
    seen = _post_all([("a", anthropic_body(conversation(1))), ("b", anthropic_body(conversation(1)))])
    _one_session_per_conversation(seen)


def test_the_same_task_run_twice_is_two_sessions_throughout() -> None:
    run = [anthropic_body(conversation(n)) for n in (1, 3, 5, 7)]
    _one_session_per_conversation(_post_all([("first", b) for b in run] + [("second", b) for b in run]))


def test_reordered_tools_and_a_changed_date_still_find_their_session() -> None:
    body = anthropic_body(conversation(3))
    later = anthropic_body(conversation(5))
    later["tools"] = list(reversed(later["tools"]))
    later["system"] = later["system"] + "\nToday is 2026-12-02."
    seen = _post_all([("a", body), ("a", later)])
    _one_session_per_conversation(seen)


def test_claude_code_2_1_332_one_session_per_conversation_and_its_system_message_repaired() -> None:
    """2.1.332's ``role: "system"`` message carries ``output_config`` and is a marked one-block list on the first
    request, a string afterwards: one session still (the lineage's main one), the subagent its own and linked,
    the title a side session; the later string is re-sent as the list it was (the ``messages.shape`` repair; the
    Messages API takes blocks on a ``role: "system"`` message: SDK ``MessageParam``, role ``"system"``)."""

    async def scenario() -> None:
        async with proxy() as (client, state, fake):
            await client.post("/v1/messages", json=claude_code_title(), headers=cc_headers())
            main = claude_code_run(prompts=2, steps=2, version="2.1.332")
            sub = claude_code_run(prompts=1, steps=1, variant="subagent", version="2.1.332")
            seen, sent = [], []
            for n, body in enumerate(main):
                r = await client.post("/v1/messages", json=body, headers=cc_headers())
                seen.append(r.headers["x-agentcache-session"])
                sent.append(fake.requests[-1].json())
                if n == 1:
                    for sb in sub:
                        rs = await client.post("/v1/messages", json=sb, headers=cc_headers(agent="a1b2c3d4e5f60718"))
                        assert rs.headers["x-agentcache-session"] == f"{CC_SESSION}/a1b2c3d4e5f60718"
            assert set(seen) == {CC_SESSION}
            assert _signal(state, f"{CC_SESSION}/a1b2c3d4e5f60718") == (CC_SESSION, CC_SESSION)
            first = main[0]["messages"][1]["content"]
            assert isinstance(first, list) and "cache_control" in first[0]
            for body, out in zip(main[1:], sent[1:], strict=True):
                assert isinstance(body["messages"][1]["content"], str)
                forwarded = out["messages"][1]
                assert forwarded["output_config"] == {"effort": "medium"}
                assert forwarded["content"] == [{"type": "text", "text": first[0]["text"]}]  # repaired, unmarked
            doc = state.report.to_dict()
            mine = [b for b in doc["breaks"] if b["session"].endswith(CC_SESSION)]
            assert (mine[0]["request"], mine[0]["cause"], mine[0]["first_divergent"]) == (
                1,
                "messages.shape",
                "messages[1].content",
            )
            assert {b["cause"] for b in mine} == {"messages.shape"}  # (an older prompt too, later)
            assert all(b["repaired"] for b in doc["breaks"])

    asyncio.run(scenario())


def test_aider_chats_sharing_their_opening_stay_apart_and_a_restored_chat_joins_its_own() -> None:
    """aider opens every chat with the same example exchange and sends no session id: two chats are two sessions,
    and a ``--restore-chat-history`` follow-up (the first chat back from markdown, its whitespace rewritten, inserted
    before the files turns) joins the first chat's session, where its rewritten history is a break the client
    caused. No false break at the second chat."""
    answer = "agentcache-fake answer: directive none, 0 tool result(s)."
    first, other = "Say hello.", "Another chat."
    bodies = [
        ("one", aider_chat(first)),
        ("two", aider_chat(other)),
        ("one", aider_chat("And again.", aider_restored(first, answer))),
    ]

    async def scenario() -> list[tuple[str, str]]:
        out = []
        async with proxy(upstream="openai") as (client, state, _fake):
            for name, body in bodies:
                r = await client.post("/v1/chat/completions", json=body, headers={"authorization": "Bearer sk-t"})
                assert r.status_code == 200, r.text
                out.append((name, r.headers["x-agentcache-session"]))
            breaks = state.report.to_dict()["breaks"]
            assert len(breaks) == 1 and breaks[0]["request"] == 1 and breaks[0]["cause"].startswith("messages.")
        return out

    _one_session_per_conversation(asyncio.run(scenario()))


def test_aider_in_anthropic_mode_a_restored_chat_joins_its_own() -> None:
    """In Anthropic mode aider appends its rules to the prompt it sends and restores the prompt alone: the final
    message's first paragraph ties the follow-up to its chat."""
    answer = "agentcache-fake answer: directive none, 0 tool result(s)."
    bodies = [
        ("one", aider_anthropic("Say hello.")),
        ("two", aider_anthropic("Another chat.")),
        ("one", aider_anthropic("And again.", aider_restored("Say hello.", answer))),
    ]
    _one_session_per_conversation(_post_all(bodies))
