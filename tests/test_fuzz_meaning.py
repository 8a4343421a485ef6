"""Property-based fuzzing of the three pipeline routes through the real proxy app (issue 12).

Hypothesis generates sessions of odd request bodies (marker-named keys nested in schemas, tool inputs and content,
odd number spellings, duplicate keys, unicode, deep-ish nesting, non-object JSON, missing fields; between turns the
client re-spells, re-shapes and re-types parts, schemas and argument strings) and sends each
session's turns through the proxy (``httpx.ASGITransport``) to a recording fake upstream, turn after turn, so the
session's repairs kick in. For every body:

* what reaches the upstream is the client's bytes, or a body equal in meaning by this module's own reading of the
  APIs (:func:`meaning`): cache markers are ignored only where the APIs define them (Anthropic ``cache_control``
  on ``tools[i]``, ``system[i]``, ``messages[i].content[j]`` and the blocks nested in a ``tool_result``, plus the
  top-level one; OpenAI ``prompt_cache_breakpoint`` on message content parts), and agentcache's planned edits are
  allowed: a routing key (``prompt_cache_key``), the tools in another order, and only the documented equivalences
  of their positions (a string as the one text part the API defines there, an OpenAI function call's
  ``arguments`` re-serialised; see :func:`meaning`); everything else, numbers by their exact decimal value, duplicate
  keys in order, a part's ``type`` (``text``/``input_text``/``output_text``), a tool input member named
  ``arguments``, must be the client's. Half the sessions stream;
* agentcache never answers a 5xx of its own (nor raises out of the app);
* the proxy keeps serving: a plain follow-up request is forwarded and answered.

Bounded for CI (:data:`CI_SESSIONS`, no deadline, derandomized: the same bodies every run, no example database).
Count failures by kind on any checkout with ``python -m tests.test_fuzz_meaning --count 4000 [--seed N]`` (another
seed, other bodies).
"""

from __future__ import annotations

import asyncio
import json
import re
import sys
from collections import Counter
from contextlib import AsyncExitStack
from dataclasses import dataclass
from decimal import Decimal
from typing import Any

import httpx
import pytest
from hypothesis import HealthCheck, given, settings
from hypothesis import seed as hypothesis_seed
from hypothesis import strategies as st

from agentcache._config import Settings
from tests.test_proxy_support import ANTHROPIC_KEY, FakeUpstream, ServerThread, proxy

# ---- JSON text with what Python objects cannot hold: number spellings, duplicate keys ---------------------------


@dataclass(frozen=True)
class Num:
    """A JSON number written exactly as ``text``."""

    text: str


@dataclass(frozen=True)
class Obj:
    """A JSON object as its members in order (a key may repeat)."""

    pairs: tuple[tuple[str, Any], ...]

    def get(self, key: str) -> Any:
        return next((v for k, v in reversed(self.pairs) if k == key), None)

    def set(self, key: str, value: Any) -> Obj:
        if any(k == key for k, _ in self.pairs):
            return Obj(tuple((k, value if k == key else v) for k, v in self.pairs))
        return Obj((*self.pairs, (key, value)))

    def without(self, key: str) -> Obj:
        return Obj(tuple((k, v) for k, v in self.pairs if k != key))


def J(**kw: Any) -> Obj:
    return Obj(tuple(kw.items()))


def text_of(value: Any, spaced: bool = False) -> str:
    """``value`` as JSON text (``Num``/``Obj`` as written; ``spaced``: ``", "`` and ``": "`` separators)."""
    comma, colon = (", ", ": ") if spaced else (",", ":")
    out: list[str] = []
    stack: list[Any] = [value]
    while stack:  # iterative: deep bodies are part of the point
        v = stack.pop()
        if isinstance(v, _Lit):
            out.append(v.s)
        elif isinstance(v, Num):
            out.append(v.text)
        elif isinstance(v, Obj):
            stack.append(_Lit("}"))
            for i, (k, x) in enumerate(reversed(v.pairs)):
                stack.append(x)
                stack.append(_Lit(json.dumps(k, ensure_ascii=False) + colon))
                if i < len(v.pairs) - 1:
                    stack.append(_Lit(comma))
            stack.append(_Lit("{"))
        elif isinstance(v, dict):
            stack.append(Obj(tuple(v.items())))
        elif isinstance(v, list | tuple):
            stack.append(_Lit("]"))
            for i, x in enumerate(reversed(v)):
                stack.append(x)
                if i < len(v) - 1:
                    stack.append(_Lit(comma))
            stack.append(_Lit("["))
        else:
            out.append(json.dumps(v, ensure_ascii=False))
    return "".join(out)


