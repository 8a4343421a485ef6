"""Which spellings of a unit the wire APIs define as the same: the one table the repairs read (:data:`EQUIVALENCES`).

agentcache re-sends the bytes a session sent before when the client's new bytes mean the same (docs/design.md,
"Repair rule"). What "the same" is, is decided here and nowhere else, as :data:`~agentcache.model._canonical.MARKERS`
decides where a marker is a marker:

* everywhere, a unit is its JSON value: object members in any order, a number by its exact decimal value (``1E2`` is
  ``100.0``; ``1e309`` is not ``1e400``, nor ``-0`` ``0``), duplicate keys never read as one; a key named like a
  marker or like a field of the table (``arguments``, ``type``) is content like any other;
* at the positions :data:`EQUIVALENCES` names, one more equivalence each, exactly as the API documents it there:
  :class:`TextShape` (a string is a one-element list of one text part of the type that position takes) and
  :class:`JsonText` (an OpenAI function call's ``arguments`` string is compared by the JSON value it holds).

Anything else is a change of meaning and is never repaired: a content part whose ``type`` changed (``text`` →
``input_text``), a nested ``{"type": "text"}`` in a tool schema, a ``tool_use.input`` member that happens to be
named ``arguments``.
"""

from __future__ import annotations

import contextlib
import functools
import json
import math
import re
from collections import OrderedDict
from collections.abc import Iterator
from dataclasses import dataclass
from decimal import Decimal
from typing import Any

from .._exceptions import InputError
from ._canonical import Block, CanonicalRequest, digest, dumps
from ._rawjson import Number, encode_sorted, has_duplicates, parse

__all__ = [
    "EQUIVALENCES",
    "JsonText",
    "TextShape",
    "equivalences_at",
    "message_value",
    "normalize",
    "plain_text",
    "text_part",
    "value_digest",
]


@dataclass(frozen=True, slots=True)
class TextShape:
    """At a block path matching ``path``, a string unit ``s`` is the list of one text part ``{"type": part,
    "text": s}`` (``assistant``: the part type of an assistant message's string, when it differs). ``doc``: where
    the API says so."""

    path: re.Pattern[str]
    part: str
    doc: str
    assistant: str | None = None

    def part_for(self, role: Any) -> str:
        """The text part type of a string in a message of ``role``."""
        return self.assistant if self.assistant is not None and role == "assistant" else self.part

    def apply(self, unit: Any, env: Any) -> tuple[Any, Any]:
        """``(unit, env)`` read under this rule."""
        if not isinstance(unit, str):
            return unit, env
        return {"type": self.part_for(env.get("role") if isinstance(env, dict) else None), "text": unit}, env

    def text_in(self, data: str, role: Any) -> str | None:
        """The string a unit whose canonical bytes are ``data`` (compact JSON, its marker stripped) stands for under
        this rule, the inverse of :meth:`apply`: a string itself, or the text of a part ``{"type": part, "text":
        s}`` with no other key (in either key order); None for anything else. Read off the bytes (a JSON string
        scanned in C), not parsed: session inference reads it for every new message."""
        if data[:1] == '"':
            text, end = _scanstring(data, 1)
            return text if end == len(data) else None
        part = self.part_for(role)
        for head, tail in ((f'{{"type":"{part}","text":', "}"), ('{"text":', f',"type":"{part}"}}')):
            if data.startswith(head) and data.endswith(tail) and data[len(head) : len(head) + 1] == '"':
                text, end = _scanstring(data, len(head) + 1)
                if end == len(data) - len(tail):
                    return str(text)
        return None


@dataclass(frozen=True, slots=True)
class JsonText:
    """At a block path matching ``path``, in a unit whose ``type`` is ``kind`` (None: any), the value at ``field``
    (a key path; ``env``: in the message envelope instead of the unit) is a JSON text: two strings holding the same
    JSON value are the same (a string that repeats a key, or is no JSON, only itself). Whatever stands there is
    tagged, so a parsed string never equals a non-string value. ``doc``: where the API says so."""

    path: re.Pattern[str]
    field: tuple[str, ...]
    kind: str | None
    doc: str
    env: bool = False

    def apply(self, unit: Any, env: Any) -> tuple[Any, Any]:
        """``(unit, env)`` read under this rule."""
        if self.env:
            return unit, _tagged(env, self.field)
        if self.kind is not None and not (isinstance(unit, dict) and unit.get("type") == self.kind):
            return unit, env
        return _tagged(unit, self.field), env


