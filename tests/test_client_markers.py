"""Client markers outrank restored ones (issue 11, item 1) and ``role: "system"`` messages keep their string
shape (item 6): a Claude-Code-shaped run through :class:`~agentcache.Sessions` and through the proxy."""

from __future__ import annotations

import asyncio
import copy
import json
from typing import Any

from agentcache import Sessions
from agentcache.adapters import canonicalize
from agentcache.model._canonical import with_markers
from agentcache.model._rawjson import loads
from agentcache.model._rules import anthropic_rules
from agentcache.policies import PlanHints, plan_breakpoints
from agentcache.session import Identity
from agentcache.simulate._anthropic import markers_valid
from tests.client_shapes import cc_headers, check_sent, claude_code_run, client_markers
from tests.clients.harness import markers
from tests.conftest import CASES, anthropic_tools, policy
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


def _qwen_1h(prompts: int) -> list[dict[str, Any]]:
    """Qwen Code's Anthropic requests with ``cacheRetention: "1h"`` and ``forceGlobalCacheScope``: its four markers
    on the last tool and the static system block (1h, global scope), the rest of the system and the newest user
    block (1h)."""
    one_h, scoped = {"type": "ephemeral", "ttl": "1h"}, {"type": "ephemeral", "scope": "global", "ttl": "1h"}
    tools = [dict(t) for t in anthropic_tools()]
    tools[-1]["cache_control"] = dict(scoped)
    system = [
        {"type": "text", "text": policy(), "cache_control": dict(scoped)},
        {"type": "text", "text": "Working directory: /tmp/work.", "cache_control": dict(one_h)},
    ]
    bodies, messages = [], []
    for p in range(prompts):
        messages = [*copy.deepcopy(messages), {"role": "user", "content": [{"type": "text", "text": f"Task {p}."}]}]
        for m in messages:
            for b in m["content"]:
                b.pop("cache_control", None)
        messages[-1]["content"][-1]["cache_control"] = dict(one_h)
        bodies.append({"model": "claude-sonnet-4-5", "max_tokens": 64, "tools": tools, "system": system,
                       "messages": copy.deepcopy(messages)})  # fmt: skip
        messages.append({"role": "assistant", "content": [{"type": "text", "text": f"Done {p}."}]})
    return bodies


def test_a_clients_markers_go_out_by_value_ttl_and_scope_included() -> None:
    """Issue 23: agentcache's tail took the client's last-block slot and sent its 1h marker as 5m (14/14 requests
    of Qwen Code with cacheRetention 1h). Markers in = markers out, by value; four client markers leave no slot."""
    sessions = Sessions(provider="anthropic")
    for n, body in enumerate(_qwen_1h(3)):
        turn = sessions.begin("anthropic.messages", body, identity=Identity(session="q"), now=20.0 * n)
        assert markers(turn.body) == markers(body)
        turn.commit()
        turn.succeed()


def _plan_for(system0: dict[str, Any] | None, tail: dict[str, Any] | None) -> dict[str, tuple[str, Any, str]]:
    """Markers planned (TTL policy 1h) for a Qwen-shaped request whose client marks only ``system[0]`` and the tail
    with the given markers: block path -> (ttl, wire value, reason)."""
    body = _qwen_1h(2)[1]
    body["tools"][-1].pop("cache_control")
    body["system"][1].pop("cache_control")
    for unit, marker in ((body["system"][0], system0), (body["messages"][-1]["content"][-1], tail)):
        unit.pop("cache_control")
        if marker is not None:
            unit["cache_control"] = marker
    req = canonicalize("anthropic.messages", body)
    plan = plan_breakpoints(req, None, anthropic_rules("claude-sonnet-4-5"), PlanHints(ttl="1h"))
    assert markers_valid(with_markers(req, plan.markers), anthropic_rules("claude-sonnet-4-5"))
    return {req.blocks[i].path: (m.ttl, m.raw, plan.reasons[i]) for i, m in plan.markers.items()}


def test_agentcaches_own_markers_take_free_slots_and_keep_the_ttl_order() -> None:
    """agentcache's own markers take the TTL policy's choice (1h here), lowered to 5m after a 5m marker of the
    client's and raised to 1h before a 1h one; the client's markers go out as sent."""
    scoped_1h = {"type": "ephemeral", "scope": "global", "ttl": "1h"}
    plan = _plan_for(scoped_1h, {"type": "ephemeral"})  # the client: 1h on the system, 5m on the tail
    assert plan["system[0]"] == ("1h", scoped_1h, "client") and plan["messages[2].content[0]"][1:] == (
        {"type": "ephemeral"},
        "client",
    )
    own = {p: ttl for p, (ttl, raw, why) in plan.items() if why != "client"}
    assert own == {"tools[13]": "1h", "system[1]": "1h"}  # both before the client's 5m tail, after its 1h
    scoped_5m = {"type": "ephemeral", "scope": "global"}
    plan = _plan_for(scoped_5m, None)  # the client: 5m on the system only
    assert plan["system[0]"] == ("5m", scoped_5m, "client")
    own = {p: ttl for p, (ttl, raw, why) in plan.items() if why != "client"}
    assert own["tools[13]"] == "1h" and own["messages[2].content[0]"] == "5m" and own["system[1]"] == "5m"


def test_a_clients_own_5m_before_its_1h_is_raised_its_scope_kept() -> None:
    """The API refuses a 5m marker before a 1h one (markers.invalid): the one change to a client's marker."""
    plan = _plan_for({"type": "ephemeral", "scope": "global"}, {"type": "ephemeral", "ttl": "1h"})
    assert plan["system[0]"] == ("1h", {"type": "ephemeral", "scope": "global", "ttl": "1h"}, "client")
    assert plan["messages[2].content[0]"] == ("1h", {"type": "ephemeral", "ttl": "1h"}, "client")


def test_the_ephemeral_status_block_keeps_its_marker_and_the_entry_before_it_is_read() -> None:
    """anthropics/claude-code#96101 through the proxy (case ephemeral-trailing-status-block): the client's status
    block and its marker go out untouched; agentcache marks the block before it, whose entry the next request
    reads (the client's own marker's entry is never read: markers.invalid in the client's traffic)."""
    case = json.loads((CASES / "ephemeral-trailing-status-block.json").read_text())

    async def scenario() -> None:
        async with proxy() as (client, state, fake):
            for r in case["requests"]:
                resp = await client.post("/v1/messages", json=r["body"], headers={"x-agentcache-session": "eph"})
                assert resp.status_code == 200, resp.text
                sent, body = fake.requests[-1].json(), r["body"]
                last = len(sent["messages"]) - 1
                assert sent["messages"][last] == {
                    **body["messages"][last],
                    "content": [*sent["messages"][last]["content"][:-1], body["messages"][last]["content"][-1]],
                }
                assert markers(sent).items() >= markers(body).items()
                assert f"messages[{last}].content[0]" in markers(sent)  # the block the next request resends
            doc = state.report.to_dict()
            as_sent = [m for m in doc["misses"] if m["arm"] == "as_sent"]
            assert [(m["request"], m["cause"]) for m in as_sent] == [(1, "markers.invalid"), (2, "markers.invalid")]
            assert [m for m in doc["misses"] if m["arm"] == "agentcache"] == [] and doc["breaks"] == []
            totals = doc["totals"]
            assert totals["agentcache"]["cache_read_tokens"] > totals["as_sent"]["cache_read_tokens"]

    asyncio.run(scenario())
