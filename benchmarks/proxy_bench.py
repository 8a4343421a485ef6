"""Proxy overhead: ``agentcache proxy`` against calling the same upstream directly, and against the LiteLLM proxy
(``litellm[proxy]``, Anthropic pass-through route) when it is installed, side by side in one run.

Run: ``python benchmarks/proxy_bench.py [--quick] [--litellm PATH] [--json OUT]``.

* Upstream: a fast fake Anthropic server (raw asyncio, ``TCP_NODELAY``, keep-alive) in its own process. It
  answers every ``POST .../v1/messages`` with a canned SSE stream (message_start with usage, three text
  deltas, message_delta, message_stop; eight chunks, no delay), without parsing the body, so the upstream
  costs every target the same.
* Targets, each in its own process on loopback: ``direct`` (the upstream itself), ``agentcache relay`` (the
  agentcache proxy on a path it relays untouched: its HTTP plumbing alone), ``agentcache``
  (``python -m agentcache proxy --upstream http://127.0.0.1:UP``, default settings: session inference, the
  pipeline, usage tap, simulators, one JSON log line per request written to /dev/null) and ``litellm``
  (``litellm --port N`` with ``ANTHROPIC_API_BASE`` at the upstream, requests to ``/anthropic/v1/messages``).
  ``--litellm PATH`` names the ``litellm`` executable (default: ``litellm`` on PATH, else
  ``/tmp/litellm-venv/bin/litellm``); without one its rows are skipped. ``--portkey DIR`` adds Portkey's gateway
  (``npm install @portkey-ai/gateway`` in DIR; Node on PATH), Anthropic route ``/v1/messages`` with
  ``x-portkey-provider: anthropic`` and ``x-portkey-custom-host`` at the upstream (:func:`_portkey`).
* Load: a lean asyncio HTTP/1.1 client (one keep-alive connection per stream, ``TCP_NODELAY``) in this
  process. Each stream replays its own agent conversation built from real tau-bench runs (airline policy as
  system prompt, the 14 airline tools, real messages): request bodies of about 50 KB that grow turn by turn,
  a new conversation every 10 turns. At 1 stream the targets are interleaved request by request (each
  turn's body goes to every target back to back, :func:`interleaved`); at 64 concurrent streams each target
  is loaded in turn. Both after a warm-up.
* Figures: p50 and p99 of time to first body byte (TTFB) and of the whole response, per target; *added* is
  the target's percentile minus ``direct``'s; and agentcache's added latency as a share of LiteLLM's.

With ``--fanout``, runs only the fan-out figures (``benchmarks/_fanout_bench.py``): rounds of 4 sibling subagents
sent at once through the proxy with coalescing on and off, the upstream's first byte after ``--ttft`` seconds
(default 0.6): requests held, hold-time distribution, write tokens saved, latency.

With ``--record``, also runs two more agentcache proxies, each in its own process and serving one target:
``agentcache --record`` (``--record DIR``, a temporary directory, default rotation) and ``agentcache control`` (the
same without ``--record``): what writing every request to disk adds, against a process like it (two processes of the
same proxy differ by about a fifth on a small VM, so ``agentcache`` itself, whose process also serves the relay
target, is no fair baseline). Lines are written by a thread after the response's last byte: a cost shows as CPU the
event loop shares, not as a wait.

With ``--memory``, also runs 20,000 requests over 2,000 new sessions through the agentcache proxy (10 rounds of
2,000) and reports its RSS before and after each round (``/proc/PID/status`` VmRSS).
"""

from __future__ import annotations

import argparse
import asyncio
import json
import os
import shutil
import socket
import statistics
import subprocess
import sys
import tempfile
import time
from collections.abc import Iterator
from contextlib import contextmanager
from pathlib import Path
from typing import Any

ROOT = Path(__file__).resolve().parent.parent
DATA = ROOT / "data" / "tau-bench"
BODY_TARGET = 50_000
TURNS_PER_SESSION = 10

# ---- the fake upstream ------------------------------------------------------------------------------------

_USAGE = {"input_tokens": 12, "cache_read_input_tokens": 11000, "cache_creation_input_tokens": 400, "output_tokens": 1}
_START = {"id": "msg_1", "type": "message", "role": "assistant", "model": "claude-opus-4-8", "content": [],
          "stop_reason": None, "stop_sequence": None, "usage": _USAGE}  # fmt: skip
_EVENTS: list[tuple[str, dict[str, Any]]] = [
    ("message_start", {"type": "message_start", "message": _START}),
    ("content_block_start", {"type": "content_block_start", "index": 0, "content_block": {"type": "text", "text": ""}}),
    *(
        ("content_block_delta", {"type": "content_block_delta", "index": 0, "delta": {"type": "text_delta", "text": t}})
        for t in ("Sure,", " I can", " help.")
    ),
    ("content_block_stop", {"type": "content_block_stop", "index": 0}),
    (
        "message_delta",
        {
            "type": "message_delta",
            "delta": {"stop_reason": "end_turn", "stop_sequence": None},
            "usage": {"output_tokens": 4},
        },
    ),
    ("message_stop", {"type": "message_stop"}),
]
_CHUNKS = [f"event: {n}\ndata: {json.dumps(d)}\n\n".encode() for n, d in _EVENTS]
_HEAD = b"HTTP/1.1 200 OK\r\ncontent-type: text/event-stream\r\ntransfer-encoding: chunked\r\n\r\n"


