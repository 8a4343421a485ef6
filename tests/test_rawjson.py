"""Bodies parsed once with their source texts: same values as json.loads, spliced output equal in meaning,
source texts that key the block cache and session inference."""

from __future__ import annotations

import json
import time
from pathlib import Path
from typing import Any

import pytest
from hypothesis import given, settings
from hypothesis import strategies as st

from agentcache.model._rawjson import dumps_spliced, loads, strip_markers
from agentcache.session import checkpoints_of
from agentcache.session._pipeline import SessionPipeline

ROOT = Path(__file__).resolve().parent.parent

_json = st.recursive(
    st.none() | st.booleans() | st.integers() | st.floats(allow_nan=False) | st.text(),
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
    ("marked", "plain"),
    [
        ('{"type":"text","text":"a","cache_control":{"type":"ephemeral"}}', '{"type":"text","text":"a"}'),
        ('{"cache_control": {"type": "ephemeral", "ttl": "1h"}, "type": "text"}', '{"type": "text"}'),
        ('{\n  "type": "text",\n  "cache_control": {\n    "type": "ephemeral"\n  }\n}', '{\n  "type": "text"\n}'),
        ('{"role":"user","content":[{"type":"text","text":"x","prompt_cache_breakpoint":{"mode":"explicit"}}]}',
         '{"role":"user","content":[{"type":"text","text":"x"}]}'),
        ('{"text":"a \\"cache_control\\": {} b"}', '{"text":"a \\"cache_control\\": {} b"}'),
    ],
)  # fmt: skip
def test_strip_markers(marked: str, plain: str) -> None:
    assert strip_markers(marked) == plain


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
