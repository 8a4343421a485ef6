"""Request bodies parsed once, keeping the source text of their large parts; the one JSON codec of the process.

A proxy receives each turn as bytes, and most of those bytes (tools, system, the history) are the bytes it
saw the turn before. :func:`loads` parses a body as :func:`json.loads` does (the same C scanner) and also
remembers, for every top-level value and every element of a top-level array, the slice of the source text it
came from. With that:

* the session's block cache keys an unchanged message by its source text instead of encoding it again;
* session inference hashes a message's source text (markers cut out) instead of encoding it;
* the body sent upstream is written by splicing (:mod:`agentcache.model._splice`): every unit the pipeline did not
  touch goes out as the client's own text, so only edited units are encoded (and untouched bytes stay byte-for-byte
  the client's).

A text is valid for a value only while that value is not mutated; the pipeline edits copy-on-write, so a
value found by identity (:meth:`RawBody.text_of` checks ``is``) still has its source text.

**Faithful values.** What agentcache encodes again (an edited unit, a unit re-sent in an earlier form) must mean
what the client wrote, in the client's spelling, and be valid JSON (RFC 8259). So a number whose Python value
would not write back as written (``1E2``, ``1e309``, ``1.5e-400``, ``0.10``, ``-0``, an integer past Python's
4300-digit limit) parses to a :class:`Number`, which keeps its text and is written back as it (:data:`encode`);
the non-JSON literals ``NaN``/``Infinity``/``-Infinity`` that :mod:`json` accepts are refused (``ValueError``, as
any invalid JSON is); a text nested deeper than Python's parser can go raises :class:`NestingTooDeep` (an
:class:`~agentcache.InputError`), never ``RecursionError``. Duplicate keys cannot live in a dict: top-level ones are
noted (:attr:`RawBody.duplicates`) and :func:`has_duplicates` finds nested ones, so the pipeline can leave such a
body as the client sent it. Only numbers take a Python call while parsing; objects stay on the C fast path.
"""

from __future__ import annotations

import json
import re
import secrets
from collections.abc import Callable, Sequence
from dataclasses import dataclass, field
from typing import Any

from .._exceptions import InputError

__all__ = [
    "NestingTooDeep",
    "Number",
    "RawBody",
    "encode",
    "encode_ascii",
    "encode_sorted",
    "has_duplicates",
    "loads",
    "loads_text",
    "parse",
]


class Number:
    """A JSON number kept as the client wrote it (``text``), for the spellings a Python ``float``/``int`` would
    write back differently. ``float(n)`` is its (possibly rounded) value; two are equal when their texts are."""

    __slots__ = ("text",)

    def __init__(self, text: str) -> None:
        self.text = text

    def __float__(self) -> float:
        return float(self.text)

    def __eq__(self, other: object) -> bool:
        return isinstance(other, Number) and other.text == self.text

    def __hash__(self) -> int:
        return hash(self.text)

    def __repr__(self) -> str:
        return f"Number({self.text!r})"


class NestingTooDeep(InputError):
    """A JSON text nested deeper than Python's parser (bounded by the recursion limit) can read."""


_float_repr = float.__repr__
_MAX_INT_DIGITS = 4000  # under CPython's int/str conversion limit (4300 digits)


def _float(text: str) -> float | Number:
    value = float(text)
    return value if _float_repr(value) == text else Number(text)


def _int(text: str) -> int | Number:
    if text == "-0" or len(text) > _MAX_INT_DIGITS:
        return Number(text)
    return int(text)


def _constant(name: str) -> Any:
    raise ValueError(f"{name} is not JSON (RFC 8259 has no NaN or Infinity)")


class _Duplicate(ValueError):
    pass


def _pairs_strict(pairs: list[tuple[str, Any]]) -> dict[str, Any]:
    out = dict(pairs)
    if len(out) != len(pairs):
        raise _Duplicate
    return out


_DECODER = json.JSONDecoder(parse_float=_float, parse_int=_int, parse_constant=_constant)
_STRICT = json.JSONDecoder(
    parse_float=_float, parse_int=_int, parse_constant=_constant, object_pairs_hook=_pairs_strict
)
_scan: Any = _DECODER.scan_once  # type: ignore[attr-defined]
_scanstring: Any = json.decoder.scanstring  # type: ignore[attr-defined]
_WS = re.compile(r"[ \t\n\r]*")
_SPACE = " \t\n\r"