async def _upstream_conn(reader: asyncio.StreamReader, writer: asyncio.StreamWriter) -> None:
    sock = writer.get_extra_info("socket")
    if sock is not None:
        sock.setsockopt(socket.IPPROTO_TCP, socket.TCP_NODELAY, 1)
    try:
        while True:
            head = await reader.readuntil(b"\r\n\r\n")
            if head.startswith(b"GET /__served "):  # how many requests this upstream answered (benchmarks' CPU figure)
                text = b"%d" % _SERVED[0]
                writer.write(b"HTTP/1.1 200 OK\r\ncontent-length: %d\r\n\r\n%s" % (len(text), text))
                await writer.drain()
                continue
            _SERVED[0] += 1
            length = 0
            chunked = False
            for line in head.split(b"\r\n")[1:]:
                name, _, value = line.partition(b":")
                if name.strip().lower() == b"content-length":
                    length = int(value.strip())
                elif name.strip().lower() == b"transfer-encoding" and b"chunked" in value.lower():
                    chunked = True
            if chunked:
                while True:
                    size = int((await reader.readuntil(b"\r\n")).split(b";")[0], 16)
                    await reader.readexactly(size + 2)
                    if size == 0:
                        break
            elif length:
                await reader.readexactly(length)
            if _DELAY:  # time to first byte (--fanout)
                await asyncio.sleep(_DELAY)
            writer.write(_HEAD)
            for chunk in _CHUNKS:
                writer.write(b"%x\r\n%s\r\n" % (len(chunk), chunk))
            writer.write(b"0\r\n\r\n")
            await writer.drain()
    except (asyncio.IncompleteReadError, ConnectionError):
        pass
    finally:
        writer.close()


_DELAY = 0.0
_SERVED = [0]


def serve_upstream(port: int, delay: float = 0.0) -> None:
    """Run the fake upstream on 127.0.0.1:``port`` until killed, answering each request after ``delay`` s."""
    global _DELAY
    _DELAY = delay

    async def main() -> None:
        server = await asyncio.start_server(_upstream_conn, "127.0.0.1", port, backlog=1024)
        async with server:
            await server.serve_forever()

    asyncio.run(main())


# ---- request bodies ---------------------------------------------------------------------------------------


def _tau() -> tuple[str, list[dict[str, Any]], list[list[dict[str, Any]]]]:
    runs = json.loads((DATA / "gpt-4o-airline.json").read_text())
    tools = [
        {"name": t["function"]["name"], "description": t["function"]["description"],
         "input_schema": t["function"]["parameters"]}
        for t in json.loads((DATA / "airline_tools.json").read_text())
    ]  # fmt: skip
    texts = []
    for run in runs:
        msgs = run["traj"][1:]
        texts.append([str(m.get("content") or json.dumps(m.get("tool_calls"))) for m in msgs])
    return runs[0]["traj"][0]["content"], tools, texts


class Conversations:
    """Per-stream generator of growing Anthropic request bodies of about ``BODY_TARGET`` bytes."""

    def __init__(self, target: int = BODY_TARGET) -> None:
        self.system, self.tools, self.texts = _tau()
        self.serial = 0
        self.target = target

    def session(self, stream: int) -> list[bytes]:
        """The ``TURNS_PER_SESSION`` request bodies of one new conversation."""
        self.serial += 1
        pool = [t for k in range(self.serial, self.serial + 40) for t in self.texts[k % len(self.texts)]]
        msgs: list[dict[str, Any]] = []
        base = {"model": "claude-opus-4-8", "max_tokens": 256, "stream": True, "system": self.system,
                "tools": self.tools}  # fmt: skip
        out: list[bytes] = []
        i = 0

        def add() -> None:
            nonlocal i
            role = "user" if len(msgs) % 2 == 0 else "assistant"
            text = pool[i % len(pool)] or "..."
            # Every message carries its stream: streams in flight together (connections) are different agents,
            # and an agent's message that another's history also held would resume that one's session.
            text = f"[stream {stream} conversation {self.serial}] {text}" if not msgs else f"[stream {stream}] {text}"
            msgs.append({"role": role, "content": [{"type": "text", "text": text}]})
            i += 1

        while len(json.dumps({**base, "messages": msgs})) < self.target - 4000 or len(msgs) % 2 == 0:
            add()
        for _ in range(TURNS_PER_SESSION):
            out.append(json.dumps({**base, "messages": msgs}).encode())
            add()
            add()
        return out


