"""One core behind every door: the same recorded conversations sent through ``wrap()`` (real SDK clients against a
fake HTTP upstream), through the proxy (in-process, fake upstream) and audited give identical upstream bodies
(``prompt_cache_key`` values aside) and identical per-turn reports (session, generation, cause, repairs,
markers), for Anthropic rules, OpenAI rules and a local engine.

Conversations: real tau-bench sessions with the tool list reshuffled on every turn (as OpenAI Chat bodies, and
converted to Anthropic Messages); a Claude-Code-shaped Anthropic conversation whose client marks two system
blocks and its newest prompt and resends older prompts as strings; the tau-bench sessions in front of a local
llama.cpp engine (detected by ``wrap()`` from the engine's ``/v1/models``, declared to the proxy and the audit).
"""

from __future__ import annotations

import asyncio
import copy
import json
import random
from typing import Any

import pytest

pytest.importorskip("anthropic")
pytest.importorskip("openai")
pytest.importorskip("starlette")

from agentcache import Sessions, audit, wrap
from agentcache._log import capture_logs
from agentcache.adapters import canonicalize
from agentcache.loaders import Record, load
from agentcache.replay import convert

from .conftest import DATA
from .test_proxy_support import FakeUpstream as ProxyUpstream
from .test_proxy_support import proxy
from .test_wrap_upstream import FakeUpstream, anthropic_client, openai_client

SESSIONS, TURNS = 2, 5
Turn = tuple[str, int, str | None, tuple[str, ...], tuple[str, ...]]


def _shuffled(body: dict[str, Any], seed: int) -> dict[str, Any]:
    body = copy.deepcopy(body)
    random.Random(seed).shuffle(body["tools"])
    return body


def tau_records(api: str) -> list[Record]:
    """The first turns of two tau-bench sessions, tools reshuffled per turn, in ``api``'s wire format."""
    recs = load(DATA / "tau-bench" / "gpt-4o-airline.json").records
    out: list[Record] = []
    for name in list(dict.fromkeys(r.session for r in recs))[:SESSIONS]:
        mine = [r for r in recs if r.session == name][:TURNS]
        for i, r in enumerate(mine):
            body = _shuffled(r.body, 1000 * len(out) + i)
            if api == "anthropic.messages":
                body = convert("openai.chat", body, api)
                body.setdefault("max_tokens", 64)
                body.pop("temperature", None)  # not a parameter of the anthropic SDK's messages.create any more
            out.append(Record(name, api, body, index=len(out)))
    return out


def claude_code_records() -> list[Record]:
    """A Claude-Code-shaped conversation: marked system blocks, the newest prompt marked, older ones as strings."""
    from .conftest import anthropic_tools, policy

    system = [
        {"type": "text", "text": "x-billing-header: cc_version=2.1"},
        {"type": "text", "text": "You are Claude Code. " + policy(), "cache_control": {"type": "ephemeral"}},
        {"type": "text", "text": "Project notes. " + policy()[::-1], "cache_control": {"type": "ephemeral"}},
    ]
    out: list[Record] = []
    messages: list[dict[str, Any]] = []
    for turn in range(TURNS):
        for m in messages:  # older prompts go back as plain strings
            if m["role"] == "user" and isinstance(m["content"], list):
                m["content"] = m["content"][0]["text"]
        prompt = {
            "type": "text",
            "text": f"Step {turn}: check reservation {turn}.",
            "cache_control": {"type": "ephemeral"},
        }
        messages.append({"role": "user", "content": [prompt]})
        body = {"model": "claude-sonnet-4-6", "max_tokens": 64, "system": system, "tools": anthropic_tools()}
        out.append(Record("cc", "anthropic.messages", {**copy.deepcopy(body), "messages": copy.deepcopy(messages)}))
        messages.append({"role": "assistant", "content": [{"type": "text", "text": f"Done with step {turn}."}]})
    return out


def _key_aside(body: dict[str, Any]) -> str:
    if "prompt_cache_key" in body:
        body = {**body, "prompt_cache_key": "<key>"}
    return json.dumps(body, sort_keys=True)


def via_wrap(records: list[Record], engine: bool) -> tuple[list[dict[str, Any]], list[Turn]]:
    upstream = FakeUpstream(engine="llamacpp" if engine else None)
    try:
        sessions = Sessions()
        reports: list[Turn] = []
        clients: dict[str, Any] = {}
        for r in records:
            if r.session not in clients:
                sdk = anthropic_client(upstream) if r.api == "anthropic.messages" else openai_client(upstream)
                clients[r.session] = wrap(sdk, session=sessions.session(r.session))
            client = clients[r.session]
            if r.api == "anthropic.messages":
                client.messages.create(**copy.deepcopy(r.body))
            else:
                client.chat.completions.create(**copy.deepcopy(r.body))
            rep = client.agentcache_session.last_report
            sig = rep.session_signal
            reports.append((sig.session_id, sig.generation, rep.reuse_boundary.cause, rep.repairs, rep.markers))
        return [s.body for s in upstream.seen], reports
    finally:
        upstream.close()