# A Number goes through ``default``: as a JSON string holding a per-process nonce and its text, then unquoted. The
# nonce is secret, so no client string can pass for one; a number's text needs no escaping.
_NONCE = "\x00n" + secrets.token_hex(8) + ":"
_NONCE_JSON = json.dumps(_NONCE)[1:-1]
_UNQUOTE = re.compile('"' + re.escape(_NONCE_JSON) + '([^"]*)"')


def _default(value: Any) -> Any:
    if isinstance(value, Number):
        return _NONCE + value.text
    raise TypeError(f"Object of type {type(value).__name__} is not JSON serializable")


def _encoder(*, ensure_ascii: bool = True, sort_keys: bool = False) -> Callable[[Any], str]:
    c_make = getattr(json.encoder, "c_make_encoder", None)
    enc: Callable[[Any], str]
    if c_make is None:  # no C accelerator (another Python): the pure-Python encoder
        enc = json.JSONEncoder(
            separators=(",", ":"), allow_nan=False, default=_default, ensure_ascii=ensure_ascii, sort_keys=sort_keys
        ).encode
    else:
        # json's C encoder built once, not per call as JSONEncoder.encode does (a third of the time of a small
        # unit). No circular-reference markers: a JSON value has no cycles, and a cyclic caller's dict ends in
        # RecursionError (nested too deeply) instead of ValueError.
        quote = json.encoder.encode_basestring_ascii if ensure_ascii else json.encoder.encode_basestring
        c_enc = c_make(None, _default, quote, None, ":", ",", sort_keys, False, False)

        def enc(value: Any) -> str:
            return "".join(c_enc(value, 0))

    needle = _NONCE_JSON

    def encode(value: Any) -> str:
        out: str = enc(value)
        return _UNQUOTE.sub(r"\1", out) if needle in out else out

    return encode


#: Compact JSON text, keys in stored order, non-ASCII kept, numbers as the client spelled them, never
#: ``NaN``/``Infinity`` (``ValueError``): the one encoder of the process (``json.dumps`` with keyword arguments
#: builds a new encoder per call). :mod:`agentcache.model._canonical` encodes units with it too.
encode = _encoder(ensure_ascii=False)
#: :data:`encode` with non-ASCII escaped (session inference hashes).
encode_ascii = _encoder()
#: :data:`encode` with keys sorted at every level (the meaning of a value,
#: :func:`agentcache.model._canonical.value_digest`).
encode_sorted = _encoder(ensure_ascii=False, sort_keys=True)


def parse(text: str | bytes) -> Any:
    """``text`` parsed as :func:`loads` parses a body (numbers as :class:`Number` where needed), without source
    texts. Raises ``ValueError`` for invalid JSON (NaN/Infinity included) and :class:`NestingTooDeep`."""
    try:
        return _DECODER.decode(text if isinstance(text, str) else text.decode("utf-8"))
    except RecursionError:
        raise NestingTooDeep("JSON nested too deeply to read") from None


def has_duplicates(text: str) -> bool:
    """True when the JSON ``text`` has an object with a repeated key, at any depth. Raises as :func:`parse`."""
    try:
        _STRICT.decode(text)
    except _Duplicate:
        return True
    except RecursionError:
        raise NestingTooDeep("JSON nested too deeply to read") from None
    return False


#: ``(value, source text)`` of one part of a parsed body.
Part = tuple[Any, str]