# ---- the load generator -----------------------------------------------------------------------------------


class Conn:
    """One keep-alive HTTP/1.1 connection that times TTFB (first body byte) and the whole response."""

    def __init__(self, port: int) -> None:
        self.port = port
        self.reader: asyncio.StreamReader | None = None
        self.writer: asyncio.StreamWriter | None = None
        self.last_body = b""
        self.answered = False  # the last request's status line arrived

    async def open(self) -> None:
        self.reader, self.writer = await asyncio.open_connection("127.0.0.1", self.port)
        self.writer.get_extra_info("socket").setsockopt(socket.IPPROTO_TCP, socket.TCP_NODELAY, 1)

    async def post(self, path: str, body: bytes, key: str, extra: str = "") -> tuple[int, float, float]:
        """POST ``body``; ``extra``: more header lines (each ending ``\\r\\n``). Status, TTFB and total seconds."""
        if self.writer is None:
            await self.open()
        assert self.reader is not None and self.writer is not None
        head = (
            f"POST {path} HTTP/1.1\r\nhost: 127.0.0.1\r\ncontent-type: application/json\r\n{extra}"
            f"x-api-key: {key}\r\nanthropic-version: 2023-06-01\r\ncontent-length: {len(body)}\r\n\r\n"
        ).encode()
        t0 = time.perf_counter()
        self.answered = False
        self.writer.write(head + body)
        await self.writer.drain()
        raw = await self.reader.readuntil(b"\r\n\r\n")
        self.answered = True
        status = int(raw.split(b" ", 2)[1])
        headers = {k.strip().lower(): v.strip() for k, _, v in (ln.partition(b":") for ln in raw.split(b"\r\n")[1:])}
        first = None
        parts: list[bytes] = []
        if b"chunked" in headers.get(b"transfer-encoding", b""):
            while True:
                size = int((await self.reader.readuntil(b"\r\n")).split(b";")[0], 16)
                parts.append((await self.reader.readexactly(size + 2))[:-2])
                if size == 0:
                    break
                first = first or time.perf_counter()
        else:
            parts.append(await self.reader.readexactly(int(headers.get(b"content-length", b"0"))))
            first = time.perf_counter()
        self.last_body = b"".join(parts)
        end = time.perf_counter()
        if headers.get(b"connection", b"").lower() == b"close":
            self.writer.close()
            self.writer = None
        return status, (first or end) - t0, end - t0


async def load(
    port: int, path: str, streams: int, per_stream: int, warmup: int, convs: Conversations
) -> dict[str, Any]:
    """``streams`` concurrent conversations, ``per_stream`` measured requests each after ``warmup``."""
    ttfb: list[float] = []
    total: list[float] = []
    errors = 0

    async def worker(w: int) -> None:
        nonlocal errors
        conn = Conn(port)
        bodies: list[bytes] = []
        for n in range(warmup + per_stream):
            if not bodies:
                bodies = convs.session(w)
            status, t1, t2 = await conn.post(path, bodies.pop(0), f"sk-bench-{w % 4}")
            if status != 200:
                errors += 1
            elif n >= warmup:
                ttfb.append(t1)
                total.append(t2)

    await asyncio.gather(*(worker(w) for w in range(streams)))
    return {"n": len(total), "errors": errors, "ttfb": _pcts(ttfb), "total": _pcts(total)}


async def interleaved(
    targets: dict[str, tuple[int, str]],
    per: int,
    warmup: int,
    convs: Conversations,
    headers: dict[str, dict[str, str]] | None = None,
) -> dict[str, dict[str, Any]]:
    """One stream per target, request by request in turn: every target gets the same body of the same
    conversation back to back (the order rotating each turn), so a slow spell of a shared VM lands on all
    targets alike instead of on whichever ran during it. ``per`` measured requests each after ``warmup``;
    ``headers``: more request headers by target name."""
    names = list(targets)
    extra = {name: "".join(f"{k}: {v}\r\n" for k, v in (headers or {}).get(name, {}).items()) for name in names}
    conns = {name: Conn(port) for name, (port, _) in targets.items()}
    times: dict[str, tuple[list[float], list[float]]] = {name: ([], []) for name in names}
    errors = dict.fromkeys(names, 0)
    bodies: list[bytes] = []
    for n in range(warmup + per):
        if not bodies:
            bodies = convs.session(0)
        body = bodies.pop(0)
        for name in names[n % len(names) :] + names[: n % len(names)]:
            status, t1, t2 = await conns[name].post(targets[name][1], body, "sk-bench-0", extra[name])
            if status != 200:
                errors[name] += 1
            elif n >= warmup:
                times[name][0].append(t1)
                times[name][1].append(t2)
    return {
        name: {"n": len(t[1]), "errors": errors[name], "ttfb": _pcts(t[0]), "total": _pcts(t[1])}
        for name, t in times.items()
    }


