"""One pipeline turn in process (issue 26, "do less per turn"): the proxy app driven over ASGI with a mock upstream
transport, so only agentcache's own per-request work is measured (no sockets, no server).

Run: ``python benchmarks/turn_profile.py [--api anthropic|openai] [--size BYTES] [--turns N] [--redis URL]
[--profile N [--sort tottime]] [--compare A,B]``.

* default: ms per turn, elapsed (``wall``) and the thread's CPU time (``cpu``: the work itself, steady on a busy
  machine), median and mean over ``--turns`` turns of 10-turn conversations of ``--size``-byte bodies grown from
  the tau-bench airline trajectories (the first 20 turns warm up), with the log line written at ``info`` (the
  console renderer, as ``agentcache proxy`` writes it) to ``/dev/null``; ``cpu-first``: the same for the
  conversations' first turns alone (each continues the conversation before it as a ``messages.compacted`` break, as
  session inference reads ``proxy_bench.py``'s conversations; with ``--interleave`` most are new sessions);
  ``cpu-before`` / ``cpu-before-first``: the thread's CPU time until the mock upstream got the request (what the
  request waits for), every turn / first turns;
* ``--api openai``: the same conversations as Chat Completions bodies on ``/v1/chat/completions``;
* ``--redis URL``: the session store in Redis (a private key prefix per app, deleted after);
* ``--profile N``: cProfile of the same turns, the ``N`` costliest functions (``--sort``, default cumulative);
* ``--diagnose-pair``: the diagnosis of one divergent pair alone, before and after (thread CPU, alternating);
* ``--parts``: the thread CPU per turn of each step after the last byte (:data:`PARTS`; each includes what it
  calls), run from each checkout for a before / after of that part of the turn;
* ``--compare A,B``: two apps, one per named variant (see :func:`_variants`), driven turn by turn on the same
  bodies, each going first on half of the turns of every kind (the second finds the process-wide memos warm);
  prints B / A of the medians, 90th percentiles and means, per clock: a change measured before and after in one
  run.
"""

from __future__ import annotations

import argparse
import asyncio
import contextlib
import cProfile
import importlib
import inspect
import io
import json
import logging
import os
import pstats
import statistics
import sys
import time
import uuid
from collections.abc import Callable, Iterator
from pathlib import Path
from typing import Any

import httpx

sys.path.insert(0, str(Path(__file__).resolve().parent))
sys.path.insert(0, str(Path(__file__).resolve().parent.parent))  # the reference classifier in tests/
from proxy_bench import _CHUNKS, Conversations

from agentcache._log_output import configure_logging
from agentcache.proxy import ProxyConfig, create_app
from tests.test_diagnose_reference import reference as _classify_messages_before

_OPENAI_CHUNKS = [
    b'data: {"id":"c1","object":"chat.completion.chunk","model":"gpt-4o","choices":[{"index":0,"delta":'
    b'{"role":"assistant","content":"Sure,"}}]}\n\n',
    b'data: {"id":"c1","object":"chat.completion.chunk","model":"gpt-4o","choices":[{"index":0,"delta":'
    b'{"content":" I can help."},"finish_reason":"stop"}]}\n\n',
    b'data: {"id":"c1","object":"chat.completion.chunk","model":"gpt-4o","choices":[],"usage":{"prompt_tokens":'
    b'11400,"completion_tokens":4,"total_tokens":11404,"prompt_tokens_details":{"cached_tokens":11008}}}\n\n',
    b"data: [DONE]\n\n",
]
ROUTES = {"anthropic": "/v1/messages", "openai": "/v1/chat/completions"}
#: The steps after the last byte ``--parts`` times: (module, function or ``Class.method``).
PARTS = (
    ("agentcache.proxy._finish", "_report"),
    ("agentcache.proxy._finish", "count_response"),
    ("agentcache.session._turn", "Turn.finish"),
    ("agentcache.proxy._live", "LiveReport.record"),
    ("agentcache.analysis._ledger", "Ledger.record"),
    ("agentcache.simulate._anthropic", "AnthropicSimulator.run"),
    ("agentcache.session._metrics", "PrometheusSink.__call__"),
    ("agentcache.session._metrics", "PrometheusSink.record"),
    ("agentcache.proxy._finish", "_log_request"),
    ("agentcache._logview", "short_form"),
    ("structlog.dev", "ConsoleRenderer.__call__"),
)


