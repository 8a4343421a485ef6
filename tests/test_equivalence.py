"""The equivalence table (issue 24, item 1): every rule of ``EQUIVALENCES`` holds at its position and nowhere else,
and the client edits the last fuzz found reverted (67 meaning changes) now go upstream as the client wrote them."""

from __future__ import annotations

import copy
from typing import Any

import pytest

from agentcache.adapters import canonicalize
from agentcache.model._equivalence import EQUIVALENCES, JsonText, TextShape, message_value, text_part, value_digest
from agentcache.session._pipeline import ScopeMemory, SessionPipeline

A, C, R = "anthropic.messages", "openai.chat", "openai.responses"


def _anthropic(messages: list[Any], system: Any = "s", tools: list[Any] | None = None) -> dict[str, Any]:
    return {"model": "claude-sonnet-4-5", "max_tokens": 8, "system": system, "tools": tools or [], "messages": messages}


def _chat(messages: list[Any]) -> dict[str, Any]:
    return {"model": "gpt-4o", "messages": messages}


def _responses(items: Any) -> dict[str, Any]:
    return {"model": "gpt-4o", "input": items}


def _call(args: str, kind: str = "function") -> dict[str, Any]:
    return {"id": "c1", "type": kind, "function": {"name": "f", "arguments": args}}


def _fc(args: str, kind: str = "function_call") -> dict[str, Any]:
    return {"type": kind, "call_id": "c1", "name": "f", "arguments": args}


def same_message(api: str, a: dict[str, Any], b: dict[str, Any], message: int) -> bool:
    """Whether message ``message`` of bodies ``a`` and ``b`` means the same (the repairs' comparison)."""
    ca, cb = canonicalize(api, a), canonicalize(api, b)
    return message_value(ca, message) == message_value(cb, message)


def same_block(api: str, a: dict[str, Any], b: dict[str, Any], path: str) -> bool:
    """Whether the blocks at ``path`` of bodies ``a`` and ``b`` mean the same."""
    ba = next(x for x in canonicalize(api, a).blocks if x.path == path)
    bb = next(x for x in canonicalize(api, b).blocks if x.path == path)
    return value_digest(ba, api) == value_digest(bb, api)


def au(content: Any, role: str = "user") -> dict[str, Any]:
    """An Anthropic body of one message."""
    return _anthropic([{"role": role, "content": content}])


def at(kind: str) -> dict[str, Any]:
    """An Anthropic body whose one tool's schema has a property of type ``kind``."""
    props = {"p": {"type": kind}}
    return _anthropic([], tools=[{"name": "t", "input_schema": {"type": "object", "properties": props}}])


def ch(content: Any = None, role: str = "user", **extra: Any) -> dict[str, Any]:
    """A Chat body of one message."""
    return _chat([{"role": role, "content": content, **extra}])


def rs(*items: Any) -> dict[str, Any]:
    """A Responses body of these input items."""
    return _responses(list(items))


def use(args: str) -> list[dict[str, Any]]:
    return [{"type": "tool_use", "id": "u", "name": "f", "input": {"arguments": args}}]


def result(content: Any) -> list[dict[str, Any]]:
    return [{"type": "tool_result", "tool_use_id": "t", "content": content}]


def text(kind: str, value: str, **extra: Any) -> list[dict[str, Any]]:
    return [{"type": kind, "text": value, **extra}]


def custom(args: str) -> list[dict[str, Any]]:
    return [{"id": "c1", "type": "custom", "custom": {"name": "f", "input": args}}]


def fn_call(args: Any) -> list[dict[str, Any]]:
    return [{"id": "c1", "type": "function", "function": {"name": "f", "arguments": args}}]


MARK = {"type": "ephemeral"}
OUT = "function_call_output"