def _pcts(xs: list[float]) -> dict[str, float]:
    xs = sorted(xs)
    if not xs:
        return {"p50": float("nan"), "p99": float("nan")}
    q = statistics.quantiles(xs, n=100, method="inclusive")
    return {"p50": statistics.median(xs) * 1000, "p99": q[98] * 1000}


# ---- processes --------------------------------------------------------------------------------------------


def _free_port() -> int:
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        port: int = s.getsockname()[1]
        return port


def _wait(port: int, timeout: float = 300.0, proc: subprocess.Popen[bytes] | None = None, errors: Any = None) -> None:
    """Until something listens on ``port``; raises RuntimeError after ``timeout`` s, or at once when ``proc`` (what
    should listen there) exits, with the end of its stderr (the file ``errors``)."""
    deadline = time.monotonic() + timeout
    while time.monotonic() < deadline:
        if proc is not None and proc.poll() is not None:
            err = ""
            if errors is not None:
                errors.seek(0)
                err = errors.read().decode(errors="replace").strip()[-2000:]
            raise RuntimeError(f"{' '.join(map(str, proc.args))!r} exited ({proc.returncode}):\n{err}")
        try:
            with socket.create_connection(("127.0.0.1", port), timeout=0.5):
                return
        except OSError:
            time.sleep(0.1)
    raise RuntimeError(f"nothing listening on {port} after {timeout}s")


def _start(
    argv: list[str], port: int, env: dict[str, str] | None = None, cwd: str | None = None
) -> subprocess.Popen[bytes]:
    """``argv`` started from ``cwd`` (default the temporary directory: ``-m agentcache`` must find the installed
    package, not a checkout's source folders), once it listens on ``port``. Its stderr goes to a file, read back
    should it exit first."""
    with tempfile.TemporaryFile() as errors:  # the process keeps its own descriptor of it
        proc = subprocess.Popen(
            argv, stdout=subprocess.DEVNULL, stderr=errors, env={**os.environ, **(env or {})},
            cwd=cwd or tempfile.gettempdir(),
        )  # fmt: skip
        try:
            _wait(port, proc=proc, errors=errors)
        except BaseException:
            proc.kill()
            raise
    return proc


@contextmanager
def proxy_behind(script: str, max_state_mb: int) -> Iterator[tuple[int, int]]:
    """``script --serve-upstream PORT`` as the fake upstream and ``agentcache proxy`` in front of it with
    ``max_state_mb``, as processes: yields the proxy's port and pid; both stopped after."""
    up, px = _free_port(), _free_port()
    procs = [_start([sys.executable, script, "--serve-upstream", str(up)], up)]
    try:
        env = {"AGENTCACHE_PROXY_MAX_STATE_MB": str(max_state_mb)}
        cmd = [sys.executable, "-m", "agentcache", "proxy", "--upstream", f"http://127.0.0.1:{up}", "--port", str(px)]
        procs.append(_start(cmd, px, env))
        yield px, procs[1].pid
    finally:
        for p in procs:
            p.terminate()
        for p in procs:
            p.wait(timeout=20)


def breakdown(convs: Conversations, sessions: int = 60) -> dict[str, dict[str, float]]:
    """In-process cost (ms) of the proxy's per-request steps before the upstream call, on the same bodies:
    parse with source texts (as the proxy does: guided by its memo of recent bodies, where the checkout has one),
    session-inference checkpoints (with the canonicalization they are read off, where the checkout does that before
    the lookup), the pipeline's ``prepare``, the spliced upstream body,
    ``commit``. Medians and means over every turn of ``sessions`` conversations (the first 10 warm up). Runs on
    this checkout's agentcache, or on an older one (``--baseline``: the same steps under their former names)."""
    try:
        from agentcache.model._rawjson import loads
        from agentcache.session import SessionPipeline, checkpoints_of

        try:  # the proxy parses through its memo of recent bodies and splices in model/_splice
            from agentcache.model._parsememo import ParseMemo
            from agentcache.model._splice import dumps_spliced

            loads = ParseMemo().loads  # type: ignore[assignment]
        except ImportError:  # a checkout between the session core and the parse memo
            from agentcache.model._rawjson import dumps_spliced  # type: ignore[attr-defined,no-redef]
    except ImportError:  # an agentcache from before the session core (one run measures both side by side)
        from agentcache._pipeline import SessionPipeline  # type: ignore[no-redef]
        from agentcache._rawjson import dumps_spliced, loads  # type: ignore[no-redef]
        from agentcache.proxy._caller import checkpoints_of  # type: ignore[no-redef]

    try:  # canonicalized once, before the session lookup, which reads its checkpoints off the canonical request
        from agentcache.session._identity import checkpoints_from
        from agentcache.session._lookup import Canonicalizer
    except ImportError:  # a checkout that hashed the wire body for the lookup and canonicalized in prepare
        Canonicalizer = None  # type: ignore[assignment,misc]

    steps: dict[str, list[float]] = {k: [] for k in ("parse", "checkpoints", "prepare", "body", "commit", "total")}
    for n in range(sessions):
        pipe = SessionPipeline("anthropic")
        canon = Canonicalizer() if Canonicalizer is not None else None  # cold, as the session's own block cache
        for raw in convs.session(0):
            t0 = time.perf_counter()
            body, texts = loads(raw)
            t1 = time.perf_counter()
            if canon is not None:
                client, cache = canon.canonical("anthropic.messages", body, texts)
                checkpoints_from(client)
                t2 = time.perf_counter()
                if pipe.sent is None and canon.adopt("anthropic.messages", cache):
                    pipe.cache = cache
                prepared = pipe.prepare("anthropic.messages", body, now=time.time(), raw=texts, client=client)
                canon.note("anthropic.messages", body, texts, pipe.cache)
            else:
                checkpoints_of("anthropic.messages", body, texts)
                t2 = time.perf_counter()
                prepared = pipe.prepare("anthropic.messages", body, now=time.time(), raw=texts)
            t3 = time.perf_counter()
            dumps_spliced(prepared.body, texts)
            t4 = time.perf_counter()
            pipe.commit(prepared)
            t5 = time.perf_counter()
            if n >= 10:
                for name, sec in zip(steps, (t1 - t0, t2 - t1, t3 - t2, t4 - t3, t5 - t4, t5 - t0), strict=True):
                    steps[name].append(sec * 1000)
    return {k: {"p50": statistics.median(v), "mean": statistics.fmean(v)} for k, v in steps.items()}


