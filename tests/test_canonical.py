"""Canonical model: prefix order, markers stripped from identity, chained hashes, token memo."""

from __future__ import annotations

import copy
import json

from agentcache import diagnose
from agentcache.adapters import canonicalize
from agentcache.model._canonical import common_prefix, value_digest
from agentcache.model._tokens import TokenCounter, default_counter
from agentcache.model._volatile import volatile_diff

from .conftest import CASES, anthropic_messages, anthropic_tools, policy


def _body(n: int = 3) -> dict[str, object]:
    return {
        "model": "claude-opus-4-8",
        "max_tokens": 100,
        "system": [{"type": "text", "text": policy()}],
        "tools": anthropic_tools(),
        "tool_choice": {"type": "auto"},
        "messages": anthropic_messages(n),
    }


def test_prefix_order_and_paths() -> None:
    c = canonicalize("anthropic.messages", _body())
    paths = [b.path for b in c.blocks]
    assert paths[0] == "model"
    assert paths[1:15] == [f"tools[{i}]" for i in range(14)]
    assert paths[15:18] == ["system[0]", "tool_choice", "messages[0].content[0]"]
    assert [b.section for b in c.blocks[15:18]] == ["system", "option", "message"]
    assert c.tokens == sum(b.tokens for b in c.blocks) > 3000


def test_markers_do_not_change_identity() -> None:
    a = _body()
    b = copy.deepcopy(a)
    b["system"][0]["cache_control"] = {"type": "ephemeral"}  # type: ignore[index]
    ca, cb = canonicalize("anthropic.messages", a), canonicalize("anthropic.messages", b)
    assert ca.chain == cb.chain
    assert [i for i, _ in cb.markers()] == [15]
    assert diagnose(ca, cb).cause is None


def test_chain_detects_any_byte_change_and_common_prefix() -> None:
    a = _body(5)
    b = copy.deepcopy(a)
    b["messages"][3]["content"][0]["text"] += "!"  # type: ignore[index]
    ca, cb = canonicalize("anthropic.messages", a), canonicalize("anthropic.messages", b)
    n = common_prefix(ca, cb)
    assert ca.blocks[n].path == "messages[3].content[0]"
    assert ca.chain[:n] == cb.chain[:n] and ca.chain[n] != cb.chain[n]


def test_value_digest_ignores_key_order_and_argument_spacing() -> None:
    t1 = {"type": "function", "function": {"name": "f", "arguments": '{"a":1,"b":[1,2]}'}, "id": "x"}
    t2 = {"id": "x", "function": {"arguments": '{"b": [1, 2], "a": 1}', "name": "f"}, "type": "function"}
    m = [{"role": "user", "content": "hi"}]
    b1 = {"model": "gpt-4o", "messages": [*m, {"role": "assistant", "content": None, "tool_calls": [t1]}]}
    b2 = {"model": "gpt-4o", "messages": [*m, {"role": "assistant", "content": None, "tool_calls": [t2]}]}
    c1, c2 = canonicalize("openai.chat", b1), canonicalize("openai.chat", b2)
    assert c1.blocks[-1].digest != c2.blocks[-1].digest
    assert value_digest(c1.blocks[-1]) == value_digest(c2.blocks[-1])


def test_responses_api_blocks() -> None:
    body = {
        "model": "gpt-4.1",
        "instructions": policy(),
        "tools": [{"type": "function", "name": "f", "parameters": {"type": "object"}}],
        "input": [
            {"role": "user", "content": [{"type": "input_text", "text": "hello"}]},
            {"type": "function_call", "call_id": "c1", "name": "f", "arguments": "{}"},
            {"type": "function_call_output", "call_id": "c1", "output": "ok"},
        ],
        "prompt_cache_key": "k",
    }
    c = canonicalize("openai.responses", body)
    assert [b.path for b in c.blocks] == [
        "model",
        "tools[0]",
        "instructions",
        "input[0].content[0]",
        "input[1]",
        "input[2]",
    ]
    assert c.cache_key == "k"


def test_token_memo_only_counts_new_blocks() -> None:
    counter = TokenCounter()
    canonicalize("anthropic.messages", _body(3), counter=counter)
    before = counter.memo_len()
    canonicalize("anthropic.messages", _body(5), counter=counter)
    assert counter.memo_len() - before == 2
    assert counter.exact  # tiktoken o200k_base loaded offline from the bundled file


def test_o200k_counts_match_tiktoken_reference() -> None:
    # "hello world" is 2 tokens in o200k_base.
    assert default_counter().count_text("hello world") == 2


def test_volatile_spans() -> None:
    span = volatile_diff("at 2024-05-15 15:00:03 EST", "at 2024-05-15 15:00:25 EST")
    assert span is not None and span.text == "2024-05-15 15:00:25"
    assert volatile_diff("You must refuse.", "You may accept.") is None
    assert volatile_diff("tmp /tmp/tmpa1b2c3/x", "tmp /tmp/tmpzz9y8x/x") is not None


def test_every_case_body_canonicalizes() -> None:
    for path in CASES.glob("*.json"):
        case = json.loads(path.read_text())
        for r in case["requests"]:
            c = canonicalize(case["api"], r["body"])
            assert c.tokens > 3000


def test_block_cache_rebuilds_only_new_messages() -> None:
    from agentcache.model._build import BlockCache

    cache = BlockCache()
    first = canonicalize("anthropic.messages", _body(5), cache=cache)
    misses = cache.misses
    body = _body(7)
    second = canonicalize("anthropic.messages", body, cache=cache)
    assert cache.misses - misses == 2  # the two new messages; tools, system and 5 messages re-used
    # Same result as without a cache, and an in-place edit is never served stale.
    assert second.chain == canonicalize("anthropic.messages", body).chain
    body["messages"][1]["content"][0]["text"] += " (edited)"  # type: ignore[index]
    cache.begin()
    third = canonicalize("anthropic.messages", body, cache=cache)
    assert third.chain == canonicalize("anthropic.messages", body).chain != second.chain
    assert first.chain == second.chain[: len(first.chain)]