@dataclass(frozen=True)
class _Lit:
    s: str


# ---- the meaning of a wire body, read independently of agentcache ----------------------------------------------

#: Where each API defines its cache marker (paths from the body root; ``*`` is any index). Anthropic:
#: platform.claude.com/docs/en/build-with-claude/prompt-caching and the SDK's ``cache_control`` fields
#: (``ToolParam``, ``TextBlockParam``, ``ToolResultBlockParam`` and the blocks of its ``content``); OpenAI: the
#: ``prompt_cache_breakpoint`` content parts agentcache writes (gpt-5.6+).
MARKERS: dict[str, tuple[str, tuple[tuple[str, ...], ...]]] = {
    "/v1/messages": (
        "cache_control",
        (
            ("tools", "*"),
            ("system", "*"),
            ("messages", "*", "content", "*"),
            ("messages", "*", "content", "*", "content", "*"),
        ),
    ),
    "/v1/chat/completions": ("prompt_cache_breakpoint", (("messages", "*", "content", "*"),)),
    "/v1/responses": ("prompt_cache_breakpoint", (("input", "*", "content", "*"),)),
}


class _Pairs(list):  # type: ignore[type-arg]
    pass


def parse(raw: bytes) -> Any:
    """``raw`` parsed faithfully: objects as :class:`_Pairs`, numbers as ``Num``. Raises ValueError."""
    return json.loads(raw, object_pairs_hook=_Pairs, parse_float=Num, parse_int=Num, parse_constant=_no_constant)


def _no_constant(name: str) -> Any:
    raise ValueError(f"{name} is not JSON")


def _at(path: tuple[Any, ...], patterns: tuple[tuple[str, ...], ...]) -> bool:
    return any(
        len(p) == len(path) and all((q == "*" and isinstance(x, int)) or q == x for q, x in zip(p, path, strict=True))
        for p in patterns
    )


# The documented equivalences, read from the APIs' references independently of agentcache's table:
# * a string where the API takes a list of content parts is that list with one text part of the type the API
#   defines there: Anthropic ``system`` and ``messages[i].content`` (type ``text``), Chat ``messages[i].content``
#   (``text``), Responses ``input[i].content`` of a message (``input_text``; an assistant's ``output_text``), and a
#   Responses ``input`` string is one user message;
# * an OpenAI function call's ``arguments`` is a JSON text, read by its value: Chat ``tool_calls[j].function`` of a
#   ``function`` call and the deprecated ``function_call``, a Responses ``function_call`` item.
# Nothing else: ``text``/``input_text``/``output_text`` stay three types, a key named ``arguments`` elsewhere is text.


def _get(obj: _Pairs, key: str) -> Any:
    return next((v for k, v in reversed(obj) if k == key), None)


def _put(obj: _Pairs, key: str, value: Any) -> _Pairs:
    return _Pairs((k, value if k == key else v) for k, v in obj)


def _part(kind: str, text: str) -> _Pairs:
    return _Pairs([("type", kind), ("text", text)])


def _args(obj: _Pairs) -> _Pairs:
    value = _get(obj, "arguments")
    if not isinstance(value, str):
        return obj
    try:
        return _put(obj, "arguments", _Args(parse(value.encode())))
    except ValueError:
        return obj


@dataclass(frozen=True)
class _Args:
    """An ``arguments`` string read as the JSON value it holds."""

    value: Any


def _call_args(call: Any) -> Any:
    """A Chat tool call with its function's ``arguments`` read as JSON (``function`` calls only)."""
    fn = _get(call, "function") if isinstance(call, _Pairs) and _get(call, "type") == "function" else None
    return _put(call, "function", _args(fn)) if isinstance(fn, _Pairs) else call


def _documented(route: str, path: tuple[Any, ...], obj: _Pairs) -> _Pairs:
    """``obj`` (at ``path``) with the documented equivalences of its position applied (see above)."""
    if len(path) != 2 or path[0] not in ("messages", "input") or not isinstance(path[1], int):
        return obj
    content, role = _get(obj, "content"), _get(obj, "role")
    if isinstance(content, str) and role is not None:
        kind = "text" if route != "/v1/responses" else "output_text" if role == "assistant" else "input_text"
        obj = _put(obj, "content", [_part(kind, content)])
    if route == "/v1/chat/completions":
        calls = _get(obj, "tool_calls")
        if isinstance(calls, list):
            obj = _put(obj, "tool_calls", [_call_args(c) for c in calls])
        legacy = _get(obj, "function_call")
        if isinstance(legacy, _Pairs):
            obj = _put(obj, "function_call", _args(legacy))
    if route == "/v1/responses" and _get(obj, "type") == "function_call":
        obj = _args(obj)
    return obj