def _rss_kb(pid: int) -> int:
    for line in Path(f"/proc/{pid}/status").read_text().splitlines():
        if line.startswith("VmRSS:"):
            return int(line.split()[1])
    return 0


def _litellm(explicit: str | None) -> str | None:
    if explicit:
        return None if explicit == "none" else explicit
    found = shutil.which("litellm")
    fallback = Path("/tmp/litellm-venv/bin/litellm")
    return found or (str(fallback) if fallback.exists() else None)


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("--serve-upstream", type=int, help=argparse.SUPPRESS)
    parser.add_argument("--quick", action="store_true", help="fewer requests (noisier)")
    parser.add_argument("--litellm", help="litellm executable (default: on PATH, else /tmp/litellm-venv; none: skip)")
    parser.add_argument(
        "--portkey", help="directory with node_modules/@portkey-ai/gateway (npm): Portkey's gateway as a target"
    )
    parser.add_argument("--memory", action="store_true", help="also 20,000 requests over 2,000 sessions: RSS")
    parser.add_argument("--json", type=Path, help="write every figure as JSON")
    parser.add_argument(
        "--baseline",
        help="python of another agentcache checkout (its own venv): its proxy and step breakdown run beside these",
    )
    parser.add_argument("--breakdown-only", action="store_true", help=argparse.SUPPRESS)
    parser.add_argument("--fanout", action="store_true", help="only the fan-out figures: coalescing, hold times")
    parser.add_argument("--record", action="store_true", help="also a proxy recording every request (--record)")
    parser.add_argument("--ttft", type=float, default=0.6, help="--fanout: upstream seconds to first byte")
    parser.add_argument("--sizes", default=str(BODY_TARGET), help="body sizes of the 1-stream runs (comma list)")
    parser.add_argument("--no-64", action="store_true", help="skip the 64-stream level")
    parser.add_argument("--workers", type=int, default=1, help="also agentcache with N workers (and Redis)")
    parser.add_argument("--replicas", type=int, default=1, help="also N one-worker replicas behind HAProxy (Redis)")
    parser.add_argument("--peer-workers", type=int, default=1, help="the LiteLLM proxy's --num_workers")
    parser.add_argument("--wrk", action="store_true", help="also closed-loop throughput with wrk (_wrk_bench.py)")
    parser.add_argument("--connections", default="32,128", help="--wrk: connection counts (comma list)")
    parser.add_argument("--wrk-seconds", type=int, default=10, help="--wrk: seconds per run")
    parser.add_argument("--wrk-rounds", type=int, default=2, help="--wrk: rounds over the targets")
    args = parser.parse_args()
    if args.serve_upstream:
        serve_upstream(args.serve_upstream, args.ttft if args.fanout else 0.0)
        return
    if args.fanout:
        _fanout_only(args)
        return
    if args.breakdown_only:
        print(json.dumps(breakdown(Conversations())))
        return
    up_port, ac_port, ll_port = _free_port(), _free_port(), _free_port()
    procs: list[subprocess.Popen[bytes]] = []
    record_dir = tempfile.mkdtemp(prefix="agentcache-bench-record-") if args.record else None
    try:
        procs.append(_start([sys.executable, str(Path(__file__).resolve()), "--serve-upstream", str(up_port)], up_port))
        ac = _start(
            [sys.executable, "-m", "agentcache", "proxy", "--upstream", f"http://127.0.0.1:{up_port}",
             "--port", str(ac_port)],
            ac_port,
        )  # fmt: skip
        procs.append(ac)
        targets = {
            "direct": (up_port, "/v1/messages"),
            "agentcache relay": (ac_port, "/relay/v1/messages"),
            "agentcache": (ac_port, "/v1/messages"),
        }
        pids = {"direct": [procs[0].pid], "agentcache relay": [ac.pid], "agentcache": [ac.pid]}  # for the CPU used
        if args.baseline:
            base_port = _free_port()
            procs.append(_start(
                [args.baseline, "-m", "agentcache", "proxy", "--upstream", f"http://127.0.0.1:{up_port}",
                 "--port", str(base_port)],
                base_port,
                cwd=tempfile.gettempdir(),  # not this checkout: ``-m agentcache`` must find the baseline's package
            ))  # fmt: skip
            targets["baseline relay"] = (base_port, "/relay/v1/messages")
            targets["baseline"] = (base_port, "/v1/messages")
            pids["baseline relay"] = pids["baseline"] = [procs[-1].pid]
        if record_dir is not None:
            for name, extra in (("agentcache control", []), ("agentcache --record", ["--record", record_dir])):
                port = _free_port()
                procs.append(_start(
                    [sys.executable, "-m", "agentcache", "proxy", "--upstream", f"http://127.0.0.1:{up_port}",
                     "--port", str(port), *extra],
                    port,
                ))  # fmt: skip
                targets[name] = (port, "/v1/messages")
                pids[name] = [procs[-1].pid]
        if args.workers > 1 or args.replicas > 1:
            _add_workers(targets, pids, procs, up_port, args.workers, args.replicas)
        exe = _litellm(args.litellm)
        if exe:
            env = {"ANTHROPIC_API_BASE": f"http://127.0.0.1:{up_port}", "ANTHROPIC_API_KEY": "sk-fake",
                   "LITELLM_LOG": "ERROR", "LITELLM_DANGEROUSLY_PERMIT_WEAK_OR_UNSET_MASTER_KEY": "true"}  # fmt: skip
            workers = str(args.peer_workers)
            procs.append(_start([exe, "--port", str(ll_port), "--num_workers", workers], ll_port, env))
            targets["litellm"] = (ll_port, "/anthropic/v1/messages")
            pids["litellm"] = [procs[-1].pid]
        headers: dict[str, dict[str, str]] = {}
        if args.portkey:
            pk_port = _free_port()
            procs.append(_portkey(args.portkey, pk_port))
            targets["portkey"] = (pk_port, "/v1/messages")
            pids["portkey"] = [procs[-1].pid]
            headers["portkey"] = {"x-portkey-provider": "anthropic",
                                  "x-portkey-custom-host": f"http://127.0.0.1:{up_port}/v1"}  # fmt: skip
        convs = Conversations()
        results: dict[str, Any] = {"body_bytes": len(convs.session(0)[0]), "levels": {}}
        results["breakdown"] = breakdown(Conversations())
        if args.baseline:
            here = str(Path(__file__).resolve())
            out = subprocess.run([args.baseline, here, "--breakdown-only"], capture_output=True, check=True)
            results["baseline_breakdown"] = json.loads(out.stdout)
        for size in (int(x) for x in args.sizes.split(",")):
            sized = Conversations(size)
            key = f"1 ({len(sized.session(0)[0]) / 1000:.0f} KB)"
            results["levels"][key] = asyncio.run(interleaved(targets, 60 if args.quick else 600, 10, sized, headers))
        if not args.no_64:
            level: dict[str, Any] = {}
            for name, (port, path) in targets.items():
                level[name] = asyncio.run(load(port, path, 64, 4 if args.quick else 20, 3, convs))
            results["levels"][64] = level
        if args.wrk:
            results["wrk"] = _wrk(args, targets, convs, headers, pids)
        if args.memory:  # 20,000 requests over 2,000 new sessions, in 10 rounds; RSS after each
            rss = [_rss_kb(ac.pid)]
            for _ in range(10):
                asyncio.run(load(ac_port, "/v1/messages", 50, 40, 0, convs))
                rss.append(_rss_kb(ac.pid))
            results["memory_kb"] = rss
        print(_markdown(results))
        if args.json:
            args.json.write_text(json.dumps(results, indent=2))
    finally:
        for p in procs:
            p.terminate()
        for p in procs:
            p.wait(timeout=20)
        if record_dir is not None:
            shutil.rmtree(record_dir, ignore_errors=True)


