"""Load with faults (the soak): 200 concurrent streaming agent sessions through ``agentcache proxy`` for 60 s, with
a fault injected on 5% of upstream calls. Every client request must either succeed or get the upstream's failure,
as the same kind of failure; none may hang and none may be lost.

Run: ``python benchmarks/proxy_load.py [--streams 200] [--idle-streams 20] [--seconds 60] [--fault-rate 0.05]
[--seed 7] [--json OUT]``. CI runs a small size of it (``tests/test_soak.py``).

The fake upstream (its own process) draws a fault for each call with probability ``--fault-rate``, evenly among:

* ``status``: a 500 with an Anthropic ``api_error`` body → the client must get that 500 verbatim;
* ``reset``: the connection closed before any response → the client must get a 502;
* ``stall``: no answer for 10 s (the proxy runs with a 2 s read timeout) → the client must get a 504;
* ``cut``: the stream closed after two of its eight events → the client's stream must break too.

It counts calls (POSTs: the proxy's start-up engine probe, two GETs, gets a 404 and is counted apart as
``probes``) and faults by kind (``GET /stats``). The client (200 keep-alive connections, 30 s timeout per
request) classifies every outcome; the run passes when the client saw exactly as many failures of each kind as
the upstream injected, every other request completed (``message_stop`` received), no request timed out on the
client side, and the upstream saw exactly as many calls as the clients sent.

``--idle-streams`` more clients pause 5-6 s between their requests on a keep-alive connection, as a client whose pool
keeps idle connections 5 s (httpx, under the Anthropic and OpenAI SDKs) sends right at its expiry: none of their
requests may meet a connection the server closed (``dropped``). The proxy logs with ``--log-format json``: every line
it writes must be one JSON object (no traceback, cut streams included), and its ``/metrics`` must count every request
once (``agentcache_proxy_requests_total`` adds up to the requests sent, the upstream's 500s under ``500``, nothing
else there) with no failure of its own (no ``agentcache_proxy_fail_open_total``). The upstream's faults and the idle
pauses are drawn from ``--seed``: the same run every time.
"""

from __future__ import annotations

import argparse
import asyncio
import json
import os
import random
import socket
import subprocess
import sys
import tempfile
import time
from collections import Counter
from pathlib import Path

sys.path.insert(0, str(Path(__file__).resolve().parent))

from proxy_bench import _CHUNKS, _HEAD, Conn, Conversations, _free_port, _start, _wait

KINDS = ("status", "reset", "stall", "cut")
_ERROR = json.dumps({"type": "error", "error": {"type": "api_error", "message": "injected"}}).encode()


def serve_faulty(port: int, rate: float, seed: int = 7) -> None:
    """The fake upstream with fault injection (see the module docstring)."""
    rng = random.Random(seed)
    stats: Counter[str] = Counter()

    async def conn(reader: asyncio.StreamReader, writer: asyncio.StreamWriter) -> None:
        writer.get_extra_info("socket").setsockopt(socket.IPPROTO_TCP, socket.TCP_NODELAY, 1)
        try:
            while True:
                head = await reader.readuntil(b"\r\n\r\n")
                length = 0
                for line in head.split(b"\r\n")[1:]:
                    name, _, value = line.partition(b":")
                    if name.strip().lower() == b"content-length":
                        length = int(value.strip())
                if length:
                    await reader.readexactly(length)
                if head.startswith(b"GET /stats"):
                    doc = json.dumps(stats).encode()
                    writer.write(b"HTTP/1.1 200 OK\r\ncontent-length: %d\r\n\r\n%s" % (len(doc), doc))
                    continue
                if not head.startswith(b"POST "):  # the proxy's engine probe at start-up (/v1/models, /props)
                    writer.write(b"HTTP/1.1 404 Not Found\r\ncontent-length: 0\r\n\r\n")
                    stats["probes"] += 1
                    continue
                stats["calls"] += 1
                kind = rng.choice(KINDS) if rng.random() < rate else "ok"
                stats[kind] += 1
                if kind == "status":
                    writer.write(
                        b"HTTP/1.1 500 Internal Server Error\r\ncontent-type: application/json\r\n"
                        b"content-length: %d\r\n\r\n%s" % (len(_ERROR), _ERROR)
                    )
                    continue
                if kind == "reset":
                    writer.transport.abort()
                    return
                if kind == "stall":
                    await asyncio.sleep(10)
                    writer.transport.abort()
                    return
                writer.write(_HEAD)
                for chunk in _CHUNKS[: 2 if kind == "cut" else None]:
                    writer.write(b"%x\r\n%s\r\n" % (len(chunk), chunk))
                if kind == "cut":
                    await writer.drain()
                    writer.transport.abort()
                    return
                writer.write(b"0\r\n\r\n")
                await writer.drain()
        except (asyncio.IncompleteReadError, ConnectionError):
            pass
        finally:
            writer.close()

    async def main() -> None:
        server = await asyncio.start_server(conn, "127.0.0.1", port, backlog=2048)
        async with server:
            await server.serve_forever()

    asyncio.run(main())


