"""A parse guided by an earlier body's parse (model/_parsememo) is the parse without one: same values, same
source texts, same errors; it re-uses the earlier body's parts where the text agrees; the memo stays bounded."""

from __future__ import annotations

import json
import random
from typing import Any

import pytest
from hypothesis import given, settings
from hypothesis import strategies as st

from agentcache.model._parsememo import ParseMemo
from agentcache.model._rawjson import RawBody, loads
from agentcache.model._splice import dumps_spliced
from agentcache.session import checkpoints_of

_json = st.recursive(
    st.none() | st.booleans() | st.integers() | st.floats(allow_nan=False, allow_infinity=False) | st.text(),
    lambda inner: st.lists(inner, max_size=4) | st.dictionaries(st.text(max_size=8), inner, max_size=4),
    max_leaves=20,
)
_doc = st.dictionaries(st.sampled_from(["a", "b", "messages", "tools", "s"]), _json, max_size=5)


def _edit(doc: dict[str, Any], rng: random.Random) -> dict[str, Any]:
    """A later turn of ``doc``: arrays grown, an element or a value changed, a key added, or nothing."""
    out = dict(doc)
    for key, value in doc.items():
        roll = rng.random()
        if isinstance(value, list) and roll < 0.5:
            out[key] = [*value, {"role": "user", "content": rng.choice(["x", 1, [2.5]])}]
        elif isinstance(value, list) and value and roll < 0.7:
            grown = list(value)
            grown[rng.randrange(len(grown))] = {"edited": rng.random()}
            out[key] = grown
        elif roll < 0.8:
            out[key] = "y" * rng.choice([3, 70])  # short and long strings (a long one has a text)
    if rng.random() < 0.3:
        out["new"] = [{"k": 1}]
    return out


def _same_texts(value: dict[str, Any], texts: RawBody) -> None:
    for v in value.values():
        if isinstance(v, dict | list):
            text = texts.text_of(v)
            assert text is not None and json.loads(text) == v
        if isinstance(v, list):
            for e in v:
                if isinstance(e, dict | list):
                    text = texts.text_of(e)
                    assert text is not None and json.loads(text) == e


@settings(max_examples=300, deadline=None)
@given(_doc, st.sampled_from([None, 1]), st.integers(0, 2**32))
def test_guided_parse_equals_unguided(doc: dict[str, Any], indent: int | None, seed: int) -> None:
    rng = random.Random(seed)
    first = json.dumps(doc, indent=indent).encode()
    later = json.dumps(_edit(doc, rng), indent=indent).encode()
    _, guide = loads(first)
    assert guide is not None
    value, texts = loads(later, guide)
    plain, plain_texts = loads(later)
    assert value == plain == json.loads(later)
    assert texts is not None and plain_texts is not None
    assert texts.duplicates == plain_texts.duplicates and texts.size == plain_texts.size
    assert {k: t for k, (_, t) in texts.fields.items()} == {k: t for k, (_, t) in plain_texts.fields.items()}
    _same_texts(value, texts)
    assert json.loads(dumps_spliced({**value, "z": 1}, texts)) == {**value, "z": 1}
    # Lists edited the ways the pipeline edits them (copies: an element replaced, appended, cut, reordered, a
    # marker block added): the spliced text means the edited body.
    for key, v in value.items():
        if not isinstance(v, list):
            continue
        k = rng.randrange(len(v) + 1)
        for edited in (
            [*v[:k], {"marked": True}, *v[k + 1 :]],
            [*v, {"role": "user"}],
            v[:k],
            list(v),
            v[::-1],
            [{"type": "text", "text": value.get("s"), "cache_control": {"type": "ephemeral"}}],
        ):
            doc2 = {**value, key: edited}
            assert json.loads(dumps_spliced(doc2, texts)) == doc2


@pytest.mark.parametrize(
    "later", [b'{"messages": [{"a": 1}, {"b": 2},]}', b'{"messages": [{"a": 1}, {"b": 2}', b'{"messages": [{"a": 1}] x']
)
def test_guided_parse_fails_like_json_loads(later: bytes) -> None:
    _, guide = loads(b'{"messages": [{"a": 1}]}')
    with pytest.raises(json.JSONDecodeError) as expected:
        json.loads(later)
    with pytest.raises(json.JSONDecodeError) as got:
        loads(later, guide)
    assert str(got.value) == str(expected.value)


def _turns(n: int, tag: str = "") -> list[bytes]:
    tools = [{"name": f"t{i}", "description": "d" * 200, "input_schema": {"type": "object"}} for i in range(5)]
    msgs: list[dict[str, Any]] = []
    out = []
    for k in range(n):
        msgs.append({"role": "user", "content": f"{tag} question {k} " + "q" * 300})
        out.append(json.dumps({"model": "m", "system": "s" * 1500, "tools": tools, "messages": msgs}).encode())
        msgs.append({"role": "assistant", "content": [{"type": "text", "text": f"answer {k}"}]})
    return out