def _add_workers(
    targets: dict[str, tuple[int, str]],
    pids: dict[str, list[int]],
    procs: list[subprocess.Popen[bytes]],
    up_port: int,
    workers: int,
    replicas: int = 1,
) -> None:
    """A redis-server, and agentcache on it with one worker and with ``workers``, and ``replicas`` one-worker
    replicas behind HAProxy (:func:`_haproxy`, each of its modes), each target with its own sessions, all shared
    through the Redis, whose CPU counts as theirs (and HAProxy's as the replicas')."""
    redis = shutil.which("redis-server")
    if redis is None:
        raise RuntimeError("--workers/--replicas need redis-server (apt-get install redis-server)")
    rport = _free_port()
    argv = [redis, "--port", str(rport), "--bind", "127.0.0.1", "--save", "", "--appendonly", "no"]
    procs.append(_start(argv, rport))
    redis_pid = procs[-1].pid

    def proxy(workers: int, prefix: str) -> tuple[int, int]:
        port = _free_port()
        procs.append(_start(
            [sys.executable, "-m", "agentcache", "proxy", "--upstream", f"http://127.0.0.1:{up_port}",
             "--port", str(port), "--workers", str(workers), "--redis-url", f"redis://127.0.0.1:{rport}"],
            port,
            env={"AGENTCACHE_PROXY_REDIS_PREFIX": prefix},  # its own sessions: the targets get the same bodies
        ))  # fmt: skip
        return port, procs[-1].pid

    for n in sorted({1, workers}):
        port, pid = proxy(n, f"bench-{n}")
        name = f"agentcache redis, {n} worker{'s' if n > 1 else ''}"
        targets[name], pids[name] = (port, "/v1/messages"), [pid, redis_pid]
    for mode in ("tcp", "http") if replicas > 1 else ():
        backends = [proxy(1, f"bench-replicas-{mode}") for _ in range(replicas)]
        port = _free_port()
        procs.append(_haproxy(port, [b[0] for b in backends], mode))
        name = f"agentcache redis, {replicas} replicas, HAProxy {mode}"
        targets[name], pids[name] = (port, "/v1/messages"), [*(b[1] for b in backends), redis_pid, procs[-1].pid]