def _root(route: str, body: _Pairs) -> _Pairs:
    """The body with its top-level documented equivalences applied."""
    if route == "/v1/messages" and isinstance(_get(body, "system"), str):
        return _put(body, "system", [_part("text", _get(body, "system"))])
    if route == "/v1/responses" and isinstance(_get(body, "input"), str):
        return _put(body, "input", [_Pairs([("role", "user"), ("content", _get(body, "input"))])])
    return body


def meaning(route: str, value: Any, path: tuple[Any, ...] = ()) -> Any:
    """A hashable reading of a parsed value at ``path`` of a body (see the module docstring)."""
    key, where = MARKERS[route]
    if isinstance(value, _Args):
        return ("args", meaning(route, value.value, (*path, "$")))
    if isinstance(value, _Pairs):
        if len({k for k, _ in value}) != len(value):
            return ("dup", tuple((k, meaning(route, v, (*path, k))) for k, v in value))
        value = _documented(route, path, value)
        items = {k: meaning(route, v, (*path, k)) for k, v in value if not (k == key and _at(path, where))}
        return ("obj", frozenset(items.items()))
    if isinstance(value, list):
        return ("arr", tuple(meaning(route, v, (*path, i)) for i, v in enumerate(value)))
    if isinstance(value, Num):
        d = Decimal(value.text)
        return ("num", "int" if value.text.lstrip("-").isdigit() else "float", d, d.is_signed())
    return (type(value).__name__, value)


def same_meaning(route: str, client: bytes, sent: bytes) -> str | None:
    """None when ``sent`` carries the meaning of ``client`` (planned edits allowed), else why not."""
    if client == sent:
        return None
    old = sys.getrecursionlimit()
    sys.setrecursionlimit(max(old, 20_000))  # deep bodies: this reading recurses (a few thousand levels at most)
    try:
        return _compare(route, client, sent)
    finally:
        sys.setrecursionlimit(old)


def _compare(route: str, client: bytes, sent: bytes) -> str | None:
    try:
        c, s = parse(client), parse(sent)
    except ValueError as exc:
        return f"upstream got unparseable JSON ({exc})"
    if not isinstance(c, _Pairs) or not isinstance(s, _Pairs):
        return "a non-object body was rewritten"
    c, s = _root(route, c), _root(route, s)
    free = {"prompt_cache_key"} | ({"cache_control"} if route == "/v1/messages" else set())
    cp = [(k, v) for k, v in c if k not in free]
    sp = [(k, v) for k, v in s if k not in free]
    if [k for k, _ in cp] != [k for k, _ in sp] and (
        len({k for k, _ in cp}) != len(cp) or sorted(k for k, _ in cp) != sorted(k for k, _ in sp)
    ):
        return f"top-level keys changed: {[k for k, _ in cp]} -> {[k for k, _ in sp]}"
    for (k, cv), (_, sv) in zip(sorted(cp, key=lambda p: p[0]), sorted(sp, key=lambda p: p[0]), strict=True):
        if k == "tools" and isinstance(cv, list) and isinstance(sv, list):
            a = Counter(meaning(route, t, ("tools", 0)) for t in cv)
            b = Counter(meaning(route, t, ("tools", 0)) for t in sv)
            if a != b:
                return "tools changed meaning"
            continue
        if meaning(route, cv, (k,)) != meaning(route, sv, (k,)):
            return f"{k} changed meaning"
    return None


# ---- generated bodies ----------------------------------------------------------------------------------------

ODD_NUMBERS = ("1e309", "-1e309", "1E2", "1e2", "100.0", "1.5e-400", "-0", "0", "0.10", "0.1", "1e-7", "1e-07",
               "123456789012345678901234567890", "2.50", "1.0000000000000000000001", "-0.0", "1E+2", "3")  # fmt: skip
MARKER_NAMES = ("cache_control", "prompt_cache_breakpoint")
TEXT_TYPES = ("text", "input_text", "output_text")
NAMED_VALUES = ("max-age=0", "no-cache", "ephemeral", "")