@dataclass(slots=True, eq=False)  # compared by identity (ParseMemo keeps them in lists)
class RawBody:
    """The source text of a parsed body's parts: ``texts`` maps ``id(value)`` to ``(value, text)`` for
    every top-level value that is an object, an array or a string longer than 64 characters, and every element
    of a top-level array that is an object or an array. ``duplicates``: the body repeats a top-level key.

    What a later parse follows (:func:`loads` with ``guide``): ``fields``, the ``(value, text)`` of each top-level
    key that has a text, and ``starts``, where its value starts in the body's text; ``items``, per top-level array,
    the ``(value, text)`` of each element (None for a scalar element), and ``offsets``, where each starts in the
    array's text (from its opening bracket); ``size``, the length of the body's text in characters.
    ``derived``: facts about a part computed once (``id(value) → (value, {name: fact})``, checked by identity),
    carried into the next parse for every part it re-uses."""

    texts: dict[int, Part] = field(default_factory=dict)
    duplicates: bool = False
    fields: dict[str, Part] = field(default_factory=dict)
    items: dict[str, list[Part | None]] = field(default_factory=dict)
    size: int = 0
    derived: dict[int, tuple[Any, dict[str, Any]]] = field(default_factory=dict)
    offsets: dict[str, list[int]] = field(default_factory=dict)
    starts: dict[str, int] = field(default_factory=dict)

    def text_of(self, value: Any) -> str | None:
        """The source text of ``value`` (found by identity), or None when it did not come from the body."""
        hit = self.texts.get(id(value))
        return hit[1] if hit is not None and hit[0] is value else None

    def facts(self, value: Any) -> dict[str, Any] | None:
        """The mutable facts of ``value``, a part of this body with a source text (found by identity; else None),
        kept for as long as later parses re-use the part. Only facts that depend on the part's text alone belong
        here."""
        hit = self.derived.get(id(value))
        if hit is not None and hit[0] is value:
            return hit[1]
        part = self.texts.get(id(value))
        if part is None or part[0] is not value:
            return None
        out: dict[str, Any] = {}
        self.derived[id(value)] = (value, out)
        return out


class _Malformed(Exception):
    pass


def _ws(s: str, i: int) -> int:
    if i < len(s) and s[i] in _SPACE:
        return int(_WS.match(s, i).end())  # type: ignore[union-attr]
    return i


class _Parse:
    """One parse of a body's text, following ``guide`` (the parse of an earlier body) where the texts agree: a
    part whose text the guide holds at the same place (the same key; the same index of the same top-level array)
    is taken whole, one string comparison instead of a scan. A complete JSON text starting at an offset is read
    the same wherever it stands, so the result equals a parse without a guide."""

    __slots__ = ("derived", "guide", "s", "texts")

    def __init__(self, s: str, guide: RawBody | None) -> None:
        self.s = s
        self.guide = guide
        self.texts: dict[int, Part] = {}
        self.derived: dict[int, tuple[Any, dict[str, Any]]] = {}

    def reuse(self, parts: Sequence[Part]) -> None:
        """Take ``parts`` from the guide whole: their texts, and the facts the guide holds about them."""
        self.texts.update([(id(p[0]), p) for p in parts])
        guide = self.guide
        if guide is not None and guide.derived:
            derived, into = guide.derived, self.derived
            for p in parts:
                facts = derived.get(id(p[0]))
                if facts is not None and facts[0] is p[0]:
                    into[id(p[0])] = facts

    def array(self, i: int, key: str, whole: str | None) -> tuple[list[Any], int, list[Part | None], list[int]]:
        """``(items, end, parts, offsets)`` of the array at ``i`` (``offsets``: where each element starts, from
        the opening bracket); ``key``: its top-level key; ``whole``: the text the guide holds under that key."""
        s, texts = self.s, self.texts
        items: list[Any] = []
        parts: list[Part | None] = []
        offsets: list[int] = []
        base = i
        guide = self.guide.items.get(key) if self.guide is not None else None
        i = _ws(s, i + 1)
        if s[i] == "]":
            return items, i + 1, parts, offsets
        n = 0
        if guide and whole is not None and None not in guide and self.guide is not None:
            # The guide's elements, all of them, as its text has them: one comparison for the whole run.
            head = whole[:-1].rstrip()
            if s.startswith(head, base):
                j = _ws(s, base + len(head))
                if s[j] == ",":
                    parts = list(guide)
                    items = [p[0] for p in parts]  # type: ignore[index]
                    offsets = list(self.guide.offsets[key])
                    self.reuse(parts)  # type: ignore[arg-type]
                    n = len(parts)
                    i = _ws(s, j + 1)
        match = _WS.match
        size = len(guide) if guide is not None else 0
        startswith = s.startswith
        while True:
            start = i
            g = guide[n] if n < size else None  # type: ignore[index]
            if g is not None and startswith(g[1], i):
                value = g[0]
                i += len(g[1])
                self.reuse((g,))
                part: Part | None = g
            else:
                value, i = _scan(s, i)
                part = None
                if isinstance(value, dict | list):
                    part = (value, s[start:i])
                    texts[id(value)] = part
            items.append(value)
            parts.append(part)
            offsets.append(start - base)
            n += 1
            c = s[i]
            if c in _SPACE:  # inline: most bodies have no space here, or one
                i = match(s, i).end()  # type: ignore[union-attr]
                c = s[i]
            if c == "]":
                return items, i + 1, parts, offsets
            if c != ",":
                raise _Malformed
            i += 1
            if s[i] in _SPACE:
                i = match(s, i).end()  # type: ignore[union-attr]

    def body(self, i: int) -> tuple[dict[str, Any], RawBody]:
        """The top-level object at ``i`` (the whole text: nothing but space may follow) and its source texts."""
        s, texts, guide = self.s, self.texts, self.guide
        out: dict[str, Any] = {}
        fields: dict[str, Part] = {}
        arrays: dict[str, list[Part | None]] = {}
        spans: dict[str, list[int]] = {}
        starts: dict[str, int] = {}
        dup = False
        i = _ws(s, i + 1)
        if s[i] != "}":
            while True:
                if s[i] != '"':
                    raise _Malformed
                key, i = _scanstring(s, i + 1)
                i = _ws(s, i)
                if s[i] != ":":
                    raise _Malformed
                start = i = _ws(s, i + 1)
                g = guide.fields.get(key) if guide is not None else None
                if g is not None and s.startswith(g[1], i):  # the same text as last time: the same value
                    value = g[0]
                    i += len(g[1])
                    self.reuse((g,))
                    fields[key] = g
                    gi = guide.items.get(key) if guide is not None else None
                    if gi is not None and isinstance(value, list) and guide is not None:
                        arrays[key] = gi
                        spans[key] = guide.offsets[key]
                        self.reuse([e for e in gi if e is not None])
                    starts[key] = start
                elif s[i] == "[":
                    value, i, parts, spans[key] = self.array(i, key, g[1] if g is not None else None)
                    fields[key] = texts[id(value)] = (value, s[start:i])
                    arrays[key] = parts
                    starts[key] = start
                else:
                    value, i = _scan(s, i)
                    if isinstance(value, dict | list) or (isinstance(value, str) and i - start > 64):
                        fields[key] = texts[id(value)] = (value, s[start:i])  # long strings too (a system prompt)
                        starts[key] = start
                if key in out:
                    dup = True
                out[key] = value
                i = _ws(s, i)
                c = s[i]
                if c == "}":
                    break
                if c != ",":
                    raise _Malformed
                i = _ws(s, i + 1)
        if _ws(s, i + 1) != len(s):
            raise _Malformed
        return out, RawBody(texts, dup, fields, arrays, len(s), self.derived, spans, starts)