def _tagged(value: Any, field: tuple[str, ...]) -> Any:
    """``value`` with what stands at key path ``field`` tagged by how it reads (see :class:`JsonText`): ``["json",
    parsed]``, ``["text", string]`` or ``["value", anything else]``."""
    if not isinstance(value, dict) or field[0] not in value:
        return value
    inner = value[field[0]]
    if len(field) > 1:
        return {**value, field[0]: _tagged(inner, field[1:])}
    out = ["value", inner]
    if isinstance(inner, str):
        out = ["text", inner]
        with contextlib.suppress(ValueError):  # not JSON (or too deep to check): the string itself
            if not has_duplicates(inner):
                out = ["json", parse(inner)]
    return {**value, field[0]: out}


Rule = TextShape | JsonText
_scanstring: Any = json.decoder.scanstring  # type: ignore[attr-defined]

_ANTHROPIC_CONTENT = (
    "platform.claude.com/docs/en/api/messages (messages[].content: a string is shorthand for one text content "
    "block; system: a string or a list of text blocks); SDK MessageParam.content, TextBlockParam"
)
_CHAT_CONTENT = (
    "platform.openai.com/docs/api-reference/chat/create (messages[].content: the text contents, a string or an "
    "array of content parts of type text); SDK ChatCompletionContentPartTextParam"
)
_CHAT_ARGUMENTS = (
    "platform.openai.com/docs/api-reference/chat/create (tool_calls[].function.arguments: the arguments to call the "
    "function with, in JSON format); SDK ChatCompletionMessageFunctionToolCallParam.Function.arguments"
)
_CHAT_LEGACY_ARGUMENTS = "the deprecated assistant function_call.arguments (SDK ChatCompletionAssistantMessageParam)"
_RESPONSES_CONTENT = (
    "platform.openai.com/docs/api-reference/responses/create (input: a string is a text input with the user role; "
    "a message's content: a string or a list of input_text parts; an assistant's earlier output: output_text "
    "parts); SDK EasyInputMessageParam, ResponseInputTextParam, ResponseOutputTextParam"
)
_RESPONSES_ARGUMENTS = (
    "platform.openai.com/docs/api-reference/responses/create (function_call.arguments: a JSON string of the "
    "arguments to pass to the function); SDK ResponseFunctionToolCallParam.arguments"
)

_CHAT_CALL = re.compile(r"messages\[\d+\]\.tool_calls\[\d+\]")
_CHAT_BLOCK = re.compile(r"messages\[\d+\]\.(?:content|tool_calls)(?:\[\d+\])?")  # any block of a message

#: Where each wire API defines two spellings of one value, the one place the repairs read it: API → rules, each
#: with the block paths it applies at (see the module docstring). A position missing here has no equivalence
#: beyond the JSON value.
EQUIVALENCES: dict[str, tuple[Rule, ...]] = {
    "anthropic.messages": (TextShape(re.compile(r"system|messages\[\d+\]\.content"), "text", _ANTHROPIC_CONTENT),),
    "openai.chat": (
        TextShape(re.compile(r"messages\[\d+\]\.content"), "text", _CHAT_CONTENT),
        JsonText(_CHAT_CALL, ("function", "arguments"), "function", _CHAT_ARGUMENTS),
        JsonText(_CHAT_BLOCK, ("function_call", "arguments"), None, _CHAT_LEGACY_ARGUMENTS, env=True),
    ),
    "openai.responses": (
        TextShape(re.compile(r"input|input\[\d+\]\.content"), "input_text", _RESPONSES_CONTENT, "output_text"),
        JsonText(re.compile(r"input\[\d+\]"), ("arguments",), "function_call", _RESPONSES_ARGUMENTS),
    ),
}


@functools.lru_cache(maxsize=4096)  # paths repeat every turn; bounded (a path is at most two indices long)
def equivalences_at(api: str, path: str) -> tuple[int, ...]:
    """Indices into ``EQUIVALENCES[api]`` of the rules that apply to the block at ``path``."""
    return tuple(i for i, rule in enumerate(EQUIVALENCES.get(api, ())) if rule.path.fullmatch(path))


def text_part(api: str, path: str, role: str | None) -> str | None:
    """The type of the one text part wire ``api`` defines as a string at block ``path`` in a message of ``role``
    (what a string becomes when agentcache must give it a marker), or None where it defines none."""
    for i in equivalences_at(api, path):
        rule = EQUIVALENCES[api][i]
        if isinstance(rule, TextShape):
            return rule.part_for(role)
    return None


