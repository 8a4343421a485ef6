"""Canonical model: prefix order, markers stripped from identity, chained hashes, token memo."""

from __future__ import annotations

import copy
import json

import pytest

from agentcache import diagnose
from agentcache.adapters import canonicalize
from agentcache.model._canonical import common_prefix
from agentcache.model._equivalence import value_digest
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
    assert value_digest(c1.blocks[-1], c1.api) == value_digest(c2.blocks[-1], c2.api)


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


def test_a_new_conversation_reuses_the_tools_and_system_another_built() -> None:
    from agentcache._exceptions import InputError
    from agentcache.model._build import BlockCache
    from agentcache.model._rawjson import loads

    def build(body: dict[str, object], counter: TokenCounter | None = None) -> tuple[object, ...]:
        value, raw = loads(json.dumps(body).encode())
        cache = BlockCache()
        cache.begin(raw)
        req = canonicalize("anthropic.messages", value, counter=counter, cache=cache)
        assert req.chain == canonicalize("anthropic.messages", value, counter=counter).chain
        return req.head

    one, other = _body(3), _body(5)
    other["messages"] = anthropic_messages(5, run=1)
    first, second = build(one), build(other)
    assert all(a is b for a, b in zip(first, second, strict=True) if a.section != "option")  # type: ignore[attr-defined]
    # Blocks are a function of the token counter too: another counter's are its own.
    third = build(other, TokenCounter(memo_size=10))
    assert not any(a is b for a, b in zip(first, third, strict=True))
    # A tool that repeats a key is refused in every conversation (only checked units are kept).
    bad = _body(3)
    bad["tools"] = [{"name": "t", "name ": "x", "input_schema": {"type": "object", "type ": "object"}}]
    text = json.dumps(bad).replace('"name ": "x"', '"name": "x"')
    for _ in range(2):
        value, raw = loads(text.encode())
        cache = BlockCache()
        cache.begin(raw)
        with pytest.raises(InputError):
            canonicalize("anthropic.messages", value, cache=cache)


# ---- markers only where the APIs define them (issue 12) ------------------------------------------------------


def test_marker_positions_per_api() -> None:
    from agentcache.model._canonical import marker_at

    anthropic = ("tools[0]", "system[2]", "messages[3].content[0]")
    for path in anthropic:
        assert marker_at("anthropic.messages", path) == "cache_control"
    assert marker_at("openai.chat", "messages[3].content[1]") == "prompt_cache_breakpoint"
    assert marker_at("openai.responses", "input[4].content[0]") == "prompt_cache_breakpoint"
    # Nowhere else: not on a whole message, a string content, a tool call, an OpenAI tool or a Responses item.
    for api, path in [
        ("anthropic.messages", "messages[3].content"),
        ("anthropic.messages", "messages[3]"),
        ("openai.chat", "tools[0]"),
        ("openai.chat", "messages[1].tool_calls[0]"),
        ("openai.chat", "messages[1].content"),
        ("openai.responses", "input[2]"),
        ("openai.responses", "tools[0]"),
        ("openai.responses", "instructions"),
    ]:
        assert marker_at(api, path) is None, (api, path)


def _block(api: str, body: dict[str, object], path: str) -> object:
    return next(b for b in canonicalize(api, body).blocks if b.path == path)