def _haproxy(port: int, backends: list[int], mode: str = "tcp") -> subprocess.Popen[bytes]:
    """HAProxy (Debian's ``haproxy``) on ``port``, balancing round robin over ``backends``: ``tcp`` mode (layer 4,
    as a cloud network load balancer) gives each client connection to one replica, as the kernel gives it to one
    worker; ``http`` mode balances each request (a session's turns then land on every replica in turn)."""
    exe = shutil.which("haproxy") or "/usr/sbin/haproxy"
    if not Path(exe).exists():
        raise RuntimeError("--replicas needs haproxy (apt-get install haproxy)")
    servers = "\n".join(f"  server r{i} 127.0.0.1:{b}" for i, b in enumerate(backends))
    cfg = Path(tempfile.mkdtemp(prefix="agentcache-bench-haproxy-")) / "haproxy.cfg"
    cfg.write_text(
        "global\n  maxconn 4096\n  nbthread 1\n"
        f"defaults\n  mode {mode}\n  timeout connect 5s\n  timeout client 120s\n"
        f"  timeout server 120s\nfrontend f\n  bind 127.0.0.1:{port}\n  default_backend b\n"
        f"backend b\n  balance roundrobin\n{servers}\n"
    )
    return _start([exe, "-f", str(cfg), "-db"], port)


def _served(port: int) -> int:
    """How many requests the fake upstream on ``port`` has answered."""
    with socket.create_connection(("127.0.0.1", port)) as sock:
        sock.sendall(b"GET /__served HTTP/1.1\r\nhost: x\r\n\r\n")
        data = b""
        while b"\r\n\r\n" not in data or not data.split(b"\r\n\r\n", 1)[1]:
            data += sock.recv(4096)
    return int(data.split(b"\r\n\r\n", 1)[1])


def _portkey(directory: str, port: int) -> subprocess.Popen[bytes]:
    """Portkey's gateway (``@portkey-ai/gateway`` installed by npm in ``directory``) on ``port``, with
    ``portkey_fetch.mjs`` preloaded: on Node 20 the gateway fails every request without it (``TypeError:
    immutable``: it appends headers to the response ``fetch`` returned, whose headers Node's fetch makes immutable)."""
    server = Path(directory) / "node_modules" / "@portkey-ai" / "gateway" / "build" / "start-server.js"
    shim = Path(__file__).resolve().parent / "portkey_fetch.mjs"
    return _start(["node", "--import", shim.as_uri(), str(server), f"--port={port}", "--headless"], port)


def _wrk(
    args: argparse.Namespace,
    targets: dict[str, tuple[int, str]],
    convs: Conversations,
    headers: dict[str, dict[str, str]] | None = None,
    pids: dict[str, list[int]] | None = None,
) -> Any:
    """``--wrk``: closed-loop throughput of every target (``_wrk_bench.py``), printed as a table."""
    sys.path.insert(0, str(Path(__file__).resolve().parent))
    from _wrk_bench import markdown, summary_of, throughput

    bodies = [b for n in range(20) for b in convs.session(1000 + n)]
    with_headers = {name: (port, path, (headers or {}).get(name, {})) for name, (port, path) in targets.items()}
    conns = [int(c) for c in args.connections.split(",")]
    up_port = targets["direct"][0]
    res = throughput(with_headers, bodies, conns, args.wrk_seconds, args.wrk_rounds, pids, lambda: _served(up_port))
    print(markdown(res, args.wrk_seconds, args.wrk_rounds) + "\n")
    return summary_of(res)