# (api, rule index (-1: no rule applies), description, body a, body b, message compared (None: tools[0]), equal)
CASES: list[tuple[str, int, str, dict[str, Any], dict[str, Any], int | None, bool]] = [
    # Anthropic: a string is one text block, in messages and in system
    (A, 0, "user string = one text block", au("hi"), au(text("text", "hi")), 0, True),
    (A, 0, "a marker on the block is no content", au("hi"), au(text("text", "hi", cache_control=MARK)), 0, True),
    (A, 0, "input_text is not Anthropic's text block", au("hi"), au(text("input_text", "hi")), 0, False),
    (A, 0, "a block whose type changed is another", au(text("text", "hi")), au(text("input_text", "hi")), 0, False),
    (A, 0, "a tool_result's nested string is not its list", au(result("ok")), au(result(text("text", "ok"))), 0,
     False),
    (A, -1, "tool_use.input.arguments is content", au(use('{"n": 1.0}'), "assistant"),
     au(use('{"n":1.00}'), "assistant"), 0, False),
    (A, -1, "a schema's nested type is content", at("text"), at("input_text"), None, False),
    # Chat: a string is one text part; a tool call's arguments by their JSON value
    (C, 0, "user string = one text part", ch("hi"), ch(text("text", "hi")), 0, True),
    (C, 0, "input_text is no Chat part", ch("hi"), ch(text("input_text", "hi")), 0, False),
    (C, 1, "an int re-spelled as a float is another number", ch(role="assistant", tool_calls=fn_call('{"a":1}')),
     ch(role="assistant", tool_calls=fn_call('{ "a" : 1.0e0 }')), 0, False),
    (C, 1, "arguments with keys reordered and spaces", ch(role="assistant", tool_calls=fn_call('{"a":1,"b":[2]}')),
     ch(role="assistant", tool_calls=fn_call('{"b": [2], "a": 1}')), 0, True),
    (C, 1, "arguments repeating a key are only themselves", ch(role="assistant", tool_calls=fn_call('{"a":1,"a":2}')),
     ch(role="assistant", tool_calls=fn_call('{"a": 1, "a": 2}')), 0, False),
    (C, 1, "an object where the string was", ch(role="assistant", tool_calls=fn_call('{"a":1}')),
     ch(role="assistant", tool_calls=fn_call({"a": 1})), 0, False),
    (C, 1, "a custom tool call's input is text", ch(role="assistant", tool_calls=custom('{"a":1}')),
     ch(role="assistant", tool_calls=custom('{"a": 1}')), 0, False),
    (C, 1, "a part's own arguments key is content", ch(text("text", "x", arguments='{"a":1}')),
     ch(text("text", "x", arguments='{"a": 1}')), 0, False),
    (C, 2, "function_call.arguments re-serialised", ch(role="assistant", function_call={"name": "f",
     "arguments": '{"a":1}'}), ch(role="assistant", function_call={"name": "f", "arguments": '{"a": 1}'}), 0, True),
    (C, 2, "function_call.arguments changed", ch(role="assistant", function_call={"name": "f",
     "arguments": '{"a":1}'}), ch(role="assistant", function_call={"name": "f", "arguments": '{"a":2}'}), 0, False),
    # Responses: a user string is one input_text part, an assistant's one output_text part
    (R, 0, "user string = one input_text part", rs({"role": "user", "content": "hi"}),
     rs({"role": "user", "content": text("input_text", "hi")}), 0, True),
    (R, 0, "the input string = a user message", _responses("hi"), rs({"role": "user", "content": "hi"}), 0, True),
    (R, 0, "text is no Responses part", rs({"role": "user", "content": "hi"}),
     rs({"role": "user", "content": text("text", "hi")}), 0, False),
    (R, 0, "a user part edited to output_text", rs({"role": "user", "content": text("input_text", "hi")}),
     rs({"role": "user", "content": text("output_text", "hi")}), 0, False),
    (R, 0, "assistant string = one output_text part", rs({"role": "assistant", "content": "ok"}),
     rs({"role": "assistant", "content": text("output_text", "ok")}), 0, True),
    (R, 0, "an assistant's input_text is not its string", rs({"role": "assistant", "content": "ok"}),
     rs({"role": "assistant", "content": text("input_text", "ok")}), 0, False),
    (R, 1, "function_call arguments re-serialised", rs(_fc('{"a":1,"b":2}')), rs(_fc('{"b": 2, "a": 1}')), 0, True),
    (R, 1, "function_call arguments changed", rs(_fc('{"a":1}')), rs(_fc('{"a":"1"}')), 0, False),
    (R, 1, "a function_call_output's output is text", rs({"type": OUT, "call_id": "c1", "output": '{"a":1}'}),
     rs({"type": OUT, "call_id": "c1", "output": '{"a": 1}'}), 0, False),
    (R, 1, "another item's arguments key is content", rs(_fc('{"a":1}', "custom_tool_call")),
     rs(_fc('{"a": 1}', "custom_tool_call")), 0, False),
]  # fmt: skip