async def _one(conn: Conn, body: bytes, key: str) -> tuple[str, float]:
    """One request; its outcome and latency."""
    t0 = time.perf_counter()
    try:
        status, _, _ = await asyncio.wait_for(conn.post("/v1/messages", body, key), timeout=30)
    except TimeoutError:
        conn.writer = None
        return "hang", time.perf_counter() - t0
    except (asyncio.IncompleteReadError, ConnectionError):
        conn.writer = None
        return "cut", time.perf_counter() - t0
    outcome = {200: "ok", 500: "status", 502: "reset", 504: "stall"}.get(status, f"http_{status}")
    if status == 200 and not conn.last_body.rstrip().endswith(b'message_stop"}'):
        outcome = "truncated"  # a broken stream that looked complete: must never happen
    return outcome, time.perf_counter() - t0


async def drive(
    port: int, streams: int, seconds: float, idle: int = 0, seed: int = 7
) -> tuple[Counter[str], list[float]]:
    """``streams`` concurrent conversations for ``seconds``, and ``idle`` more that pause 5-6 s between requests on
    their keep-alive connection; outcome counts (``dropped``: a request on a reused idle connection that got no
    answer at all) and latencies."""
    convs = Conversations(target=12_000)
    outcomes: Counter[str] = Counter()
    latencies: list[float] = []
    deadline = time.monotonic() + seconds

    async def worker(w: int) -> None:
        conn = Conn(port)
        bodies: list[bytes] = []
        pauses = random.Random(seed * 1000 + w)
        while time.monotonic() < deadline:
            bodies = bodies or convs.session(w)
            reused = conn.writer is not None
            outcome, dt = await _one(conn, bodies.pop(0), f"sk-load-{w % 8}")
            if w >= streams and reused and outcome == "cut" and not conn.answered:
                outcome = "dropped"  # the connection was closed under a request sent on it: the keep-alive race
            outcomes[outcome] += 1
            latencies.append(dt)
            if w >= streams:
                await asyncio.sleep(pauses.uniform(5.0, 6.0))

    await asyncio.gather(*(worker(w) for w in range(streams + idle)))
    return outcomes, latencies


async def _metrics(port: int) -> dict[str, float]:
    """The proxy's ``/metrics``: sample (name with labels) → value."""
    reader, writer = await asyncio.open_connection("127.0.0.1", port)
    writer.write(b"GET /metrics HTTP/1.1\r\nhost: 127.0.0.1\r\nconnection: close\r\n\r\n")
    text = (await reader.read()).decode().partition("\r\n\r\n")[2]
    writer.close()
    return {k: float(v) for k, _, v in (ln.rpartition(" ") for ln in text.splitlines() if ln and ln[0] != "#")}


def _log_lines(path: Path) -> tuple[int, list[str]]:
    """``(lines, the ones that are no JSON object)`` of the proxy's ``--log-format json`` stderr."""
    bad: list[str] = []
    lines = path.read_text(errors="replace").splitlines()
    for line in lines:
        try:
            ok = isinstance(json.loads(line), dict)
        except ValueError:
            ok = False
        if not ok:
            bad.append(line)
    return len(lines), bad


def _counted(metrics: dict[str, float], name: str, **labels: str) -> float:
    """The sum of ``name``'s samples whose labels include ``labels``."""
    want = [f'{k}="{v}"' for k, v in labels.items()]
    return sum(v for k, v in metrics.items() if k.startswith(name + "{") and all(w in k for w in want))


