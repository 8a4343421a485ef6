"""The Redis store's stored snapshot (``session/_redis_state.py``): the client's body as a delta of the sent one,
rebuilt exactly; documents of the earlier format still read; equal-looking values never taken for the same."""

from __future__ import annotations

import json
import zlib
from typing import Any

from agentcache.model._rawjson import Number, encode, loads
from agentcache.session._redis_state import DELTA_VERSION, pack, unpack

from .conftest import anthropic_tools


def _doc(sent: dict[str, Any], client: dict[str, Any] | None) -> dict[str, Any]:
    return {"v": 1, "target": "anthropic", "api": "anthropic.messages", "sent": sent, "client": client, "forms": []}


def _pair() -> tuple[dict[str, Any], dict[str, Any]]:
    """A client body (numbers spelled as a client may) and the body sent for it, copy-on-write: the last tool,
    the system prompt and the last message marked, everything else the client's own objects."""
    raw = json.dumps(
        {
            "model": "claude-opus-4-8",
            "max_tokens": 256,
            "temperature": 0.10,
            "system": "You are an airline agent.",
            "tools": anthropic_tools(),
            "messages": [{"role": "user" if i % 2 == 0 else "assistant", "content": f"turn {i}"} for i in range(9)],
        }
    ).replace('"temperature": 0.1', '"temperature": 1.0E-1')
    client, _ = loads(raw.encode())
    marker = {"type": "ephemeral"}
    sent = dict(client)
    sent["system"] = [{"type": "text", "text": client["system"], "cache_control": marker}]
    sent["tools"] = [*client["tools"][:-1], {**client["tools"][-1], "cache_control": marker}]
    last = client["messages"][-1]
    sent["messages"] = [*client["messages"][:-1], {**last, "content": [{"type": "text", "text": last["content"],
                                                                         "cache_control": marker}]}]  # fmt: skip
    return sent, client


def test_client_body_round_trips_as_a_delta_of_the_sent_one() -> None:
    sent, client = _pair()
    doc = _doc(sent, client)
    stored = json.loads(zlib.decompress(pack(doc)))
    assert stored["v"] == DELTA_VERSION and stored["client"] is None
    delta = stored["client_delta"]
    assert delta["same"] == ["model", "max_tokens", "temperature"]
    assert [i for i, _ in delta["items"]["messages"][1]] == [8] and [i for i, _ in delta["items"]["tools"][1]] == [
        len(client["tools"]) - 1
    ]
    back = unpack(pack(doc))
    assert back["v"] == 1 and list(back["client"]) == list(client)
    assert encode(back) == encode(doc)  # every value, the client's number spelling included
    assert isinstance(back["client"]["temperature"], Number) and back["client"]["temperature"].text == "1.0E-1"
    assert len(pack(doc)) < len(zlib.compress(encode(doc).encode(), 1))


def test_equal_looking_values_are_stored_whole() -> None:
    """``1 == 1.0 == True`` in Python: only identity says a value is the sent one's."""
    sent = {"a": 1, "b": [1, {"x": True}], "c": "same"}
    client = {"c": sent["c"], "b": [1.0, {"x": 1}, "more"], "a": True, "d": None}
    back = unpack(pack(_doc(sent, client)))["client"]
    assert list(back) == ["c", "b", "a", "d"]
    assert encode(back) == encode(client) == '{"c":"same","b":[1.0,{"x":1},"more"],"a":true,"d":null}'


def test_documents_without_a_delta_still_read() -> None:
    """A snapshot written by an earlier release (the whole document, version 1), or one with no client body."""
    sent, client = _pair()
    for doc in (_doc(sent, client), _doc(sent, None), {"v": 1, "target": "anthropic", "tools": []}):
        assert encode(unpack(zlib.compress(encode(doc).encode(), 1))) == encode(doc)
        assert encode(unpack(pack(doc))) == encode(doc)


def test_the_client_source_texts_go_in_as_they_are() -> None:
    """Given the client body's source texts, the sent body and the tools are stored as those texts (spliced, not
    encoded again): the stored document reads back to the same values, the client's spellings included; a body
    without texts, or another body's texts, stores the same values as without them."""
    from agentcache.model._rawjson import parse

    body = {
        "model": "claude-opus-4-8",
        "temperature": 0.1,
        "tools": anthropic_tools(),
        "messages": [{"role": "user" if i % 2 == 0 else "assistant", "content": f"turn {i}"} for i in range(9)],
    }
    text = json.dumps(body, indent=1).replace('"temperature": 0.1', '"temperature": 1.0E-1')
    client, raw = loads(text.encode())
    assert raw is not None
    marker = {"type": "ephemeral"}
    sent = {**client, "messages": [*client["messages"][:-1], {**client["messages"][-1], "cache_control": marker}]}
    doc = {**_doc(sent, client), "tools": list(client["tools"])}
    spliced = zlib.decompress(pack(doc, raw)).decode()
    assert raw.text_of(client["messages"][0]) in spliced and raw.text_of(client["tools"][0]) in spliced
    assert encode(unpack(pack(doc, raw))) == encode(unpack(pack(doc))) == encode(doc)
    assert encode(parse(spliced.encode())) == encode(parse(zlib.decompress(pack(doc))))
    _, other = loads(json.dumps({"messages": [1, 2, 3], "tools": []}).encode())
    assert encode(unpack(pack(doc, other))) == encode(doc)