numbers = st.one_of(
    st.sampled_from(ODD_NUMBERS), st.integers(-(10**20), 10**20).map(str), st.floats(allow_nan=False).map(repr)
).map(lambda t: Num("1e309" if t in ("inf", "-inf") else t))
keys = st.one_of(st.sampled_from((*MARKER_NAMES, "type", "text", "a", "content", "ttl")), st.text(max_size=4))
leaves = st.one_of(
    st.none(),
    st.booleans(),
    numbers,
    st.text(max_size=6),
    st.sampled_from(NAMED_VALUES),
    st.just({"type": "ephemeral"}),
)
values = st.recursive(
    leaves,
    lambda inner: st.one_of(
        st.lists(inner, max_size=3), st.lists(st.tuples(keys, inner), max_size=3).map(lambda p: Obj(tuple(p)))
    ),
    max_leaves=6,
)
words = st.one_of(
    st.sampled_from(("hi", "Flight HAT001.", "é ü 🚀", "\u2028x\u0000")), st.text(min_size=1, max_size=12)
)
TOOL_NAMES = ("lookup", "book", "cancel")


@st.composite
def schemas(draw: st.DrawFn) -> Obj:
    props = draw(st.lists(st.tuples(st.sampled_from(("q", "cache_control", "prompt_cache_breakpoint", "n")), values),
                          max_size=3))  # fmt: skip
    if draw(st.booleans()):
        props.append(("p", J(type=draw(st.sampled_from(TEXT_TYPES)))))
    return J(type="object", properties=Obj(tuple(props)))


@dataclass
class Session:
    """One generated session: its route and the raw body of each turn; ``named``: the client names the session
    (``x-agentcache-session``), so its turns stay one session whatever it edits in the history."""

    route: str
    turns: list[bytes]
    label: str
    named: bool = False


def _tool(route: str, name: str, schema: Obj, marker: bool) -> Obj:
    if route == "/v1/messages":
        t = J(name=name, description=f"{name} things", input_schema=schema)
        return t.set("cache_control", J(type="ephemeral")) if marker else t
    if route == "/v1/chat/completions":
        return J(type="function", function=J(name=name, description=f"{name} things", parameters=schema))
    return J(type="function", name=name, description=f"{name} things", parameters=schema)


def _user(route: str, text: str, marker: bool | None) -> Obj:
    """A user message: its text as one part (``marker``: carrying a marker), or as a string (``marker`` None)."""
    if marker is None:
        return J(role="user", content=text)
    key = "cache_control" if route == "/v1/messages" else "prompt_cache_breakpoint"
    kind = "input_text" if route == "/v1/responses" else "text"
    part = J(type=kind, text=text)
    if marker:
        part = part.set(key, J(type="ephemeral") if route == "/v1/messages" else J(mode="explicit"))
    return J(role="user", content=[part])


def _reply(route: str, text: str) -> Obj:
    """An assistant's text reply, in the form each API's clients send it back."""
    if route == "/v1/messages":
        return J(role="assistant", content=[J(type="text", text=text)])
    if route == "/v1/chat/completions":
        return J(role="assistant", content=text)
    return J(role="assistant", content=[J(type="output_text", text=text)])


def _exchange(route: str, i: int, name: str, args: Any, result: Any) -> list[Obj]:
    """An assistant tool call (``args`` its input) and its result."""
    cid = f"call_{i}"
    if route == "/v1/messages":
        return [
            J(role="assistant", content=[J(type="tool_use", id=cid, name=name, input=args)]),
            J(role="user", content=[J(type="tool_result", tool_use_id=cid, content=[J(type="text", text=result)])]),
        ]
    arg_text = text_of(args)
    if route == "/v1/chat/completions":
        call = J(id=cid, type="function", function=J(name=name, arguments=arg_text))
        return [J(role="assistant", content=None, tool_calls=[call]), J(role="tool", tool_call_id=cid, content=result)]
    return [J(type="function_call", call_id=cid, name=name, arguments=arg_text),
            J(type="function_call_output", call_id=cid, output=result)]  # fmt: skip


def _body(route: str, model: str, tools: list[Obj], system: str, items: list[Obj], extra: list[Any]) -> Obj:
    if route == "/v1/messages":
        return Obj((("model", model), ("max_tokens", Num("64")), ("system", system), ("tools", tools),
                    ("messages", items), *extra))  # fmt: skip
    if route == "/v1/chat/completions":
        return Obj((("model", model), ("tools", tools),
                    ("messages", [J(role="system", content=system), *items]), *extra))  # fmt: skip
    return Obj((("model", model), ("tools", tools), ("instructions", system), ("input", items), *extra))


