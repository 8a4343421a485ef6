"""Bodies parsed once with their source texts: same values as json.loads, spliced output equal in meaning,
source texts that key the block cache and session inference."""

from __future__ import annotations

import json
import time
from decimal import Decimal
from pathlib import Path
from typing import Any

import pytest
from hypothesis import given, settings
from hypothesis import strategies as st

from agentcache.model._canonical import item_text
from agentcache.model._rawjson import loads
from agentcache.model._splice import dumps_spliced
from agentcache.session import checkpoints_of
from agentcache.session._pipeline import SessionPipeline

ROOT = Path(__file__).resolve().parent.parent

_json = st.recursive(
    st.none() | st.booleans() | st.integers() | st.floats(allow_nan=False, allow_infinity=False) | st.text(),
    lambda inner: st.lists(inner, max_size=4) | st.dictionaries(st.text(max_size=8), inner, max_size=4),
    max_leaves=20,
)


@settings(max_examples=300, deadline=None)
@given(st.dictionaries(st.text(max_size=10), _json, max_size=6), st.sampled_from([None, 1, 2]))
def test_loads_equals_json_loads_and_splice_round_trips(doc: dict[str, Any], indent: int | None) -> None:
    raw = json.dumps(doc, indent=indent, ensure_ascii=indent == 2).encode()
    value, texts = loads(raw)
    assert value == json.loads(raw)
    assert texts is not None
    for v in value.values():
        if isinstance(v, dict | list):
            text = texts.text_of(v)
            assert text is not None and json.loads(text) == v
    # Replace one value and one array element: the rest is spliced from the source, the result means the same.
    edited = dict(value)
    for key, v in value.items():
        if isinstance(v, list) and v:
            edited[key] = [*v[:-1], {"edited": True}]
            break
    edited["__new__"] = [1, "two"]
    assert json.loads(dumps_spliced(edited, texts)) == edited


@pytest.mark.parametrize(
    "raw",
    [b"", b"  ", b"[1, 2]", b'"text"', b"{", b'{"a": 1,}', b'{"a" 1}', b'{"a": 1} x', b'{"a": [1, 2,]}',
     b'\xff{"a": 1}', b'{"a": tru}', "\ufeff{\"a\": 1}".encode(), '{"a": "é"}'.encode("utf-16")],
)  # fmt: skip
def test_loads_fails_and_succeeds_exactly_like_json_loads(raw: bytes) -> None:
    try:
        expected: Any = json.loads(raw)
    except ValueError as exc:
        with pytest.raises(ValueError) as got:
            loads(raw)
        assert type(got.value) is type(exc) and str(got.value) == str(exc)
        return
    assert loads(raw)[0] == expected


def test_texts_are_found_by_identity_only() -> None:
    value, texts = loads(b'{"messages": [{"role": "user", "content": "hi"}], "tools": []}')
    assert texts is not None
    msg = value["messages"][0]
    assert texts.text_of(msg) == '{"role": "user", "content": "hi"}'
    assert texts.text_of(dict(msg)) is None  # an equal copy did not come from the body
    assert texts.text_of(value["tools"]) == "[]"


@pytest.mark.parametrize(
    ("api", "marked", "plain"),
    [
        ("anthropic.messages", '{"role":"user","content":[{"type":"text","text":"a","cache_control":{"type":'
         '"ephemeral"}}]}', '{"role":"user","content":[{"type":"text","text":"a"}]}'),
        ("anthropic.messages", '{"role": "user", "content": [{"cache_control": {"type": "ephemeral", "ttl": "1h"}, '
         '"type": "text", "text": "a"}]}', '{"role": "user", "content": [{"type": "text", "text": "a"}]}'),
        ("anthropic.messages", '{"role":"user","content":[\n  {"type": "text",\n  "cache_control": {\n    "type": '
         '"ephemeral"\n  }\n}]}', '{"role":"user","content":[\n  {"type": "text"\n}]}'),
        ("openai.chat", '{"role":"user","content":[{"type":"text","text":"x","prompt_cache_breakpoint":{"mode":'
         '"explicit"}}]}', '{"role":"user","content":[{"type":"text","text":"x"}]}'),
        ("anthropic.messages", '{"role":"user","content":[{"type":"text","text":"a \\"cache_control\\": {} b"}]}',
         '{"role":"user","content":[{"type":"text","text":"a \\"cache_control\\": {} b"}]}'),
        # Keys of the same name that are not the API's marker, or not where it defines one, are content.
        ("anthropic.messages", '{"role":"assistant","content":[{"type":"tool_use","id":"t","name":"n",'
         '"input":{"cache_control":"no-cache"}}]}', None),
        ("openai.chat", '{"role":"user","content":[{"type":"text","text":"x","cache_control":{"type":"ephemeral"}}]}',
         None),
        ("anthropic.messages", '{"role":"user","content":[{"type":"text","text":"x","prompt_cache_breakpoint":{}}]}',
         None),
    ],
)  # fmt: skip
def test_item_text_cuts_only_the_markers_the_api_defines(api: str, marked: str, plain: str | None) -> None:
    item = json.loads(marked)
    assert item_text(api, item, marked) == (marked if plain is None else plain)