@pytest.mark.parametrize(("api", "rule", "what", "a", "b", "message", "equal"), CASES, ids=[c[2] for c in CASES])
def test_equivalence_table_position_by_position(
    api: str, rule: int, what: str, a: dict[str, Any], b: dict[str, Any], message: int | None, equal: bool
) -> None:
    got = same_block(api, a, b, "tools[0]") if message is None else same_message(api, a, b, message)
    assert got is equal, what


def test_every_rule_is_shown_to_hold_and_to_stop_at_its_position() -> None:
    for api, rules in EQUIVALENCES.items():
        for i, rule in enumerate(rules):
            verdicts = {equal for a, r, _, _, _, _, equal in CASES if a == api and r == i}
            assert verdicts == {True, False}, (api, i)
            assert rule.doc, (api, i)  # each rule names where the API defines it
            assert isinstance(rule, TextShape | JsonText)


def test_text_part_is_the_shape_rule_s_part() -> None:
    assert text_part(A, "messages[3].content", "user") == "text" == text_part(A, "system", None)
    assert text_part(C, "messages[0].content", "assistant") == "text"
    assert text_part(R, "input[2].content", "user") == "input_text"
    assert text_part(R, "input[2].content", "assistant") == "output_text"
    assert text_part(R, "instructions", None) is None  # no equivalent list form there
    assert text_part(A, "messages[3].content[0]", "user") is None


# ---- the instances the fuzz found: sent as the client wrote them ------------------------------------------


def _sent(api: str, turns: list[dict[str, Any]], scope: ScopeMemory | None = None) -> dict[str, Any]:
    """The body the pipeline sends for the last of ``turns`` (earlier turns committed as sent)."""
    target = "anthropic" if api == A else "openai"
    pipe = SessionPipeline(target, scope=scope)
    out: dict[str, Any] = {}
    for body in turns:
        prepared = pipe.prepare(api, body)
        pipe.commit(prepared)
        out = prepared.body
    return out


def test_a_history_block_edited_to_input_text_goes_upstream_as_edited() -> None:
    first = _anthropic([{"role": "user", "content": [{"type": "text", "text": "hi"}]},
                        {"role": "assistant", "content": "hello"}, {"role": "user", "content": "next"}])  # fmt: skip
    edited = copy.deepcopy(first)
    edited["messages"][0]["content"][0]["type"] = "input_text"
    edited["messages"].append({"role": "assistant", "content": "ok"})
    sent = _sent(A, [first, edited])
    assert sent["messages"][0]["content"][0]["type"] == "input_text"  # Anthropic would reject it: its call


def test_a_responses_user_part_edited_to_output_text_is_not_reverted() -> None:
    first = _responses([{"role": "user", "content": [{"type": "input_text", "text": "hi"}]}])
    edited = _responses([{"role": "user", "content": [{"type": "output_text", "text": "hi"}]},
                         {"role": "user", "content": "more"}])  # fmt: skip
    assert _sent(R, [first, edited])["input"][0]["content"][0]["type"] == "output_text"


