"""Request bodies parsed once, keeping the source text of their large parts.

A proxy receives each turn as bytes, and most of those bytes (tools, system, the history) are the bytes it
saw the turn before. :func:`loads` parses a body exactly as :func:`json.loads` does (same scanner, same
values) and also remembers, for every top-level value and every element of a top-level array, the slice of
the source text it came from. With that:

* the session's block cache keys an unchanged message by its source text instead of encoding it again;
* session inference hashes a message's source text (markers cut out) instead of encoding it;
* the body sent upstream is written by splicing: every unit the pipeline did not touch goes out as the
  client's own text, so only edited units are encoded (and untouched bytes stay byte-for-byte the client's).

A text is valid for a value only while that value is not mutated; the pipeline edits copy-on-write, so a
value found by identity (:meth:`RawBody.text_of` checks ``is``) still has its source text.
"""

from __future__ import annotations

import json
import re
from dataclasses import dataclass, field
from typing import Any

__all__ = ["RawBody", "dumps_spliced", "encode", "loads", "strip_markers"]

_scan: Any = json.JSONDecoder().scan_once  # type: ignore[attr-defined]
_scanstring: Any = json.decoder.scanstring  # type: ignore[attr-defined]
_WS = re.compile(r"[ \t\n\r]*")
_SPACE = " \t\n\r"
#: Compact JSON text, keys in stored order, non-ASCII kept: the one encoder of the process (``json.dumps`` with
#: keyword arguments builds a new encoder per call). :mod:`agentcache.model._canonical` encodes units with it too.
encode = json.JSONEncoder(separators=(",", ":"), ensure_ascii=False).encode


@dataclass(slots=True)
class RawBody:
    """The source text of a parsed body's parts: ``texts`` maps ``id(value)`` to ``(value, text)`` for
    every top-level value that is an object, an array or a string longer than 64 characters, and every element
    of a top-level array that is an object or an array."""

    texts: dict[int, tuple[Any, str]] = field(default_factory=dict)

    def text_of(self, value: Any) -> str | None:
        """The source text of ``value`` (found by identity), or None when it did not come from the body."""
        hit = self.texts.get(id(value))
        return hit[1] if hit is not None and hit[0] is value else None


class _Malformed(Exception):
    pass


def _ws(s: str, i: int) -> int:
    if i < len(s) and s[i] in _SPACE:
        return int(_WS.match(s, i).end())  # type: ignore[union-attr]
    return i


def _array(s: str, i: int, texts: dict[int, tuple[Any, str]]) -> tuple[list[Any], int]:
    items: list[Any] = []
    i = _ws(s, i + 1)
    if s[i] == "]":
        return items, i + 1
    match = _WS.match
    while True:
        start = i
        value, i = _scan(s, i)
        items.append(value)
        if isinstance(value, dict | list):
            texts[id(value)] = (value, s[start:i])
        c = s[i]
        if c in _SPACE:  # inline: most bodies have no space here, or one
            i = match(s, i).end()  # type: ignore[union-attr]
            c = s[i]
        if c == "]":
            return items, i + 1
        if c != ",":
            raise _Malformed
        i += 1
        if s[i] in _SPACE:
            i = match(s, i).end()  # type: ignore[union-attr]


def _object(s: str, i: int, texts: dict[int, tuple[Any, str]]) -> tuple[dict[str, Any], int]:
    out: dict[str, Any] = {}
    i = _ws(s, i + 1)
    if s[i] == "}":
        return out, i + 1
    while True:
        if s[i] != '"':
            raise _Malformed
        key, i = _scanstring(s, i + 1)
        i = _ws(s, i)
        if s[i] != ":":
            raise _Malformed
        start = i = _ws(s, i + 1)
        if s[i] == "[":
            value, i = _array(s, i, texts)
        else:
            value, i = _scan(s, i)
        if isinstance(value, dict | list) or (isinstance(value, str) and i - start > 64):
            texts[id(value)] = (value, s[start:i])  # long top-level strings too (a system prompt)
        out[key] = value
        i = _ws(s, i)
        c = s[i]
        if c == "}":
            return out, i + 1
        if c != ",":
            raise _Malformed
        i = _ws(s, i + 1)


def loads(raw: bytes) -> tuple[Any, RawBody | None]:
    """``(value, texts)``: ``raw`` parsed as :func:`json.loads` parses it, with the source texts of its parts
    when it is a UTF-8 JSON object (else ``texts`` is None). Raises ``ValueError`` (``json.JSONDecodeError``
    or ``UnicodeDecodeError``) exactly where :func:`json.loads` would."""
    try:
        s = raw.decode("utf-8")
    except UnicodeDecodeError:
        return json.loads(raw), None  # UTF-16/32 bodies, or json's own error
    i = _ws(s, 0)
    if i >= len(s) or s[i] != "{":
        return json.loads(raw), None
    texts: dict[int, tuple[Any, str]] = {}
    try:
        value, end = _object(s, i, texts)
        if _ws(s, end) != len(s):
            raise _Malformed
    except (_Malformed, StopIteration, IndexError, ValueError):
        return json.loads(raw), None  # raises json's own error message; parses if we were too strict
    return value, RawBody(texts)


# A marker with its separating comma, whichever side of it the comma is on: markers are flat objects.
_MARKER = re.compile(
    r'\s*,\s*"(?:cache_control|prompt_cache_breakpoint)"\s*:\s*(?:\{[^{}]*\}|"[^"]*"|true|false|null)'
    r'|"(?:cache_control|prompt_cache_breakpoint)"\s*:\s*(?:\{[^{}]*\}|"[^"]*"|true|false|null)\s*,?\s*'
)


def strip_markers(text: str) -> str:
    """``text`` (JSON source) with every ``cache_control``/``prompt_cache_breakpoint`` member cut out, so a
    unit reads the same whether or not the client marked it this turn."""
    if "cache_control" not in text and "prompt_cache_breakpoint" not in text:
        return text
    return _MARKER.sub("", text)


def dumps_spliced(body: dict[str, Any], raw: RawBody | None) -> bytes:
    """``body`` as JSON bytes: values (and array elements) that came unchanged from the parsed request go out
    as their source text, everything else compact-encoded. Equal to the compact encoding in meaning."""
    if raw is None:
        return encode(body).encode()
    parts: list[str] = []
    for key, value in body.items():
        text = raw.text_of(value)
        if text is None:
            if isinstance(value, list):
                text = "[" + ",".join([raw.text_of(v) or encode(v) for v in value]) + "]"
            else:
                text = encode(value)
        parts.append(f"{encode(key)}:{text}")
    return ("{" + ",".join(parts) + "}").encode()