def test_memo_reuses_the_parts_of_the_turn_before() -> None:
    memo = ParseMemo()
    turns = _turns(4)
    before, _ = memo.loads(turns[0])
    values = [before]
    for raw in turns[1:]:
        value, texts = memo.loads(raw)
        assert value == json.loads(raw) and texts is not None
        # The tools, the system prompt and every earlier message are the earlier turn's objects.
        assert value["tools"] is before["tools"] and value["system"] is before["system"]
        assert all(a is b for a, b in zip(value["messages"], before["messages"], strict=False))
        assert value["messages"] is not before["messages"]  # the grown list is new
        before = value
        values.append(value)
    assert (memo.guided, memo.continued, len(memo)) == (3, 3, 1)  # each turn replaced the one it continued


def test_memo_guides_other_sessions_and_keeps_them_apart() -> None:
    memo = ParseMemo()
    a, b = _turns(3, "a"), _turns(3, "b")
    for x, y in zip(a, b, strict=True):
        memo.loads(x)
        memo.loads(y)
    assert len(memo) == 2  # one body per conversation: each turn found its own predecessor
    assert memo.continued == 4
    other = ParseMemo()
    other.loads(a[0])
    value, _ = other.loads(a[1], hint="another tenant")
    assert other.guided == 0 and value == json.loads(a[1])


def test_memo_is_bounded_and_skips_small_bodies() -> None:
    memo = ParseMemo(budget=40_000, per_group=2)
    for k in range(6):
        memo.loads(_turns(1, f"conversation {k}")[0])
    assert len(memo) <= 2
    small = ParseMemo()
    small.loads(b'{"messages": []}')
    assert len(small) == 0
    tight = ParseMemo(budget=6_000)
    for k in range(4):
        tight.loads(_turns(2, f"c{k}")[1])
    assert tight.estimated_bytes() <= 3 * 6_000 and len(tight) <= 1


def test_checkpoints_are_the_same_with_guided_texts() -> None:
    memo = ParseMemo()
    for raw in _turns(5):
        body, texts = memo.loads(raw)
        plain_body, plain_texts = loads(raw)
        expected = checkpoints_of("anthropic.messages", plain_body, plain_texts)
        assert checkpoints_of("anthropic.messages", body, texts) == expected
        assert checkpoints_of("anthropic.messages", body, texts) == expected  # again, from the kept facts


def _real_traffic() -> list[tuple[str, list[bytes]]]:
    from .test_one_pass import string_records, swe_agent_records
    from .test_parity import claude_code_records, tau_records

    out = []
    for name, records in (
        ("tau", tau_records("anthropic.messages")),
        ("tau-strings", string_records()),
        ("swe-agent", swe_agent_records()),  # a client that rewrites old tool outputs
        ("claude-code", claude_code_records()),
    ):
        out.append((name, [json.dumps(r.body).encode() for r in records]))
    return out


@pytest.mark.parametrize(("name", "bodies"), _real_traffic(), ids=lambda v: v if isinstance(v, str) else "")
def test_guided_bodies_are_sent_byte_for_byte_as_unguided(name: str, bodies: list[bytes]) -> None:
    """Real traffic through the proxy's steps twice, with the memo and without: the same checkpoints, the same
    plan and the same bytes upstream, turn by turn; and the memo took most of each later turn whole."""
    from agentcache.session import SessionPipeline

    memo = ParseMemo()
    pipes = (SessionPipeline("anthropic"), SessionPipeline("anthropic"))
    for raw in bodies:
        sent = []
        for pipe, parse in zip(pipes, (memo.loads, loads), strict=True):
            body, texts = parse(raw)
            assert texts is not None
            cps = checkpoints_of("anthropic.messages", body, texts)
            prep = pipe.prepare("anthropic.messages", body, now=1.0, raw=texts)
            sent.append((cps, prep.markers, prep.repairs, prep.planned.chain, dumps_spliced(prep.body, texts)))
            pipe.commit(prep)
        assert sent[0] == sent[1]
        assert json.loads(sent[0][-1]) == prep.body
    assert memo.continued >= len(bodies) // 2, name


def test_a_failing_guided_parse_falls_back_to_an_unguided_one(monkeypatch: pytest.MonkeyPatch) -> None:
    from agentcache.model import _rawjson

    memo = ParseMemo()
    turns = _turns(3)
    memo.loads(turns[0])
    real = _rawjson._Parse.body

    def broken(self: Any, i: int) -> Any:
        if self.guide is not None:
            raise KeyError("a bug of ours")
        return real(self, i)

    monkeypatch.setattr(_rawjson._Parse, "body", broken)
    value, texts = memo.loads(turns[1])
    assert value == json.loads(turns[1]) and texts is not None  # parsed anyway, nothing lost
    assert memo.guided == 0 and len(memo) == 1  # the group was forgotten; the new body kept
    with pytest.raises(json.JSONDecodeError):
        memo.loads(turns[2][:-1])  # the client's own error still is one