MUTATIONS = ("none", "reorder_tools", "reserialise_tool", "schema_marker_key", "input_marker_value",
             "number_spelling", "move_marker", "shape", "unshape", "dup_key", "retype_part", "retype_schema",
             "respell_arguments")  # fmt: skip


def _deep(depth: int) -> Any:
    v: Any = Num("1")
    for _ in range(depth):
        v = J(a=v)
    return v


@st.composite
def sessions(draw: st.DrawFn) -> Session:
    route = draw(st.sampled_from(tuple(MARKERS)))
    odd = draw(st.sampled_from(("plain",) * 12 + ("non_object", "missing", "deep", "nan", "top_dup")))
    model = {"/v1/messages": "claude-sonnet-4-5"}.get(route) or draw(st.sampled_from(("gpt-4o", "gpt-5.6")))
    if odd == "non_object":
        return Session(route, [draw(st.sampled_from((b"[1,2]", b'"x"', b"5", b"null", b"[]")))], odd)
    names = draw(st.lists(st.sampled_from(TOOL_NAMES), min_size=1, max_size=3, unique=True))
    tools = [_tool(route, n, draw(schemas()), draw(st.booleans())) for n in names]
    system = draw(st.sampled_from(("You are a travel agent.", "Be brief. " * 20)))
    items: list[Obj] = [_user(route, draw(words), draw(st.booleans()))]
    extra: list[Any] = []
    if draw(st.booleans()):
        extra.append(("temperature", draw(numbers)))
    if route != "/v1/messages" and draw(st.booleans()):
        extra.append(("prompt_cache_key", draw(st.sampled_from(("k1", "k2")))))
    if draw(st.booleans()):
        extra.append(("stream", True))
    if odd == "missing":
        body = _body(route, model, tools, system, items, extra)
        field = "messages" if route != "/v1/responses" else "input"
        return Session(route, [text_of(body.without(field).without("model")).encode()], odd)
    deep: list[Obj] = []  # kept out of the mutations below (they recurse), always at the same place
    if odd == "deep":
        deep = [_exchange(route, 99, names[0], J(x=_deep(draw(st.integers(900, 1400)))), "ok")[0]]
    if odd == "nan":
        extra.append(("temperature", Num(draw(st.sampled_from(("NaN", "Infinity", "-Infinity"))))))
    if odd == "top_dup":
        extra.append(("max_tokens" if route == "/v1/messages" else "model", Num("32") if route == "/v1/messages"
                      else model))  # fmt: skip
    turns: list[bytes] = []
    spaced = draw(st.booleans())
    for t in range(draw(st.integers(1, 4))):
        if t:
            args = draw(values)
            if draw(st.booleans()):
                args = J(cache_control=draw(st.sampled_from(NAMED_VALUES)), q=draw(numbers))
            elif draw(st.booleans()):  # a tool input member named like OpenAI's argument string: content
                args = J(arguments=text_of(J(n=draw(numbers), s=draw(words))))
            items = [*items, *_exchange(route, t, draw(st.sampled_from(names)), args, draw(words))]
            if draw(st.booleans()):
                items.append(_reply(route, draw(words)))
            items.append(_user(route, draw(words), draw(st.sampled_from((True, False, None)))))
            tools, items = _mutate(draw, route, draw(st.sampled_from(MUTATIONS)), tools, items)
        turns.append(
            text_of(_body(route, model, tools, system, [*items[:1], *deep, *items[1:]], extra), spaced).encode()
        )
    return Session(route, turns, odd, draw(st.booleans()))


def _swap_number(v: Any) -> Any:
    alt = {"1e309": "1e400", "1E2": "100.0", "100.0": "1e2", "1.5e-400": "0.0", "-0": "0", "0.10": "0.1",
           "1e-7": "1e-07", "2.50": "2.5", "-0.0": "0.0"}  # fmt: skip
    if isinstance(v, Num):
        return Num(alt.get(v.text, v.text))
    if isinstance(v, Obj):
        return Obj(tuple((k, _swap_number(x)) for k, x in v.pairs))
    if isinstance(v, list):
        return [_swap_number(x) for x in v]
    return v