def _openai(body: bytes) -> bytes:
    """An Anthropic benchmark body as the same conversation in OpenAI Chat Completions."""
    doc = json.loads(body)
    msgs: list[dict[str, Any]] = [{"role": "system", "content": doc["system"]}]
    msgs += [{"role": m["role"], "content": m["content"][0]["text"]} for m in doc["messages"]]
    tools = [
        {"type": "function", "function": {"name": t["name"], "description": t["description"],
                                          "parameters": t["input_schema"]}}
        for t in doc["tools"]
    ]  # fmt: skip
    out = {"model": "gpt-4o", "stream": True, "stream_options": {"include_usage": True}, "tools": tools}
    return json.dumps({**out, "messages": msgs}).encode()


def bodies(api: str, size: int, turns: int, interleave: int = 1) -> list[list[bytes]]:
    """``turns`` request bodies of about ``size`` bytes, as 10-turn conversations, each of stream (agent) ``k``
    modulo ``interleave`` (see :func:`_order`)."""
    convs = Conversations(size)
    out: list[list[bytes]] = []
    while sum(map(len, out)) < turns:
        conv = convs.session(len(out) % interleave)
        out.append([_openai(b) for b in conv] if api == "openai" else conv)
    return out


def _order(convs: list[list[bytes]], interleave: int) -> Iterator[tuple[int, int, bytes]]:
    """``(conversation, turn, body)`` in the order sent: conversation by conversation, or ``interleave``
    conversations in flight at once, turn by turn in rotation (as many agents on their own connections)."""
    for start in range(0, len(convs), interleave):
        group = list(enumerate(convs[start : start + interleave], start))
        for t in range(max(len(conv) for _, conv in group)):
            yield from ((c, t, conv[t]) for c, conv in group if t < len(conv))


#: The thread's CPU time when the mock upstream last got a request (``cpu-before``: a turn's work before the call).
_REACHED = [0.0]


def _upstream(api: str) -> httpx.MockTransport:
    chunks = _OPENAI_CHUNKS if api == "openai" else _CHUNKS
    payload = b"".join(chunks)

    async def handler(request: httpx.Request) -> httpx.Response:
        _REACHED[0] = time.thread_time()
        await request.aread()
        return httpx.Response(200, headers={"content-type": "text/event-stream"}, content=payload)

    return httpx.MockTransport(handler)


async def _call(app: Any, path: str, body: bytes) -> int:
    """One request through the ASGI app; the response status (the whole body drained)."""
    scope = {
        "type": "http", "asgi": {"version": "3.0"}, "http_version": "1.1", "method": "POST", "scheme": "http",
        "path": path, "raw_path": path.encode(), "query_string": b"", "root_path": "",
        "headers": [(b"host", b"127.0.0.1"), (b"content-type", b"application/json"),
                    (b"content-length", str(len(body)).encode()), (b"x-api-key", b"k"),
                    (b"authorization", b"Bearer k")],
        "client": ("127.0.0.1", 5000), "server": ("127.0.0.1", 8080),
    }  # fmt: skip
    sent = False
    status = 0

    async def receive() -> dict[str, Any]:
        nonlocal sent
        if not sent:
            sent = True
            return {"type": "http.request", "body": body, "more_body": False}
        await asyncio.sleep(3600)
        return {"type": "http.disconnect"}

    async def send(message: dict[str, Any]) -> None:
        nonlocal status
        if message["type"] == "http.response.start":
            status = message["status"]

    await app(scope, receive, send)
    return status