def test_markers_read_at_each_position_kind_and_content_elsewhere() -> None:
    mark = {"type": "ephemeral", "ttl": "1h"}
    schema = {"type": "object", "properties": {"cache_control": {"type": "string"}}}
    body = {
        "model": "claude-sonnet-4-5",
        "tools": [{"name": "t", "input_schema": schema, "cache_control": mark}],
        "system": [{"type": "text", "text": "sys", "cache_control": mark}],
        "messages": [
            {"role": "user", "content": [{"type": "text", "text": "q", "cache_control": mark}]},
            {"role": "assistant", "content": [{"type": "tool_use", "id": "u", "name": "t",
                                               "input": {"cache_control": "max-age=0"}}]},
            {"role": "user", "content": [{"type": "tool_result", "tool_use_id": "u", "cache_control": mark,
                                          "content": [{"type": "text", "text": "r", "cache_control": mark}]}]},
        ],
    }  # fmt: skip
    for path in ("tools[0]", "system[0]", "messages[0].content[0]", "messages[2].content[0]"):
        b = _block("anthropic.messages", body, path)
        assert b.marker is not None and b.marker.ttl == "1h", path  # type: ignore[attr-defined]
    tool = _block("anthropic.messages", body, "tools[0]")
    assert json.loads(tool.data)["input_schema"] == schema  # type: ignore[attr-defined]  # a property, kept
    use = _block("anthropic.messages", body, "messages[1].content[0]")
    assert use.marker is None and json.loads(use.data)["input"] == {"cache_control": "max-age=0"}  # type: ignore[attr-defined]
    result = json.loads(_block("anthropic.messages", body, "messages[2].content[0]").data)  # type: ignore[attr-defined]
    assert "cache_control" not in result and result["content"][0]["cache_control"] == mark  # nested: in its bytes
    # The other API's marker name is content.
    chat = {"model": "gpt-5.6", "messages": [{"role": "user", "content": [
        {"type": "text", "text": "a", "prompt_cache_breakpoint": {"mode": "explicit"}},
        {"type": "text", "text": "b", "cache_control": mark}]}]}  # fmt: skip
    first, second = (_block("openai.chat", chat, f"messages[0].content[{j}]") for j in (0, 1))
    assert first.marker is not None and "prompt_cache_breakpoint" not in json.loads(first.data)  # type: ignore[attr-defined]
    assert second.marker is None and json.loads(second.data)["cache_control"] == mark  # type: ignore[attr-defined]
    resp = {"model": "gpt-5.6", "input": [
        {"role": "user", "content": [{"type": "input_text", "text": "a", "prompt_cache_breakpoint": {}}]},
        {"type": "function_call_output", "call_id": "c", "output": "x", "prompt_cache_breakpoint": {}}]}  # fmt: skip
    assert "prompt_cache_breakpoint" not in json.loads(_block("openai.responses", resp, "input[0].content[0]").data)  # type: ignore[attr-defined]
    assert "prompt_cache_breakpoint" in json.loads(_block("openai.responses", resp, "input[1]").data)  # type: ignore[attr-defined]


def test_marker_named_keys_in_content_are_meaning() -> None:
    def tool(props: dict[str, object]) -> dict[str, object]:
        return {"model": "m", "tools": [{"name": "t", "input_schema": {"type": "object", "properties": props}}],
                "messages": []}  # fmt: skip

    a = _block("anthropic.messages", tool({"q": {"type": "string"}}), "tools[0]")
    b = _block("anthropic.messages", tool({"q": {"type": "string"}, "cache_control": {"type": "string"}}), "tools[0]")
    assert value_digest(a, "anthropic.messages") != value_digest(b, "anthropic.messages")  # type: ignore[arg-type]


def test_numbers_by_exact_value() -> None:
    from agentcache.model._rawjson import loads

    def block(num: str) -> object:
        body, _ = loads(b'{"model":"m","messages":[{"role":"user","content":[{"type":"text","text":"x","n":%s}]}]}'
                        % num.encode())  # fmt: skip
        return _block("anthropic.messages", body, "messages[0].content[0]")

    def same(a: str, b: str) -> bool:
        return value_digest(block(a), "anthropic.messages") == value_digest(block(b), "anthropic.messages")  # type: ignore[arg-type]

    assert same("1E2", "100.0") and same("1e-7", "1e-07") and same("0.10", "0.1")
    assert not same("1e309", "1e400") and not same("1.5e-400", "0.0") and not same("-0", "0")
    assert not same("100", "100.0") and not same("1.0000000000000000000001", "1.0")
    assert b'"n":1e309' in block("1e309").data  # type: ignore[attr-defined]  # the unit's bytes keep the spelling


def _anthropic(messages: list[dict[str, object]], tools: list[dict[str, object]]) -> dict[str, object]:
    return {"model": "claude-sonnet-4-5", "max_tokens": 64, "system": "s", "tools": tools, "messages": messages}


def test_schema_property_named_cache_control_not_repaired_across_sessions() -> None:
    """Issue 12's first observed failure: a tool whose schema gains a property ``cache_control`` was re-sent as
    another session's tool (same scope) without it."""
    from agentcache.session._pipeline import ScopeMemory, SessionPipeline

    scope = ScopeMemory()
    plain = {"name": "t", "input_schema": {"type": "object", "properties": {"q": {"type": "string"}}}}
    first = SessionPipeline("anthropic", scope=scope)
    prep = first.prepare("anthropic.messages", _anthropic([{"role": "user", "content": "a"}], [plain]))
    first.commit(prep)
    props = {"cache_control": {"type": "string"}, "q": {"type": "string"}}
    extended = {"name": "t", "input_schema": {"type": "object", "properties": props}}
    second = SessionPipeline("anthropic", scope=scope)
    out = second.prepare("anthropic.messages", _anthropic([{"role": "user", "content": "b"}], [extended]))
    assert out.body["tools"][0]["input_schema"]["properties"] == props
    assert "tools.serialization" not in out.repairs
    # And the other way round: the property removed is not put back.
    third = SessionPipeline("anthropic", scope=ScopeMemory())
    third.commit(third.prepare("anthropic.messages", _anthropic([{"role": "user", "content": "a"}], [extended])))
    again = third.prepare("anthropic.messages", _anthropic([{"role": "user", "content": "a"}], [plain]))
    assert "cache_control" not in again.body["tools"][0]["input_schema"]["properties"]