def test_item_text_is_stable_when_the_key_is_also_content() -> None:
    """A message whose tool input has a key named cache_control hashes the same with and without the marker the
    client moves (the encoded form is used both times)."""
    plain = {"role": "user", "content": [{"type": "tool_result", "tool_use_id": "t", "content": "x"},
                                         {"type": "text", "text": "go", "cache_control_x": 1}]}  # fmt: skip
    tool = {
        "role": "assistant",
        "content": [{"type": "tool_use", "id": "t", "name": "n", "input": {"cache_control": 1}}],
    }
    marked = {**tool, "content": [{**tool["content"][0], "cache_control": {"type": "ephemeral"}}]}
    texts = [json.dumps(m) for m in (tool, marked)]
    assert item_text("anthropic.messages", tool, texts[0]) == item_text("anthropic.messages", marked, texts[1])
    assert '"cache_control":1' in item_text("anthropic.messages", marked, texts[1])
    assert item_text("anthropic.messages", plain, None) == json.dumps(plain, separators=(",", ":"))


def test_checkpoints_from_source_ignore_markers_the_client_moves() -> None:
    """A client that marks its last message each turn: the marked and unmarked forms hash the same."""
    first = {
        "model": "m",
        "messages": [
            {"role": "user", "content": [{"type": "text", "text": "q1", "cache_control": {"type": "ephemeral"}}]}
        ],
    }
    second = {"model": "m", "messages": [
        {"role": "user", "content": [{"type": "text", "text": "q1"}]},
        {"role": "assistant", "content": "a1"},
        {"role": "user", "content": [{"type": "text", "text": "q2", "cache_control": {"type": "ephemeral"}}]},
    ]}  # fmt: skip
    a = checkpoints_of("anthropic.messages", *loads(json.dumps(first).encode()))
    b = checkpoints_of("anthropic.messages", *loads(json.dumps(second).encode()))
    assert a.chain[0] == b.chain[0]
    assert len(b) == 3 and len(set(b.chain)) == 3


def _tau_bodies() -> list[bytes]:
    run = json.loads((ROOT / "data" / "tau-bench" / "gpt-4o-airline.json").read_text())[0]
    tools = json.loads((ROOT / "data" / "tau-bench" / "airline_tools.json").read_text())
    msgs: list[dict[str, Any]] = []
    out = []
    for m in run["traj"][1:9]:
        msgs.append({"role": "user" if len(msgs) % 2 == 0 else "assistant", "content": str(m.get("content") or "-")})
        if len(msgs) % 2 == 1:
            body = {"model": "gpt-4o", "messages": [run["traj"][0], *msgs], "tools": tools}
            out.append(json.dumps(body, indent=1).encode())
    return out


def test_pipeline_with_source_texts_plans_exactly_as_without() -> None:
    """The same real session through two pipelines, one given the source texts: identical plans and bodies; the
    one with texts re-uses the unchanged history at once (one comparison of the message list's source text), the
    other message by message (block-cache hits)."""
    with_texts, without = SessionPipeline("openai"), SessionPipeline("openai")
    now = time.time()
    for k, raw in enumerate(_tau_bodies()):
        body, texts = loads(raw)
        a = with_texts.prepare("openai.chat", body, now=now + k, raw=texts)
        b = without.prepare("openai.chat", json.loads(raw), now=now + k)
        assert a.planned.chain == b.planned.chain
        assert a.planned.cum_tokens == b.planned.cum_tokens
        assert a.markers == b.markers and a.repairs == b.repairs
        assert json.loads(dumps_spliced(a.body, texts)) == b.body
        with_texts.commit(a)
        without.commit(b)
    assert without.cache.hits > with_texts.cache.hits and "messages" in with_texts.cache.runs