@contextlib.contextmanager
def _quiet_log() -> Iterator[None]:
    """The proxy's log line at ``info``, rendered as the CLI configures it, written to /dev/null."""
    with open(os.devnull, "w") as null, contextlib.redirect_stderr(null):
        configure_logging("console", "info")
        yield


def _whole_snapshot(doc: dict[str, Any]) -> bytes:
    """Before: the whole snapshot, the client's body in full, encoded and compressed."""
    import zlib

    from agentcache.model._rawjson import encode

    return zlib.compress(encode(doc).encode(), 1)


async def _find_hmget(self: Any, tenant: str, checkpoints: Any) -> str | None:
    """Before: the Redis store's prefix-index lookup as one ``HMGET`` of every checkpoint."""
    from agentcache.session._identity import match_checkpoints

    if not checkpoints:
        return None
    keys = checkpoints.lookups(self.min_inner_match)
    fields = [h.hex() for h in keys]
    values = await self._call("find", lambda: self.redis.hmget(self._idx(tenant), fields))
    hits: dict[bytes, tuple[str, bool]] = {}
    for h, v in zip(keys, values, strict=True):
        if v is not None:
            text = v.decode()
            hits[h] = (text[2:], text[:1] == "1")
    return match_checkpoints(checkpoints, hits.get, self.min_inner_match)


def _extends_by_diagnosis(prev: Any, new: Any) -> bool:
    """Before: the live report's "repaired" check through a whole diagnosis."""
    from agentcache.analysis._diagnose import diagnose

    return not diagnose(prev, new).is_break


def _set(module: str, name: str, value: Any) -> Callable[[], None]:
    def apply() -> None:
        setattr(sys.modules[module], name, value)

    return apply


def _variants() -> dict[str, Callable[[], None]]:
    """Named variants for ``--compare``: each a function called before every turn of its variant, which puts the
    code in that variant's state. Per change (``snapshot``, ``find``, ``diagnose``, ``repaired``): ``NAME-before``
    (undone) and ``NAME-after`` (as on this branch); ``before`` / ``after``: all of them. Sizes, not changes:
    ``log-on``/``log-off`` (the turn without its log line), ``live-on``/``live-off`` (without the live report)."""
    import agentcache.analysis._diagnose as diagnose
    import agentcache.analysis._ledger as ledger
    import agentcache.session._redis as redis_store
    from agentcache.proxy._live import LiveReport

    find, record = redis_store.RedisStore.find, LiveReport.record
    rs, dg, lg = redis_store.__name__, diagnose.__name__, ledger.__name__
    changes = {
        "snapshot": (_set(rs, "pack", _whole_snapshot), _set(rs, "pack", redis_store.pack)),
        "find": (lambda: setattr(redis_store.RedisStore, "find", _find_hmget),
                 lambda: setattr(redis_store.RedisStore, "find", find)),
        "diagnose": (_set(dg, "_classify_messages", _classify_messages_before),
                     _set(dg, "_classify_messages", diagnose._classify_messages)),
        "repaired": (_set(lg, "extends", _extends_by_diagnosis), _set(lg, "extends", diagnose.extends)),
    }  # fmt: skip
    out: dict[str, Callable[[], None]] = {"same": lambda: None}
    for name, (before, after) in changes.items():
        out[f"{name}-before"], out[f"{name}-after"] = before, after
    out["before"] = lambda: [before() for before, _ in changes.values()] and None
    out["after"] = lambda: [after() for _, after in changes.values()] and None
    out["log-on"] = lambda: logging.getLogger("agentcache").setLevel(logging.INFO)
    out["log-off"] = lambda: logging.getLogger("agentcache").setLevel(logging.WARNING)
    out["live-on"] = lambda: setattr(LiveReport, "record", record)
    out["live-off"] = lambda: setattr(LiveReport, "record", lambda *a, **k: None)
    return out