def test_a_tool_schema_s_nested_type_edit_is_kept_in_the_session_and_in_a_new_one() -> None:
    def tools(kind: str) -> list[Any]:
        return [{"name": "t", "input_schema": {"type": "object", "properties": {"p": {"type": kind}}}}]

    scope = ScopeMemory()
    first = _anthropic([{"role": "user", "content": "a"}], tools=tools("text"))
    edited = _anthropic([{"role": "user", "content": "a"}, {"role": "assistant", "content": "b"},
                         {"role": "user", "content": "c"}], tools=tools("input_text"))  # fmt: skip
    sent = _sent(A, [first, edited], scope)
    assert sent["tools"][0]["input_schema"]["properties"]["p"] == {"type": "input_text"}
    fresh = _sent(A, [_anthropic([{"role": "user", "content": "z"}], tools=tools("input_text"))], scope)
    assert fresh["tools"][0]["input_schema"]["properties"]["p"] == {"type": "input_text"}


@pytest.mark.parametrize("edited", ['{"n":1.00}', '  {"n": 1.0}  '])
def test_a_tool_use_input_arguments_string_edit_is_not_reverted(edited: str) -> None:
    def turn(args: str, more: bool) -> dict[str, Any]:
        use = {"type": "tool_use", "id": "u1", "name": "t", "input": {"arguments": args}}
        msgs: list[Any] = [
            {"role": "user", "content": "go"},
            {"role": "assistant", "content": [use]},
            {"role": "user", "content": [{"type": "tool_result", "tool_use_id": "u1", "content": "ok"}]},
        ]
        if more:
            msgs += [{"role": "assistant", "content": "done"}, {"role": "user", "content": "again"}]
        return _anthropic(msgs, tools=[{"name": "t", "input_schema": {"type": "object"}}])

    sent = _sent(A, [turn('{"n": 1.0}', False), turn(edited, True)])
    assert sent["messages"][1]["content"][0]["input"]["arguments"] == edited


def test_documented_equivalents_are_still_repaired() -> None:
    """The table's rules at work: a Chat tool call's arguments and a Responses user string re-sent as sent."""
    call = {"role": "assistant", "content": None, "tool_calls": [_call('{"a":1,"b":2}')]}
    first = _chat([{"role": "user", "content": "go"}, call, {"role": "tool", "tool_call_id": "c1", "content": "x"}])
    again = copy.deepcopy(first)
    again["messages"][1]["tool_calls"][0]["function"]["arguments"] = '{"b": 2, "a": 1}'
    again["messages"][0]["content"] = [{"type": "text", "text": "go"}]
    again["messages"].append({"role": "user", "content": "next"})
    sent = _sent(C, [first, again])
    assert sent["messages"][1]["tool_calls"][0]["function"]["arguments"] == '{"a":1,"b":2}'
    assert sent["messages"][0]["content"] == "go"
    first_r = _responses([{"role": "user", "content": "go"}, _fc('{"a":1}')])
    again_r = _responses([{"role": "user", "content": [{"type": "input_text", "text": "go"}]}, _fc('{ "a": 1 }'),
                          {"type": "function_call_output", "call_id": "c1", "output": "x"}])  # fmt: skip
    sent_r = _sent(R, [first_r, again_r])
    assert sent_r["input"][0]["content"] == "go" and sent_r["input"][1]["arguments"] == '{"a":1}'


def test_a_marker_on_a_responses_assistant_string_makes_an_output_text_part() -> None:
    from agentcache.adapters import openai_responses

    body = _responses([{"role": "user", "content": "q"}, {"role": "assistant", "content": "a"}])
    out = openai_responses.set_markers(body, (("input[0].content", "5m"), ("input[1].content", "5m")))
    assert out["input"][0]["content"][0]["type"] == "input_text"
    assert out["input"][1]["content"][0]["type"] == "output_text"