def _fanout_only(args: argparse.Namespace) -> None:
    """``--fanout``: sibling subagents through the proxy with coalescing on and off (``_fanout_bench.py``)."""
    sys.path.insert(0, str(Path(__file__).resolve().parent))
    from _fanout_bench import fanout, markdown

    up_port = _free_port()
    up = _start(
        [
            sys.executable,
            str(Path(__file__).resolve()),
            "--serve-upstream",
            str(up_port),
            "--fanout",
            "--ttft",
            str(args.ttft),
        ],
        up_port,
    )
    try:
        system, tools, _ = _tau()
        res = fanout(up_port, _wait, _free_port, system, tools, rounds=5 if args.quick else 20)
        print(markdown(res, args.ttft))
        if args.json:
            args.json.write_text(json.dumps({"fanout": res, "ttft": args.ttft}, indent=2))
    finally:
        up.terminate()
        up.wait(timeout=20)


def _ratio_line(streams: Any, level: dict[str, Any], ours: str, theirs: str, label: str) -> str:
    """One table row: what target ``ours`` adds over ``direct`` as a share of what ``theirs`` adds (p50, p99)."""
    d = level["direct"]["total"]
    ratios = []
    for q in ("p50", "p99"):
        a, b = level[ours]["total"][q] - d[q], level[theirs]["total"][q] - d[q]
        ratios.append(f"{q} {a / b:.2f}" if b > 0 else f"{q} n/a")
    return f"| {streams} | {label} | | | | | | | {ratios[0]} | {ratios[1]} |"


def _markdown(r: dict[str, Any]) -> str:
    lines = [
        f"request body of the 64-stream level and wrk: {r['body_bytes']:,} bytes (first turn; bodies grow ~1 KB per "
        "turn); the 1-stream rows name their own size",
        "",
    ]
    lines.append("| streams | target | n | err | TTFB p50 | TTFB p99 | total p50 | total p99 | added p50 | added p99 |")
    lines.append("|---|---|---|---|---|---|---|---|---|---|")
    for streams, level in r["levels"].items():
        d = level["direct"]
        for name, m in level.items():
            add50 = m["total"]["p50"] - d["total"]["p50"]
            add99 = m["total"]["p99"] - d["total"]["p99"]
            added = "— | —" if name == "direct" else f"{add50:.2f} | {add99:.2f}"
            lines.append(
                f"| {streams} | {name} | {m['n']} | {m['errors']} | {m['ttfb']['p50']:.2f} | {m['ttfb']['p99']:.2f} | "
                f"{m['total']['p50']:.2f} | {m['total']['p99']:.2f} | {added} |"
            )
        pairs = [
            ("agentcache", "baseline", "agentcache added / baseline added"),
            ("agentcache relay", "baseline relay", "relay added / baseline relay added"),
            ("agentcache --record", "agentcache control", "--record added / control added"),
            ("agentcache", "litellm", "agentcache added / litellm added"),
            ("agentcache relay", "litellm", "relay added / litellm added"),
            ("agentcache", "portkey", "agentcache added / portkey added"),
            ("agentcache relay", "portkey", "relay added / portkey added"),
        ]
        lines += [_ratio_line(streams, level, ours, theirs, label) for ours, theirs, label in pairs if theirs in level]
    lines.append("")
    lines.append("times in ms; added = target percentile − direct percentile (whole response)")
    if "breakdown" in r:
        lines += ["", "agentcache's steps before the upstream call, in process on the same bodies (ms):", "",
                  "| step | p50 | mean |", "|---|---:|---:|"]  # fmt: skip
        if "baseline_breakdown" in r:
            lines[-2:] = [
                "| step | p50 | mean | baseline p50 | baseline mean | ratio (p50) |",
                "|---|---:|---:|---:|---:|---:|",
            ]
            base = r["baseline_breakdown"]
            lines += [
                f"| {k} | {v['p50']:.3f} | {v['mean']:.3f} | {base[k]['p50']:.3f} | {base[k]['mean']:.3f} | "
                f"{v['p50'] / base[k]['p50']:.2f} |"
                for k, v in r["breakdown"].items()
            ]
        else:
            lines += [f"| {k} | {v['p50']:.3f} | {v['mean']:.3f} |" for k, v in r["breakdown"].items()]
    if "memory_kb" in r:
        steps = " → ".join(f"{kb / 1024:.0f}" for kb in r["memory_kb"])
        lines.append(
            f"agentcache proxy RSS (MB) before and after each 2,000 of 20,000 requests / 2,000 sessions: {steps}"
        )
    return "\n".join(lines)


if __name__ == "__main__":
    main()