def plain_text(api: str, block: Block, role: Any) -> str | None:
    """The text of ``block`` (one content unit of a message of ``role`` in wire ``api``, its marker stripped) when
    the API reads it as a string: a string, or the one text part :class:`TextShape` defines at its position; None
    for any other block. Session inference hashes such a message by its text, so both spellings are one
    conversation item (:mod:`agentcache.session._identity`)."""
    if block.kind != "text":
        return None
    data = block.data.decode()
    where = block.path if data[:1] == '"' else block.path.rpartition("[")[0]  # a part: its content list
    for i in equivalences_at(api, where):
        rule = EQUIVALENCES[api][i]
        if isinstance(rule, TextShape):
            return rule.text_in(data, role)
    return None


def normalize(value: Any) -> Any:
    """A JSON value in one spelling: keys sorted at every level, a number by its exact value (``1E2`` is ``100.0``;
    ``1e309`` is not ``1e400``, nor ``1.5e-400`` zero). Nothing else: the table's rules run before."""
    if isinstance(value, dict):
        return {k: normalize(value[k]) for k in sorted(value)}
    if isinstance(value, list):
        return [normalize(v) for v in value]
    if isinstance(value, Number):
        return _exact(value)
    return value


def _exact(n: Number) -> Any:
    """A number spelled unlike Python would write it, by its exact decimal value: the float whose shortest spelling
    has that value (``1E2`` → ``100.0``, ``0.10`` → ``0.1``), else a Number in one spelling per value (an exponent
    form Python never writes for a float or an int)."""
    d = Decimal(n.text)
    if n.text.lstrip("-").isdigit():  # an integer literal: -0 or past Python's digit limit
        return Number(f"{d:E}")  # keeps -0 apart from 0
    f = float(d)
    if math.isfinite(f) and Decimal(repr(f)) == d and (math.copysign(1.0, f) < 0) == d.is_signed():
        return f
    return Number(f"{d.normalize():E}")


_VALUE_MEMO: OrderedDict[tuple[str, tuple[int, ...], bytes], bytes] = OrderedDict()
_VALUE_MEMO_SIZE = [65_536]
#: Bytes of one memo entry (its key tuple and 16-byte hashes, the ordered dict's slot and link): measured with a
#: ``sys.getsizeof`` walk, rounded up.
VALUE_MEMO_ENTRY_BYTES = 300


def bound_value_memo(entries: int) -> None:
    """Remember at most ``entries`` meanings from now on (a memory budget's share), least recently used dropped."""
    _VALUE_MEMO_SIZE[0] = max(1, entries)
    while len(_VALUE_MEMO) > _VALUE_MEMO_SIZE[0]:
        _VALUE_MEMO.popitem(last=False)


def value_memo_bytes() -> int:
    """Estimated bytes of the meaning memo."""
    return len(_VALUE_MEMO) * VALUE_MEMO_ENTRY_BYTES


def value_digest(block: Block, api: str) -> bytes:
    """Digest of the meaning of ``block`` of a request in wire ``api`` (the module docstring): equal for two blocks
    exactly when the API reads them as the same. Memoised by the block's bytes and position class (a bounded LRU),
    so a tool list reshuffled every turn costs one lookup per tool."""
    rules = equivalences_at(api, block.path)
    key = (api, rules, block.digest)
    hit = _VALUE_MEMO.get(key)
    if hit is not None:
        _VALUE_MEMO.move_to_end(key)
        return hit
    try:
        env = parse(block.env) if block.env else None
        unit = block.unit()
        table = EQUIVALENCES[api] if rules else ()
        for i in rules:
            unit, env = table[i].apply(unit, env)
        out = digest(dumps(normalize(env)), encode_sorted(normalize(unit)).encode())
    except (RecursionError, InputError):  # too deep to read for meaning: equal only to the same bytes
        out = digest(b"bytes", block.digest)
    _VALUE_MEMO[key] = out
    if len(_VALUE_MEMO) > _VALUE_MEMO_SIZE[0]:
        _VALUE_MEMO.popitem(last=False)
    return out


def _message_blocks(req: CanonicalRequest, message: int) -> Iterator[Block]:
    return (b for b in req.blocks if b.message == message)


def message_value(req: CanonicalRequest, message: int) -> bytes:
    """Digest of a whole message's meaning: its blocks' values in order."""
    return digest(*(value_digest(b, req.api) for b in _message_blocks(req, message)))