# ---- numbers, NaN/Infinity, duplicate keys, nesting (issue 12) ----------------------------------------------


@pytest.mark.parametrize(
    "number",
    ["1e309", "-1e309", "1E2", "1.5e-400", "-0", "0.10", "1e-7", "2.50", "1.0000000000000000000001", "7" * 5000],
)
def test_edited_units_keep_the_clients_number_spelling(number: str) -> None:
    raw = f'{{"tools": [{{"n": {number}}}], "messages": [{{"role": "user", "content": [{number}]}}]}}'.encode()
    value, texts = loads(raw)
    # Every unit edited (copies), so nothing is spliced from the source: the encoder writes the numbers.
    edited = {"tools": [dict(value["tools"][0])], "messages": [dict(value["messages"][0])], "new": 1}
    out = dumps_spliced(edited, texts).decode()
    assert out == f'{{"tools":[{{"n":{number}}}],"messages":[{{"role":"user","content":[{number}]}}],"new":1}}'
    json.loads(out, parse_int=Decimal, parse_constant=lambda c: pytest.fail(f"{c} on the wire"))  # valid JSON


def test_plain_numbers_stay_python_numbers() -> None:
    value, _ = loads(b'{"a": [0.5, 3, -2, 1e+21, 100.0, -0.0]}')
    assert value["a"] == [0.5, 3, -2, 1e21, 100.0, -0.0]
    assert all(type(x) in (int, float) for x in value["a"])


@pytest.mark.parametrize("literal", [b"NaN", b"Infinity", b"-Infinity"])
def test_nan_and_infinity_literals_are_not_json(literal: bytes) -> None:
    with pytest.raises(ValueError, match="not JSON"):
        loads(b'{"temperature": ' + literal + b', "messages": []}')
    with pytest.raises(ValueError, match="not JSON"):
        loads(b"[" + literal + b"]")


def test_untouched_units_keep_the_clients_text() -> None:
    raw = b'{"model": "m", "tools": [{"n": 1E2, "d": 1, "d": 2}], "messages": [{"role": "user", "content": "x"}]}'
    value, texts = loads(raw)
    edited = {**value, "messages": [*value["messages"], {"role": "user", "content": "y"}]}
    out = dumps_spliced(edited, texts)
    assert b'"tools":[{"n": 1E2, "d": 1, "d": 2}]' in out and b'{"role": "user", "content": "x"}' in out


def test_duplicate_keys_are_found() -> None:
    from agentcache.model._rawjson import has_duplicates

    _, texts = loads(b'{"model": "a", "messages": [], "model": "b"}')
    assert texts is not None and texts.duplicates
    _, texts = loads(b'{"model": "a", "messages": [{"a": 1, "a": 2}]}')
    assert texts is not None and not texts.duplicates  # nested: found per unit, see the pipeline test
    assert has_duplicates('{"a": [{"b": 1, "c": {"d": 1, "d": 1}}]}')
    assert not has_duplicates('{"a": [{"b": 1}, {"b": 2}], "c": {"b": 3}}')


def test_duplicate_keys_leave_the_body_as_sent() -> None:
    from agentcache._exceptions import InputError

    pipe = SessionPipeline("anthropic")
    for raw in (
        b'{"model": "claude-sonnet-4-5", "max_tokens": 5, "messages": [{"role": "user", "content": "x"}], '
        b'"max_tokens": 6}',
        b'{"model": "claude-sonnet-4-5", "messages": [{"role": "user", "content": [{"type": "text", "text": "a", '
        b'"text": "b"}]}]}',
        b'{"model": "claude-sonnet-4-5", "tools": [{"name": "t", "input_schema": {"type": "object", "type": "x"}}], '
        b'"messages": [{"role": "user", "content": "x"}]}',
    ):
        body, texts = loads(raw)
        with pytest.raises(InputError, match="repeats a"):
            pipe.prepare("anthropic.messages", body, raw=texts)


def test_too_deep_is_an_input_error_not_recursion() -> None:
    from agentcache._exceptions import InputError
    from agentcache.model._rawjson import NestingTooDeep, has_duplicates, parse

    deep = '{"messages": ' + "[" * 5000 + "]" * 5000 + "}"
    for call in (lambda: loads(deep.encode()), lambda: parse(deep), lambda: has_duplicates(deep),
                 lambda: loads(b"[" * 5000 + b"]" * 5000)):  # fmt: skip
        with pytest.raises(NestingTooDeep) as err:
            call()
        assert isinstance(err.value, InputError) and "too deeply" in str(err.value)