def _swap_named(v: Any) -> Any:
    if isinstance(v, str) and v in NAMED_VALUES:
        return NAMED_VALUES[(NAMED_VALUES.index(v) + 1) % len(NAMED_VALUES)]
    if isinstance(v, Obj):
        return Obj(tuple((k, _swap_named(x)) for k, x in v.pairs))
    if isinstance(v, list):
        return [_swap_named(x) for x in v]
    return v


def _mutate(draw: st.DrawFn, route: str, kind: str, tools: list[Obj], items: list[Obj]) -> tuple[list[Obj], list[Obj]]:
    """One client habit between turns: some keep the meaning (agentcache may repair), some change it. An edit of one
    unit goes to a unit it changes, when there is one."""
    tools, items = list(tools), list(items)
    i = draw(st.integers(0, len(tools) - 1))
    k = draw(st.integers(0, len(items) - 1))
    part = draw(st.sampled_from(TEXT_TYPES))
    spaced = draw(st.booleans())
    edits = {
        "input_marker_value": _swap_named,
        "shape": _shaped,
        "unshape": lambda m: _unshaped(m, part),
        "retype_part": lambda m: _retype(m, part),
        "respell_arguments": lambda m: _respell(m, spaced),
        "dup_key": lambda m: Obj((*m.pairs, m.pairs[-1])),
    }
    if kind in edits:
        edit = edits[kind]
        changed = [j for j, m in enumerate(items) if text_of(edit(m)) != text_of(m)]
        k = draw(st.sampled_from(changed)) if changed else k
        items[k] = edit(items[k])
    elif kind == "reorder_tools":
        tools.reverse()
    elif kind == "reserialise_tool":
        tools[i] = Obj(tuple(reversed(tools[i].pairs)))
    elif kind == "schema_marker_key":
        tools[i] = _edit_schema(route, tools[i], draw(st.booleans()))
    elif kind == "number_spelling":
        tools[i], items[k] = _swap_number(tools[i]), _swap_number(items[k])
    elif kind == "move_marker":
        items = [_unmark(route, m) for m in items]
        items[k] = _mark(route, items[k])
    elif kind == "retype_schema":
        changed = [j for j, t in enumerate(tools) if text_of(_retype(t, part)) != text_of(t)]
        i = draw(st.sampled_from(changed)) if changed else i
        tools[i] = _retype(tools[i], part)
    return tools, items


def _shaped(msg: Obj) -> Obj:
    """A one-part content list as its string."""
    c = msg.get("content")
    if isinstance(c, list) and len(c) == 1 and isinstance(c[0], Obj) and isinstance(c[0].get("text"), str):
        return msg.set("content", c[0].get("text"))
    return msg


def _unshaped(msg: Obj, part: str) -> Obj:
    """A string content as a one-part list of type ``part`` (the one the API defines there, or not)."""
    c = msg.get("content")
    return msg.set("content", [J(type=part, text=c)]) if isinstance(c, str) else msg


def _retype(v: Any, kind: str) -> Any:
    """``v`` with every ``type`` that names a text part (at any depth: content parts, schema nodes) set to ``kind``."""
    if isinstance(v, Obj):
        return Obj(tuple((k, kind if k == "type" and x in TEXT_TYPES else _retype(x, kind)) for k, x in v.pairs))
    if isinstance(v, list):
        return [_retype(x, kind) for x in v]
    return v


def _respell(v: Any, spaced: bool) -> Any:
    """``v`` with every string under a key named ``arguments`` (at any depth) written again: spaced out, or with
    its numbers spelled otherwise."""
    if isinstance(v, Obj):
        out = []
        for k, x in v.pairs:
            if k == "arguments" and isinstance(x, str):
                try:
                    doc = _as_obj(parse(x.encode()))
                except ValueError:
                    out.append((k, x))
                    continue
                x = " " + text_of(doc, spaced=True) + " " if spaced else text_of(_swap_number(doc))
            else:
                x = _respell(x, spaced)
            out.append((k, x))
        return Obj(tuple(out))
    if isinstance(v, list):
        return [_respell(x, spaced) for x in v]
    return v


def _as_obj(v: Any) -> Any:
    """A faithful parse (:func:`parse`) as generator values (``Obj``/``Num``)."""
    if isinstance(v, _Pairs):
        return Obj(tuple((k, _as_obj(x)) for k, x in v))
    if isinstance(v, list):
        return [_as_obj(x) for x in v]
    return v