async def run(args: argparse.Namespace, profile: cProfile.Profile | None = None) -> dict[str, dict[str, list[float]]]:
    """Drive the turns; per variant (one unless ``--compare``), ms per turn: ``wall`` (elapsed) and ``cpu`` (this
    thread's CPU time: the work itself, not the waits for a core on a shared machine, nor Redis's own time), and
    ``cpu-first`` (``cpu`` of the conversations' first turns only); ``cpu-before``: ``cpu`` until the upstream got
    the request (the work the request waits for), and ``cpu-before-first`` the same of the first turns."""
    names = args.compare.split(",") if args.compare else ["same"]
    apps = []
    for _ in names:
        config = ProxyConfig(upstream="http://upstream.test", redis_url=args.redis,
                             redis_prefix=f"bench-{uuid.uuid4().hex[:8]}")  # fmt: skip
        apps.append(create_app(config, transport=_upstream(args.api)))
    variants = _variants()
    convs = bodies(args.api, args.size, args.turns + 20, args.interleave)
    clocks = ("wall", "cpu", "cpu-first", "cpu-before", "cpu-before-first")
    times: dict[str, dict[str, list[float]]] = {n: {c: [] for c in clocks} for n in names}
    path = ROUTES[args.api]
    async with contextlib.AsyncExitStack() as stack:
        for app in apps:
            await stack.enter_async_context(app.state.proxy.running())
        for k, (c, t, body) in enumerate(_order(convs, args.interleave)):
            # The second variant of a turn finds the process-wide memos (meanings, token counts) warm: which goes
            # first alternates turn by turn and, on a conversation's first (divergent) turn, conversation by
            # conversation, so each goes first on half of every kind of turn.
            for i in range(len(names)) if (c + t) % 2 == 0 else reversed(range(len(names))):
                variants[names[i]]()
                if profile is not None and k >= 20:
                    profile.enable()
                t0, c0 = time.perf_counter(), time.thread_time()
                status = await _call(apps[i], path, body)
                dt, dc = time.perf_counter() - t0, time.thread_time() - c0
                if profile is not None:
                    profile.disable()
                assert status == 200, status
                if k >= 20:
                    times[names[i]]["wall"].append(dt * 1000)
                    times[names[i]]["cpu"].append(dc * 1000)
                    times[names[i]]["cpu-before"].append((_REACHED[0] - c0) * 1000)
                    if t == 0:  # a conversation's first turn: a divergent one (see the module docstring)
                        times[names[i]]["cpu-first"].append(dc * 1000)
                        times[names[i]]["cpu-before-first"].append((_REACHED[0] - c0) * 1000)
        if args.redis:
            for app in apps:
                redis = app.state.proxy.store.redis
                keys = [key async for key in redis.scan_iter(f"{app.state.proxy.config.redis_prefix}:*")]
                if keys:
                    await redis.delete(*keys)
    return times


def diagnose_pair(api: str, size: int, rounds: int = 200) -> tuple[str, float, float]:
    """The diagnosis of one divergent pair (a conversation's last body, then the next conversation's first: a
    ``messages.compacted`` break), main's classification against this branch's, alternating: ``(cause, before ms,
    after ms)``, medians of the thread's CPU time."""
    import agentcache.analysis._diagnose as diagnose
    from agentcache.adapters import canonicalize

    wire = "anthropic.messages" if api == "anthropic" else "openai.chat"
    convs = bodies(api, size, 20)
    prev, new = canonicalize(wire, json.loads(convs[0][-1])), canonicalize(wire, json.loads(convs[1][0]))
    after = diagnose._classify_messages
    times: dict[Any, list[float]] = {_classify_messages_before: [], after: []}
    for i in range(rounds):
        for classify in list(times) if i % 2 else list(times)[::-1]:
            diagnose._classify_messages = classify
            t0 = time.thread_time()
            diagnose.diagnose(prev, new)
            times[classify].append((time.thread_time() - t0) * 1000)
    diagnose._classify_messages = after
    cause = str(diagnose.diagnose(prev, new).cause)
    return cause, statistics.median(times[_classify_messages_before]), statistics.median(times[after])