def loads(raw: bytes, guide: RawBody | None = None) -> tuple[Any, RawBody | None]:
    """``(value, texts)``: ``raw`` parsed as :func:`json.loads` parses it (but see the module docstring: numbers,
    NaN/Infinity), with the source texts of its parts when it is a UTF-8 JSON object (else ``texts`` is None).
    ``guide``: the texts of an earlier body (:class:`ParseMemo` picks one), whose parts are re-used where this body
    has the same text at the same place (the result is the same; only faster). Raises ``ValueError``
    (``json.JSONDecodeError`` or ``UnicodeDecodeError``) where :func:`json.loads` would, and
    :class:`NestingTooDeep` (an InputError) for a body nested too deeply to read."""
    try:
        s = raw.decode("utf-8")
    except UnicodeDecodeError:
        return _fallback(raw), None  # UTF-16/32 bodies, or json's own error
    return loads_text(s, raw, guide)


def loads_text(s: str, raw: bytes, guide: RawBody | None = None) -> tuple[Any, RawBody | None]:
    """:func:`loads` of a body already decoded: ``s`` is ``raw`` as UTF-8 text."""
    try:
        i = _ws(s, 0)
        if i >= len(s) or s[i] != "{":
            return _fallback(raw), None
        try:
            value, texts = _Parse(s, guide).body(i)
        except (_Malformed, StopIteration, IndexError, ValueError):
            return _fallback(raw), None  # raises json's own error message; parses if we were too strict
        return value, texts
    except RecursionError:
        raise NestingTooDeep("request body nested too deeply to read") from None


def _fallback(raw: bytes) -> Any:
    return json.loads(raw, parse_float=_float, parse_int=_int, parse_constant=_constant)
