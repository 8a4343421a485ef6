"""Property-based fuzzing of the three pipeline routes through the real proxy app (issue 12).

Hypothesis generates sessions of odd request bodies (marker-named keys nested in schemas, tool inputs and content,
odd number spellings, duplicate keys, unicode, deep-ish nesting, non-object JSON, missing fields) and sends each
session's turns through the proxy (``httpx.ASGITransport``) to a recording fake upstream, turn after turn, so the
session's repairs kick in. For every body:

* what reaches the upstream is the client's bytes, or a body equal in meaning by this module's own reading of the
  APIs (:func:`meaning`): cache markers are ignored only where the APIs define them (Anthropic ``cache_control``
  on ``tools[i]``, ``system[i]``, ``messages[i].content[j]`` and the blocks nested in a ``tool_result``, plus the
  top-level one; OpenAI ``prompt_cache_breakpoint`` on message content parts), and agentcache's planned edits are
  allowed: a routing key (``prompt_cache_key``), the tools in another order, a string as a one-element text
  block, a tool call's ``arguments`` re-serialised; everything else, numbers by their exact decimal value and
  duplicate keys in order, must be the client's;
* agentcache never answers a 5xx of its own (nor raises out of the app);
* the proxy keeps serving: a plain follow-up request is forwarded and answered.

Bounded for CI (``max_examples``, no deadline, derandomized, no example database). Count failures by kind on any
checkout with ``python -m tests.test_fuzz_meaning --count 4000``.
"""

from __future__ import annotations

import asyncio
import json
import sys
from collections import Counter
from contextlib import AsyncExitStack
from dataclasses import dataclass
from decimal import Decimal
from typing import Any

import httpx
import pytest
from hypothesis import HealthCheck, given, settings
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
_SHAPED = ("content", "system", "instructions")  # a string here means a one-element text-block list


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


def meaning(route: str, value: Any, path: tuple[Any, ...] = ()) -> Any:
    """A hashable reading of a parsed value (see the module docstring)."""
    key, where = MARKERS[route]
    if isinstance(value, _Pairs):
        if len({k for k, _ in value}) != len(value):
            return ("dup", tuple((k, meaning(route, v, (*path, k))) for k, v in value))
        items: dict[str, Any] = {}
        for k, v in value:
            if k == key and _at(path, where):
                continue
            if k == "arguments" and isinstance(v, str):
                try:
                    items[k] = ("args", meaning(route, parse(v.encode()), (*path, k)))
                    continue
                except ValueError:
                    pass
            if k in _SHAPED and isinstance(v, str):
                v = _Pairs([("type", "text"), ("text", v)])
                items[k] = ("arr", (meaning(route, v, (*path, k, 0)),))
                continue
            items[k] = meaning(route, v, (*path, k))
        if items.get("type") in (("str", "input_text"), ("str", "output_text")):
            items["type"] = ("str", "text")
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
    return J(type="object", properties=Obj(tuple(props)))


@dataclass
class Session:
    """One generated session: its route and the raw body of each turn."""

    route: str
    turns: list[bytes]
    label: str


def _tool(route: str, name: str, schema: Obj, marker: bool) -> Obj:
    if route == "/v1/messages":
        t = J(name=name, description=f"{name} things", input_schema=schema)
        return t.set("cache_control", J(type="ephemeral")) if marker else t
    if route == "/v1/chat/completions":
        return J(type="function", function=J(name=name, description=f"{name} things", parameters=schema))
    return J(type="function", name=name, description=f"{name} things", parameters=schema)


def _user(route: str, text: str, marker: bool) -> Obj:
    key = "cache_control" if route == "/v1/messages" else "prompt_cache_breakpoint"
    kind = "input_text" if route == "/v1/responses" else "text"
    part = J(type=kind, text=text)
    if marker:
        part = part.set(key, J(type="ephemeral") if route == "/v1/messages" else J(mode="explicit"))
    return J(role="user", content=[part])


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
             "number_spelling", "move_marker", "shape", "dup_key")  # fmt: skip


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
            items = [*items, *_exchange(route, t, draw(st.sampled_from(names)), args, draw(words))]
            items.append(_user(route, draw(words), draw(st.booleans())))
            tools, items = _mutate(draw, route, draw(st.sampled_from(MUTATIONS)), tools, items)
        turns.append(
            text_of(_body(route, model, tools, system, [*items[:1], *deep, *items[1:]], extra), spaced).encode()
        )
    return Session(route, turns, odd)


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
    """One client habit between turns: some keep the meaning (agentcache may repair), some change it."""
    tools, items = list(tools), list(items)
    i = draw(st.integers(0, len(tools) - 1))
    k = draw(st.integers(0, len(items) - 1))
    if kind == "reorder_tools":
        tools.reverse()
    elif kind == "reserialise_tool":
        tools[i] = Obj(tuple(reversed(tools[i].pairs)))
    elif kind == "schema_marker_key":
        tools[i] = _edit_schema(route, tools[i], draw(st.booleans()))
    elif kind == "input_marker_value":
        items[k] = _swap_named(items[k])
    elif kind == "number_spelling":
        tools[i], items[k] = _swap_number(tools[i]), _swap_number(items[k])
    elif kind == "move_marker":
        items = [_unmark(route, m) for m in items]
        items[k] = _mark(route, items[k])
    elif kind == "shape":
        c = items[k].get("content")
        if isinstance(c, list) and len(c) == 1 and isinstance(c[0], Obj) and isinstance(c[0].get("text"), str):
            items[k] = items[k].set("content", c[0].get("text"))
    elif kind == "dup_key":
        items[k] = Obj((*items[k].pairs, items[k].pairs[-1]))
    return tools, items


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


@settings(
    max_examples=1000,
    deadline=None,
    derandomize=True,
    database=None,
    suppress_health_check=[HealthCheck.too_slow, HealthCheck.data_too_large],
)
@given(sessions())
def test_meaning_kept_and_proxy_serving(session: Session) -> None:
    assert harness().run(session) == []


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


def count(n: int) -> Counter[str]:
    """Failures by kind over ``n`` generated sessions (every example runs; nothing stops at the first failure)."""
    kinds: Counter[str] = Counter()
    bodies = Counter[str]()

    @settings(max_examples=n, deadline=None, derandomize=True, database=None, suppress_health_check=list(HealthCheck))
    @given(sessions())
    def probe(session: Session) -> None:
        bodies["sessions"] += 1
        bodies["bodies"] += len(session.turns)
        try:
            found = harness().run(session)
        except Exception as exc:
            found = [f"{session.label}: harness raised {type(exc).__name__}"]
        bodies["failing bodies"] += len(found)
        kinds.update(f.split(" (")[0] for f in found)

    probe()
    return bodies + kinds


def _main(argv: list[str]) -> None:
    n = int(argv[argv.index("--count") + 1]) if "--count" in argv else 4000
    for kind, k in sorted(count(n).items(), key=lambda x: -x[1]):
        print(f"{k:6d}  {kind}")


if __name__ == "__main__":
    _main(sys.argv[1:])
