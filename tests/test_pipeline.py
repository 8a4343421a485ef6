"""The per-session pipeline on wire bodies: repairs re-send the bytes already sent, markers obey
Anthropic's rules, meaning is never changed, and planning twice changes nothing more."""

from __future__ import annotations

import copy
import json
from typing import Any

from agentcache.adapters import canonicalize
from agentcache.model._canonical import dumps
from agentcache.model._rules import anthropic_rules
from agentcache.session._pipeline import ScopeMemory, SessionPipeline
from agentcache.simulate import markers_valid

from .conftest import CASES


def _case(name: str) -> dict[str, Any]:
    data: dict[str, Any] = json.loads((CASES / f"{name}.json").read_text())
    return data


def _run(name: str, provider: str = "anthropic") -> tuple[list[dict[str, Any]], list[dict[str, Any]]]:
    case = _case(name)
    pipe = SessionPipeline(provider)
    sent = []
    for r in case["requests"]:
        prep = pipe.prepare(case["api"], r["body"])
        pipe.commit(prep)
        sent.append(prep.body)
    return [r["body"] for r in case["requests"]], sent


def _strip(value: Any) -> Any:
    if isinstance(value, dict):
        return {k: _strip(v) for k, v in value.items() if k != "cache_control"}
    if isinstance(value, list):
        return [_strip(v) for v in value]
    return value


def test_reordered_tools_are_sent_in_first_seen_bytes() -> None:
    client, sent = _run("k01-tools-reordered")
    assert client[1]["tools"] != client[0]["tools"]
    for body in sent[1:]:
        assert dumps(_strip(body["tools"])) == dumps(_strip(sent[0]["tools"]))
    # Nothing but tool order and markers differs from what the client sent.
    assert _strip(sent[1]["messages"]) == _strip(client[1]["messages"])
    assert sorted(json.dumps(t, sort_keys=True) for t in _strip(sent[1]["tools"])) == sorted(
        json.dumps(t, sort_keys=True) for t in _strip(client[1]["tools"])
    )


def test_reserialized_schemas_are_sent_in_first_seen_key_order() -> None:
    client, sent = _run("k03-schema-key-order")
    assert dumps(client[1]["tools"][11]) != dumps(client[0]["tools"][11])
    assert dumps(_strip(sent[1]["tools"])) == dumps(_strip(sent[0]["tools"]))
    # Arrays (required, enum) keep their order; values are equal to the client's.
    assert json.dumps(_strip(sent[1]["tools"]), sort_keys=True) == json.dumps(
        _strip(client[1]["tools"]), sort_keys=True
    )


def test_added_tool_goes_after_the_tools_already_sent() -> None:
    client, sent = _run("k02-tool-inserted-mid-list", "openai")
    names0 = [t["function"]["name"] for t in client[0]["tools"]]
    names1 = [t["function"]["name"] for t in sent[1]["tools"]]
    assert len(names1) == 14
    assert names1[:13] == names0
    assert names1[13] not in names0
    assert sent[2]["tools"] == sent[1]["tools"]


def test_random_cache_key_is_pinned_to_the_first() -> None:
    client, sent = _run("k20-random-prompt-cache-key", "openai")
    assert len({b["prompt_cache_key"] for b in client}) == 3
    assert {b["prompt_cache_key"] for b in sent} == {client[0]["prompt_cache_key"]}
    assert [b["messages"] for b in sent] == [b["messages"] for b in client]


def test_five_markers_are_capped_and_valid() -> None:
    client, sent = _run("k08-five-cache-markers")
    rules = anthropic_rules("claude-opus-4-8")
    assert not markers_valid(canonicalize("anthropic.messages", client[2]), rules)
    for body in sent:
        assert markers_valid(canonicalize("anthropic.messages", body), rules)
        assert _strip(body) == _strip(client[sent.index(body)])


def test_detect_only_cases_keep_client_content() -> None:
    for name in (
        "k05-seconds-timestamp-in-system",
        "k15-resume-rewrites-assistant-text",
        "k26-compaction-rewrites-prefix",
    ):
        client, sent = _run(name)
        for c, s in zip(client, sent, strict=True):
            assert _strip(s) == _strip(c), name


def test_string_content_marker_then_restored_shape() -> None:
    # A marker on a string message turns it into a text block; next turn the client sends the string
    # again and the pipeline re-sends the block form it already sent (messages.shape repair).
    case = _case("k18-no-cache-markers")
    bodies = copy.deepcopy([r["body"] for r in case["requests"]])
    for b in bodies:
        for m in b["messages"]:
            if isinstance(m["content"], list) and len(m["content"]) == 1 and m["content"][0]["type"] == "text":
                m["content"] = m["content"][0]["text"]
    pipe = SessionPipeline("anthropic")
    first = pipe.prepare("anthropic.messages", bodies[0])
    pipe.commit(first)
    second = pipe.prepare("anthropic.messages", bodies[1])
    last0 = len(bodies[0]["messages"]) - 1
    assert isinstance(first.body["messages"][last0]["content"], list)
    assert second.body["messages"][last0]["content"][0]["text"] == bodies[1]["messages"][last0]["content"]
    if "messages.shape" in second.repairs:
        assert not second.divergence or not second.divergence.is_break


def test_planning_twice_changes_nothing_more() -> None:
    case = _case("k10-frozen-markers-long-tail")
    pipe = SessionPipeline("anthropic")
    for r in case["requests"]:
        prep = pipe.prepare("anthropic.messages", r["body"])
        again = SessionPipeline("anthropic", scope=ScopeMemory())
        again.state = pipe.state
        twice = again.prepare("anthropic.messages", prep.body)
        assert twice.body == prep.body
        pipe.commit(prep)


def test_the_clients_divergence_is_diagnosed_when_read_and_breaks_agrees_with_it() -> None:
    from agentcache.analysis._diagnose import diagnose

    pairs = 0
    for path in sorted(CASES.glob("*.json")):
        case = json.loads(path.read_text())
        pipe = SessionPipeline("anthropic" if case["api"] == "anthropic.messages" else "openai")
        for r in case["requests"]:
            prep = pipe.prepare(case["api"], r["body"])
            pipe.commit(prep)
            if prep.diverged is None:
                continue
            # Nothing before the upstream call asked for the classification: the plan needs only breaks().
            assert prep.diverged._done is None
            d = prep.divergence
            assert d == diagnose(prep.diverged.prev, prep.client) and prep.divergence is d
            assert prep.diverged.breaks() == (d is not None and (d.cause is not None or d.ephemeral > 0))
            pairs += 1
    assert pairs > 20