def test_tool_input_value_named_like_a_marker_is_sent_as_the_client_wrote_it() -> None:
    """Issue 12's second observed failure: a tool_use input ``{"cache_control": "max-age=0"}`` went upstream as
    the previous turn's ``"no-cache"``."""
    from agentcache.session._pipeline import SessionPipeline

    def turn(value: str) -> dict[str, object]:
        use = {"type": "tool_use", "id": "u1", "name": "t", "input": {"cache_control": value}}
        return _anthropic(
            [
                {"role": "user", "content": "set the header"},
                {"role": "assistant", "content": [use]},
                {"role": "user", "content": [{"type": "tool_result", "tool_use_id": "u1", "content": "ok"}]},
            ],
            [{"name": "t", "input_schema": {"type": "object"}}],
        )

    pipe = SessionPipeline("anthropic")
    pipe.commit(pipe.prepare("anthropic.messages", turn("no-cache")))
    out = pipe.prepare("anthropic.messages", turn("max-age=0"))
    assert out.body["messages"][1]["content"][0]["input"] == {"cache_control": "max-age=0"}
    assert out.repairs == ()


def test_what_json_cannot_hold_is_bad_input() -> None:
    """A caller's dict with an infinite float, or a unit nested past the encoder: InputError (the proxy forwards
    such a body unchanged, an audit reports the record), never a non-JSON ``Infinity`` nor a RecursionError."""
    import pytest

    from agentcache._exceptions import InputError

    inf = {"model": "m", "messages": [{"role": "user", "content": [{"type": "text", "text": "x", "n": float("inf")}]}]}
    with pytest.raises(InputError, match="not JSON compliant"):
        canonicalize("anthropic.messages", inf)
    deep: object = 1
    for _ in range(3000):
        deep = [deep]
    body = {"model": "m", "messages": [{"role": "user", "content": [{"type": "text", "text": "x", "n": deep}]}]}
    with pytest.raises(InputError, match="too deeply"):
        canonicalize("anthropic.messages", body)


def test_value_digest_of_a_unit_too_deep_to_read_is_its_bytes() -> None:
    """A unit nested deeper than the meaning walk can follow compares equal only to the same bytes (an audit of
    such a record goes on; no repair treats it as another form of anything)."""
    deep: object = 1
    for _ in range(400):
        deep = {"a": deep}

    def block(key: str) -> object:
        body = {"model": "m", "messages": [{"role": "user", "content": [{"type": "text", "text": "x", key: deep}]}]}
        return canonicalize("anthropic.messages", body).blocks[-1]

    a, a2, b = block("n"), block("n"), block("m")
    import sys

    old = sys.getrecursionlimit()
    sys.setrecursionlimit(300)
    try:
        da, da2, db = (value_digest(x, "anthropic.messages") for x in (a, a2, b))  # type: ignore[arg-type]
    finally:
        sys.setrecursionlimit(old)
    assert da == da2 and da != db


def test_static_blocks_are_bounded_by_entries_and_characters() -> None:
    from agentcache.model._static import StaticBlocks

    counter, api = TokenCounter(memo_size=10), "anthropic.messages"
    memo = StaticBlocks(keep=3, budget=10_000)
    for i in range(5):
        memo.put(api, ("tools", str(i)), counter, ())
    assert len(memo) == 3 and memo.get(api, ("tools", "1"), counter) is None
    assert memo.get(api, ("tools", "4"), counter) == ()
    assert memo.get("openai.chat", ("tools", "4"), counter) is None  # another wire's blocks differ
    assert memo.get(api, ("tools", "4"), TokenCounter(memo_size=10)) is None  # and another counter's
    memo = StaticBlocks(keep=10, budget=400)
    memo.put(api, ("system", "x" * 101), counter, ())  # over a quarter of the budget: not kept
    assert len(memo) == 0
    for c in "abcd":
        memo.put(api, ("system", c * 100), counter, ())
    assert len(memo) == 4  # 400 characters: at the budget
    memo.put(api, ("system", "e" * 100), counter, ())
    assert len(memo) == 4 and memo.get(api, ("system", "a" * 100), counter) is None
    assert memo.get(api, ("system", "b" * 100), counter) == ()  # used: now the most recent
    memo.put(api, ("system", "f" * 100), counter, ())
    assert memo.get(api, ("system", "c" * 100), counter) is None and memo.get(api, ("system", "b" * 100), counter) == ()
    memo.put(api, ("system", "f" * 100), counter, ())  # again: counted once
    assert len(memo) == 4