def timed_parts() -> dict[str, list[float]]:
    """Wrap every :data:`PARTS` step so that its thread CPU time adds up: ``{name: [seconds, calls]}``."""
    totals: dict[str, list[float]] = {}
    for module, name in PARTS:
        owner: Any = importlib.import_module(module)
        *cls, attr = name.split(".")
        for c in cls:
            owner = getattr(owner, c)
        totals[name] = total = [0.0, 0.0]
        func = getattr(owner, attr)
        if inspect.iscoroutinefunction(func):

            async def timed_async(*a: Any, _f: Any = func, _t: list[float] = total, **k: Any) -> Any:
                t0 = time.thread_time()
                try:
                    return await _f(*a, **k)
                finally:
                    _t[0], _t[1] = _t[0] + time.thread_time() - t0, _t[1] + 1

            setattr(owner, attr, timed_async)
        else:

            def timed(*a: Any, _f: Any = func, _t: list[float] = total, **k: Any) -> Any:
                t0 = time.thread_time()
                try:
                    return _f(*a, **k)
                finally:
                    _t[0], _t[1] = _t[0] + time.thread_time() - t0, _t[1] + 1

            setattr(owner, attr, timed)
    return totals


def _p90(ms: list[float]) -> float:
    return statistics.quantiles(ms, n=10)[-1]


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("--api", choices=sorted(ROUTES), default="anthropic")
    parser.add_argument("--size", type=int, default=50_000, help="body bytes (50000 gives ~46 KB bodies)")
    parser.add_argument("--turns", type=int, default=300)
    parser.add_argument("--redis", help="redis URL: the Redis session store")
    parser.add_argument("--interleave", type=int, default=1, help="conversations in flight, turn by turn in rotation")
    parser.add_argument("--profile", type=int, help="print the N costliest functions (cumulative)")
    parser.add_argument("--sort", default="cumulative", help="the profile's order (pstats: cumulative, tottime)")
    parser.add_argument("--diagnose-pair", action="store_true", help="time one divergent pair's diagnosis, then exit")
    parser.add_argument("--compare", help="two variants (see _variants), comma-separated: B / A printed")
    parser.add_argument("--parts", action="store_true", help="thread CPU per turn of each step after the last byte")
    args = parser.parse_args()
    if args.diagnose_pair:
        cause, before, after = diagnose_pair(args.api, args.size)
        print(f"{cause}: before {before:.3f} ms, after {after:.3f} ms, after / before {after / before:.3f}")
        return
    profile = cProfile.Profile() if args.profile else None
    parts = timed_parts() if args.parts else {}
    with _quiet_log():
        times = asyncio.run(run(args, profile))
    for name, clocks in times.items():
        for clock, ms in clocks.items():
            n = len(ms)
            print(f"{name} {clock}: p50 {statistics.median(ms):.3f} ms, mean {statistics.fmean(ms):.3f} ms ({n} turns)")
    if args.compare:
        a, b = args.compare.split(",")
        for clock in times[a]:
            x, y = times[a][clock], times[b][clock]
            p50, mean = statistics.median(y) / statistics.median(x), statistics.fmean(y) / statistics.fmean(x)
            p90 = _p90(y) / _p90(x)
            print(f"{b} / {a} ({clock}): p50 {p50:.3f}, p90 {p90:.3f}, mean {mean:.3f}")
    for name, (seconds, calls) in parts.items():  # per turn driven, the warm-up included
        turns = args.turns + 20
        print(f"{name}: {seconds / turns * 1000:.4f} ms per turn ({calls / turns:.2f} calls per turn)")
    if profile is not None:
        out = io.StringIO()
        pstats.Stats(profile, stream=out).sort_stats(args.sort).print_stats(args.profile)
        print(out.getvalue())


if __name__ == "__main__":
    main()