def _edit_schema(route: str, tool: Obj, add: bool) -> Obj:
    field = "input_schema" if route == "/v1/messages" else "parameters"
    holder = tool.get("function") if route == "/v1/chat/completions" else tool
    schema = holder.get(field)
    props = schema.get("properties")
    props = props.set("cache_control", J(type="string")) if add else props.without("cache_control")
    holder = holder.set(field, schema.set("properties", props))
    return tool.set("function", holder) if route == "/v1/chat/completions" else holder


def _marker_key(route: str) -> str:
    return MARKERS[route][0]


def _unmark(route: str, msg: Obj) -> Obj:
    c = msg.get("content")
    if not isinstance(c, list):
        return msg
    return msg.set("content", [p.without(_marker_key(route)) if isinstance(p, Obj) else p for p in c])


def _mark(route: str, msg: Obj) -> Obj:
    c = msg.get("content")
    if not isinstance(c, list) or not c or not isinstance(c[-1], Obj):
        return msg
    value = J(type="ephemeral") if route == "/v1/messages" else J(mode="explicit")
    return msg.set("content", [*c[:-1], c[-1].set(_marker_key(route), value)])


# ---- driving the proxy ---------------------------------------------------------------------------------------


class Upstream(FakeUpstream):
    """The recording fake upstream, answering any body a real provider would: its own 400 for a body it cannot
    read (invalid JSON, or nested past what the fake's Python reading can follow), else the usual answer."""

    def _generate(self, seen: Any) -> httpx.Response:
        try:
            return super()._generate(seen)
        except (ValueError, RecursionError, AttributeError, TypeError):
            return httpx.Response(400, json={"type": "error", "error": {"type": "invalid_request_error"}})


class Harness:
    """Two proxies (Anthropic and OpenAI upstreams) kept running on one event loop across examples, so sessions
    (and the scope's tool memory) carry over between examples as they do in a long-lived proxy."""

    def __init__(self) -> None:
        self.loop = asyncio.new_event_loop()
        self.stack = AsyncExitStack()
        self.clients: dict[str, tuple[httpx.AsyncClient, FakeUpstream]] = {}
        self.serial = 0
        self.loop.run_until_complete(self._start())

    async def _start(self) -> None:
        for kind in ("anthropic", "openai"):
            client, _state, fake = await self.stack.enter_async_context(proxy(Upstream(), upstream=kind))
            self.clients[kind] = (client, fake)

    def run(self, session: Session) -> list[str]:
        return self.loop.run_until_complete(self._run(session))

    async def _run(self, session: Session) -> list[str]:
        kind = "anthropic" if session.route == "/v1/messages" else "openai"
        client, fake = self.clients[kind]
        headers = {"content-type": "application/json"}
        headers.update({"x-api-key": ANTHROPIC_KEY} if kind == "anthropic" else {"authorization": "Bearer sk-fuzz"})
        if session.named:
            self.serial += 1
            headers["x-agentcache-session"] = f"fuzz-{self.serial}"
        failures: list[str] = []
        for raw in session.turns:
            seen = len(fake.requests)
            try:
                r = await client.post(session.route, content=raw, headers=headers)
            except Exception as exc:  # the app raised: an own 500 under a real server
                failures.append(f"{session.label}: app raised {type(exc).__name__}")
                continue
            got = fake.requests[seen:]
            if r.status_code >= 500 and not got:
                failures.append(f"{session.label}: own {r.status_code}")
            if got:
                why = same_meaning(session.route, raw, got[-1].body)
                if why is not None:
                    failures.append(f"{session.label}: {why}")
            elif r.status_code < 400:
                failures.append(f"{session.label}: answered {r.status_code} without forwarding")
        follow = {"/v1/messages": {"model": "claude-sonnet-4-5", "max_tokens": 8, "messages": [
            {"role": "user", "content": "ping"}]}}.get(session.route) or {"model": "gpt-4o", "messages": [
            {"role": "user", "content": "ping"}]}  # fmt: skip
        if session.route == "/v1/responses":
            follow = {"model": "gpt-4o", "input": "ping"}
        try:
            r = await client.post(session.route, json=follow, headers=headers)
            if r.status_code != 200:
                failures.append(f"{session.label}: follow-up answered {r.status_code}")
        except Exception as exc:
            failures.append(f"{session.label}: follow-up raised {type(exc).__name__}")
        del fake.requests[:-8]  # bounded memory over thousands of examples
        return failures