def via_proxy(records: list[Record], upstream: str, engine: str = "none") -> tuple[list[dict[str, Any]], list[Turn]]:
    async def run() -> tuple[list[dict[str, Any]], list[Turn]]:
        fake = ProxyUpstream()
        async with proxy(fake, upstream=upstream, engine=engine) as (client, _state, _):
            with capture_logs() as logs:
                for r in records:
                    path = "/v1/messages" if r.api == "anthropic.messages" else "/v1/chat/completions"
                    headers = {"x-api-key": "k", "x-agentcache-session": r.session}
                    resp = await client.post(path, json=r.body, headers=headers)
                    assert resp.status_code == 200
        lines = [e for e in logs if e["event"] == "proxy.request"]
        reports: list[Turn] = [
            (
                e["session_signal"]["session_id"],
                e["session_signal"]["generation"],
                e["reuse_boundary"]["cause"],
                tuple(e["repairs"]),
                tuple(e["markers"]),
            )
            for e in lines
        ]
        # the forwarded requests (in front of llama.cpp the live report's engine arm also posts /apply-template)
        bodies = [s.json() for s in fake.requests if s.method == "POST" and s.path.startswith("/v1/")]
        return bodies, reports

    return asyncio.run(run())


def via_audit(records: list[Record], provider: str) -> tuple[list[dict[str, Any]], list[Turn]]:
    report = audit(records, provider=provider)
    assert not report.errors
    by_session: dict[str, list[Any]] = {}
    for t in report.turns:
        by_session.setdefault(t.session, []).append(t)
    order: list[Any] = []
    seen: dict[str, int] = {}
    for r in records:  # back to the order the records were sent in
        i = seen.get(r.session, 0)
        seen[r.session] = i + 1
        order.append(by_session[r.session][i])
    reports: list[Turn] = []
    for t in order:
        d = t.prepared.divergence
        reports.append((t.session, 0, d.cause if d is not None else None, t.prepared.repairs, t.prepared.markers))
    return [t.prepared.body for t in order], reports


def _same(records: list[Record], doors: dict[str, tuple[list[dict[str, Any]], list[Turn]]]) -> None:
    names = list(doors)
    for i, r in enumerate(records):
        bodies = {n: doors[n][0][i] for n in names}
        texts = {n: _key_aside(b) for n, b in bodies.items()}
        assert len(set(texts.values())) == 1, f"request {i} differs by door"
        chains = {n: canonicalize(r.api, b).chain for n, b in bodies.items()}
        assert len(set(chains.values())) == 1, f"request {i}: prefix identity differs by door"
        assert len({("prompt_cache_key" in b) for b in bodies.values()}) == 1
        turns = {n: doors[n][1][i] for n in names}
        assert len(set(turns.values())) == 1, f"request {i}: {turns}"


def test_anthropic_rules_tau_bench_with_reshuffled_tools() -> None:
    records = tau_records("anthropic.messages")
    doors = {
        "wrap": via_wrap(records, engine=False),
        "proxy": via_proxy(records, "anthropic"),
        "audit": via_audit(records, "anthropic"),
    }
    _same(records, doors)
    turns = doors["audit"][1]
    assert {c for _, _, c, _, _ in turns} >= {"tools.reordered"} and any("tools.reordered" in r for *_, r, _ in turns)
    assert all(m for *_, m in turns)  # Anthropic rules: every request carries markers


def test_anthropic_rules_client_markers() -> None:
    records = claude_code_records()
    doors = {
        "wrap": via_wrap(records, engine=False),
        "proxy": via_proxy(records, "anthropic"),
        "audit": via_audit(records, "anthropic"),
    }
    _same(records, doors)
    for body in doors["proxy"][0]:  # the client's own markers on its system blocks survive every turn
        assert [("cache_control" in b) for b in body["system"]] == [False, True, True]


def test_openai_rules_tau_bench_with_reshuffled_tools() -> None:
    records = tau_records("openai.chat")
    doors = {
        "wrap": via_wrap(records, engine=False),
        "proxy": via_proxy(records, "openai"),
        "audit": via_audit(records, "openai"),
    }
    _same(records, doors)
    assert all("prompt_cache_key" in b for b in doors["wrap"][0])


def test_a_local_engine_gets_repairs_only() -> None:
    records = tau_records("openai.chat")
    doors = {
        "wrap": via_wrap(records, engine=True),  # detected from the engine's /v1/models
        "proxy": via_proxy(records, "http://127.0.0.1:8080", engine="llama.cpp"),
        "audit": via_audit(records, "engine"),
    }
    _same(records, doors)
    for body, r in zip(doors["proxy"][0], records, strict=True):
        assert "prompt_cache_key" not in body and "cache_control" not in json.dumps(body)
        assert sorted(json.dumps(t) for t in body["tools"]) == sorted(json.dumps(t) for t in r.body["tools"])
    assert any("tools.reordered" in rep for *_, rep, _ in doors["audit"][1])