async def _stats(port: int) -> dict[str, int]:
    reader, writer = await asyncio.open_connection("127.0.0.1", port)
    writer.write(b"GET /stats HTTP/1.1\r\nhost: x\r\n\r\n")
    head = await reader.readuntil(b"\r\n\r\n")
    length = int(head.lower().split(b"content-length:")[1].split(b"\r\n")[0])
    doc: dict[str, int] = json.loads(await reader.readexactly(length))
    writer.close()
    return doc


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("--serve-upstream", type=int, help=argparse.SUPPRESS)
    parser.add_argument("--streams", type=int, default=200)
    parser.add_argument("--seconds", type=float, default=60.0)
    parser.add_argument("--fault-rate", type=float, default=0.05)
    parser.add_argument("--idle-streams", type=int, default=20)
    parser.add_argument("--seed", type=int, default=7)
    parser.add_argument("--json", type=Path)
    args = parser.parse_args()
    if args.serve_upstream:
        serve_faulty(args.serve_upstream, args.fault_rate, args.seed)
        return
    up, px = _free_port(), _free_port()
    argv = [sys.executable, __file__, "--serve-upstream", str(up), "--fault-rate", str(args.fault_rate)]
    procs = [_start([*argv, "--seed", str(args.seed)], up)]
    with tempfile.TemporaryDirectory() as tmp:
        log = Path(tmp) / "proxy.log"
        try:
            env = {**os.environ, "AGENTCACHE_PROXY_READ_TIMEOUT": "2"}
            cmd = [sys.executable, "-m", "agentcache", "--log-format", "json", "proxy", "--upstream",
                   f"http://127.0.0.1:{up}", "--port", str(px)]  # fmt: skip
            with log.open("wb") as err:
                procs.append(subprocess.Popen(cmd, stdout=subprocess.DEVNULL, stderr=err, env=env))
            _wait(px)
            outcomes, lat = asyncio.run(drive(px, args.streams, args.seconds, args.idle_streams, args.seed))
            upstream = asyncio.run(_stats(up))
            metrics = asyncio.run(_metrics(px))
        finally:
            for p in procs:
                p.terminate()
            for p in procs:
                p.wait(timeout=20)
        lines, bad = _log_lines(log)
    sent = sum(outcomes.values())
    counted = _counted(metrics, "agentcache_proxy_requests_total", route="/v1/messages")
    checks = {
        "no request hung": outcomes["hang"] == 0,
        "no broken stream looked complete": outcomes["truncated"] == 0,
        "no 5xx of agentcache's own": not any(k.startswith("http_5") for k in outcomes),
        "none lost (upstream calls == client requests)": upstream.get("calls", 0) == sent,
        **{f"{k}: client saw what upstream injected": outcomes[k] == upstream.get(k, 0) for k in KINDS},
        "every other request completed": outcomes["ok"] == upstream.get("ok", 0),
        "no request on an idle keep-alive connection dropped": outcomes["dropped"] == 0,
        f"every log line one JSON object ({lines:,} lines)": not bad,
        "every request counted once (requests_total == requests sent)": counted == sent,
        "the upstream's 500s counted as 500, nothing else": _counted(
            metrics, "agentcache_proxy_requests_total", status="500"
        )
        == upstream.get("status", 0),
        "no failure of agentcache's own (fail_open_total)": _counted(metrics, "agentcache_proxy_fail_open_total") == 0,
    }
    lat.sort()
    result = {
        "streams": args.streams,
        "seconds": args.seconds,
        "client": dict(outcomes),
        "upstream": upstream,
        "log": {"lines": lines, "not_json": bad[:20]},
        "latency_ms": {"p50": lat[len(lat) // 2] * 1000, "max": lat[-1] * 1000} if lat else {},
        "checks": checks,
    }
    print(
        f"{args.streams} streams (+{args.idle_streams} idling 5-6 s between requests) × {args.seconds:.0f} s, fault "
        f"rate {args.fault_rate:.0%}, seed {args.seed}: {sent:,} requests"
    )
    failed = sum(outcomes[k] for k in KINDS)
    own_5xx = sum(v for k, v in outcomes.items() if k.startswith("http_5"))
    print(
        f"requests {sent:,}, succeeded {outcomes['ok']:,}, upstream-failed {failed:,}, own-5xx {own_5xx}, "
        f"hung {outcomes['hang']}, corrupted {outcomes['truncated']}"
    )
    print("| outcome | client saw | upstream injected |\n|---|---|---|")
    for k in ("ok", *KINDS, "hang", "truncated", "dropped"):
        print(f"| {k} | {outcomes[k]:,} | {upstream.get(k, 0) if k in ('ok', *KINDS) else '—'} |")
    print(f"latency p50 {result['latency_ms'].get('p50', 0):.1f} ms, max {result['latency_ms'].get('max', 0):.1f} ms")
    for name, ok in checks.items():
        print(f"{'PASS' if ok else 'FAIL'}  {name}")
    if args.json:
        args.json.write_text(json.dumps(result, indent=2))
    sys.exit(0 if all(checks.values()) else 1)


if __name__ == "__main__":
    main()