_HARNESS: Harness | None = None


def harness() -> Harness:
    global _HARNESS
    if _HARNESS is None:
        _HARNESS = Harness()
    return _HARNESS


STREAM = re.compile(rb'"stream"\s*:\s*true')
#: Sessions of the CI run: about 2,600 bodies (each session has 1-4 turns), every route streaming and not.
CI_SESSIONS = 1100


def test_meaning_kept_and_proxy_serving() -> None:
    """The CI run (seeded): at least 2,000 bodies across the three APIs, streaming and not, each forwarded with its
    meaning by :func:`meaning` (which knows only the documented repairs), no own 5xx, the proxy serving after each
    session."""
    found, failures = count(CI_SESSIONS)
    assert failures == [], f"{found['failing bodies']} failing bodies: {failures[:10]}"
    assert found["bodies"] >= 2000
    for route in MARKERS:
        for stream in (True, False):
            assert found[f"{route} stream={stream}"] >= 150, (route, stream, found)


@pytest.mark.parametrize("depth", [980, 5000])
def test_deep_body_forwarded_unchanged_and_the_connection_kept(depth: int) -> None:
    """A body nested past what Python's parser reads is forwarded as sent (fail open: it may well be valid JSON,
    and the upstream is the judge of a body agentcache cannot plan), under uvicorn, and the next request on the
    same keep-alive connection is served."""
    import http.client

    from agentcache.proxy import ProxyConfig, create_app

    fake = Upstream()
    app = create_app(ProxyConfig(), settings=Settings(), transport=fake.transport())
    deep = "[" * depth + "]" * depth
    raw = ('{"model":"claude-sonnet-4-5","max_tokens":8,"messages":[{"role":"user","content":[{"type":"tool_result",'
           '"tool_use_id":"t","content":"x","extra":' + deep + "}]}]}").encode()  # fmt: skip
    plain = json.dumps({"model": "claude-sonnet-4-5", "max_tokens": 8, "messages": [{"role": "user", "content": "hi"}]})
    headers = {"content-type": "application/json", "x-api-key": ANTHROPIC_KEY}
    with ServerThread(app) as server:
        conn = http.client.HTTPConnection("127.0.0.1", server.port, timeout=20)
        conn.request("POST", "/v1/messages", body=raw, headers=headers)
        first = conn.getresponse()
        first.read()
        sock = conn.sock
        conn.request("POST", "/v1/messages", body=plain, headers=headers)
        second = conn.getresponse()
        assert second.status == 200 and json.loads(second.read())["type"] == "message"
        assert conn.sock is sock  # the same connection
        conn.close()
    assert first.status == 400  # the fake upstream's own answer (it cannot read that deep either)
    assert first.getheader("x-agentcache-session") is None
    assert [r.body for r in fake.requests] == [raw, fake.requests[1].body]


def count(n: int, seed: int | None = None) -> tuple[Counter[str], list[str]]:
    """Over ``n`` generated sessions (every example runs; nothing stops at the first failure): counts (sessions,
    bodies, bodies per route and stream flag, failing bodies, failures by kind) and the failures. ``seed``: None
    for hypothesis' derandomized run (the same every time), else that seed."""
    counts: Counter[str] = Counter()
    failures: list[str] = []

    @settings(max_examples=n, deadline=None, derandomize=seed is None, database=None,
              suppress_health_check=list(HealthCheck))  # fmt: skip
    @given(sessions())
    def probe(session: Session) -> None:
        counts["sessions"] += 1
        counts["bodies"] += len(session.turns)
        for raw in session.turns:
            streamed = STREAM.search(raw) is not None
            counts[f"{session.route} stream={streamed}"] += 1
        try:
            found = harness().run(session)
        except Exception as exc:
            found = [f"{session.label}: harness raised {type(exc).__name__}"]
        counts["failing bodies"] += len(found)
        counts.update(f.split(" (")[0] for f in found)
        failures.extend(found)

    (probe if seed is None else hypothesis_seed(seed)(probe))()
    return counts, failures


def _main(argv: list[str]) -> None:
    n = int(argv[argv.index("--count") + 1]) if "--count" in argv else 4000
    seed = int(argv[argv.index("--seed") + 1]) if "--seed" in argv else None
    counts, _ = count(n, seed)
    for kind, k in sorted(counts.items(), key=lambda x: -x[1]):
        print(f"{k:6d}  {kind}")


if __name__ == "__main__":
    _main(sys.argv[1:])
