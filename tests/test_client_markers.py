"""Client markers outrank restored ones (issue 11, item 1) and ``role: "system"`` messages keep their string
shape (item 6): a Claude-Code-shaped run through :class:`~agentcache.Sessions` and through the proxy."""

from __future__ import annotations

import asyncio
import json

from agentcache import Sessions
from agentcache.model._rawjson import loads
from agentcache.session import Identity
from tests.client_shapes import cc_headers, check_sent, claude_code_run, client_markers
from tests.test_proxy_support import proxy


def test_claude_code_markers_survive_every_turn_through_sessions() -> None:
    bodies = claude_code_run(prompts=4, steps=2)
    assert len(bodies) == 12
    sessions = Sessions(provider="anthropic")
    repaired = []
    for n, body in enumerate(bodies):
        doc, raw = loads(json.dumps(body).encode())
        turn = sessions.begin("anthropic.messages", doc, raw=raw, identity=Identity(session="cc"), now=10.0 * n)
        check_sent(body, turn.body)
        assert {"system[1]", "system[2]"} <= client_markers(turn.body)
        repaired += [c.value for c in turn.prepared.repairs]
        turn.commit()
        turn.succeed()
    # Older prompts came back as strings and were re-sent as the marked lists they were (a real repair), yet
    # the client's own markers kept their places on every turn.
    assert repaired.count("messages.shape") == 3


def test_claude_code_markers_survive_every_turn_through_the_proxy() -> None:
    async def scenario() -> None:
        async with proxy() as (client, state, fake):
            for body in claude_code_run(prompts=4, steps=2):
                r = await client.post("/v1/messages", json=body, headers=cc_headers())
                assert r.status_code == 200, r.text
                sent = fake.requests[-1].json()
                check_sent(body, sent)
                assert sent["messages"][1] == {"role": "system", "content": "The working directory is /tmp/work."}
            assert {r.headers.get("x-claude-code-session-id") for r in fake.requests} == {
                cc_headers()["x-claude-code-session-id"]
            }
            assert [b["cause"] for b in state.report.to_dict()["breaks"] if not b.get("repaired")] == []

    asyncio.run(scenario())


def test_a_trailing_system_message_is_never_marked() -> None:
    body = claude_code_run(prompts=1, steps=1)[1]
    body["messages"].append({"role": "system", "content": "Reminder: stay on task."})
    sessions = Sessions(provider="anthropic")
    turn = sessions.begin("anthropic.messages", body, identity=Identity(session="s"))
    assert turn.body["messages"][-1] == {"role": "system", "content": "Reminder: stay on task."}
    check_sent(body, turn.body)


def test_client_markers_outrank_agentcaches_own_read_and_rewrite_markers() -> None:
    from agentcache.adapters import canonicalize
    from agentcache.model._rules import anthropic_rules
    from agentcache.policies import PlanHints, plan_breakpoints

    before = claude_code_run(prompts=1, steps=1)[1]
    after = json.loads(json.dumps(before))
    msgs = after["messages"]
    msgs[-1]["content"][-1].pop("cache_control")
    fan = [{"type": "tool_use", "id": f"t{i}", "name": "x", "input": {"i": i}} for i in range(12)]
    msgs.append({"role": "assistant", "content": fan})
    results = [{"type": "tool_result", "tool_use_id": f"t{i}", "content": f"r{i}"} for i in range(12)]
    results[-1]["cache_control"] = {"type": "ephemeral"}
    msgs.append({"role": "user", "content": results})
    prev = canonicalize("anthropic.messages", before)
    req = canonicalize("anthropic.messages", after)
    plan = plan_breakpoints(req, prev, anthropic_rules("claude-opus-4-8"), PlanHints(rewrite_at=2))
    kept = {req.blocks[i].path for i in plan.markers}
    assert client_markers(after) <= kept  # read and rewrite would each have taken a slot before the client's
    # the client's tail marker is the tail; the read marker reaches back over the fan-out (issue 23: the client's
    # markers first, agentcache's in the free slots)
    assert len(plan.markers) == 4 and set(plan.reasons.values()) == {"read", "client"}
