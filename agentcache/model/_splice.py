"""The body sent upstream, spliced from the client's own text: every value the pipeline did not touch goes out
as the source text :func:`~agentcache.model._rawjson.loads` kept for it, so only what agentcache edited is encoded
again, and untouched bytes stay byte-for-byte the client's."""

from __future__ import annotations

from typing import Any

from ._rawjson import RawBody, encode

__all__ = ["dumps_spliced"]


def dumps_spliced(body: dict[str, Any], raw: RawBody | None) -> bytes:
    """``body`` as JSON bytes: values (and array elements) that came unchanged from the parsed request go out
    as their source text, everything else compact-encoded. Equal to the compact encoding in meaning. A top-level
    array keeps the client's text for the run of leading elements it still shares with the one the client sent;
    an object without a text (a block agentcache marked) keeps the texts of its values."""
    if raw is None:
        return encode(body).encode()
    parts: list[str] = []
    for key, value in body.items():
        text = raw.text_of(value)
        if text is None:
            text = _list_text(raw, key, value) if isinstance(value, list) else _value_text(raw, value)
        parts.append(f"{_key_text(key)}:{text}")
    return ("{" + ",".join(parts) + "}").encode()


_KEYS: dict[str, str] = {}


def _key_text(key: str) -> str:
    text = _KEYS.get(key)
    if text is None:
        text = encode(key)
        if len(_KEYS) < 1024 and len(key) <= 64:
            _KEYS[key] = text
    return text


def _value_text(raw: RawBody, value: Any) -> str:
    """The text of a value that has none of its own: an object's values with theirs, else encoded."""
    if isinstance(value, dict):
        text_of = raw.text_of
        return "{" + ",".join([f"{_key_text(k)}:{text_of(v) or encode(v)}" for k, v in value.items()]) + "}"
    return encode(value)


def _list_text(raw: RawBody, key: str, value: list[Any]) -> str:
    """The text of top-level array ``value`` under ``key``: the client's text up to the first element that is not
    the one the client sent there, then the elements one by one."""
    sent = raw.fields.get(key)
    offsets = raw.offsets.get(key)
    j = 0
    head = "["
    if sent is not None and offsets and isinstance(sent[0], list):
        old = sent[0]
        n = min(len(old), len(value))
        while j < n and value[j] is old[j]:
            j += 1
        if j == len(old) and j:
            head = sent[1][:-1].rstrip() + ","
        elif j:
            head = sent[1][: offsets[j]]
    if j == len(value):
        return head.rstrip().rstrip(",") + "]" if j else "[]"
    text_of = raw.text_of
    return head + ",".join([text_of(v) or _value_text(raw, v) for v in value[j:]]) + "]"
