"""Load with faults: 200 concurrent streaming agent sessions through ``agentcache proxy`` for 60 s, with a fault
injected on 5% of upstream calls. Every client request must either succeed or get the upstream's failure, as
the same kind of failure; none may hang and none may be lost.

Run: ``python benchmarks/proxy_load.py [--streams 200] [--seconds 60] [--fault-rate 0.05] [--json OUT]``.

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
"""

from __future__ import annotations

import argparse
import asyncio
import json
import random
import socket
import sys
import time
from collections import Counter
from pathlib import Path

sys.path.insert(0, str(Path(__file__).resolve().parent))

from proxy_bench import _CHUNKS, _HEAD, Conn, Conversations, _free_port, _start

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


async def drive(port: int, streams: int, seconds: float) -> tuple[Counter[str], list[float]]:
    """``streams`` concurrent conversations for ``seconds``; outcome counts and latencies."""
    convs = Conversations(target=12_000)
    outcomes: Counter[str] = Counter()
    latencies: list[float] = []
    deadline = time.monotonic() + seconds

    async def worker(w: int) -> None:
        conn = Conn(port)
        bodies: list[bytes] = []
        while time.monotonic() < deadline:
            bodies = bodies or convs.session(w)
            outcome, dt = await _one(conn, bodies.pop(0), f"sk-load-{w % 8}")
            outcomes[outcome] += 1
            latencies.append(dt)

    await asyncio.gather(*(worker(w) for w in range(streams)))
    return outcomes, latencies


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
    parser.add_argument("--json", type=Path)
    args = parser.parse_args()
    if args.serve_upstream:
        serve_faulty(args.serve_upstream, args.fault_rate)
        return
    up, px = _free_port(), _free_port()
    argv = [sys.executable, __file__, "--serve-upstream", str(up), "--fault-rate", str(args.fault_rate)]
    procs = [_start(argv, up)]
    try:
        env = {"AGENTCACHE_PROXY_READ_TIMEOUT": "2"}
        cmd = [sys.executable, "-m", "agentcache", "proxy", "--upstream", f"http://127.0.0.1:{up}", "--port", str(px)]
        procs.append(_start(cmd, px, env))
        outcomes, lat = asyncio.run(drive(px, args.streams, args.seconds))
        upstream = asyncio.run(_stats(up))
    finally:
        for p in procs:
            p.terminate()
        for p in procs:
            p.wait(timeout=20)
    sent = sum(outcomes.values())
    checks = {
        "no request hung": outcomes["hang"] == 0,
        "no broken stream looked complete": outcomes["truncated"] == 0,
        "no 5xx of agentcache's own": not any(k.startswith("http_5") for k in outcomes),
        "none lost (upstream calls == client requests)": upstream.get("calls", 0) == sent,
        **{f"{k}: client saw what upstream injected": outcomes[k] == upstream.get(k, 0) for k in KINDS},
        "every other request completed": outcomes["ok"] == upstream.get("ok", 0),
    }
    lat.sort()
    result = {
        "streams": args.streams,
        "seconds": args.seconds,
        "client": dict(outcomes),
        "upstream": upstream,
        "latency_ms": {"p50": lat[len(lat) // 2] * 1000, "max": lat[-1] * 1000} if lat else {},
        "checks": checks,
    }
    print(f"{args.streams} streams × {args.seconds:.0f} s, fault rate {args.fault_rate:.0%}: {sent:,} requests")
    failed = sum(outcomes[k] for k in KINDS)
    own_5xx = sum(v for k, v in outcomes.items() if k.startswith("http_5"))
    print(
        f"requests {sent:,}, succeeded {outcomes['ok']:,}, upstream-failed {failed:,}, own-5xx {own_5xx}, "
        f"hung {outcomes['hang']}, corrupted {outcomes['truncated']}"
    )
    print("| outcome | client saw | upstream injected |\n|---|---|---|")
    for k in ("ok", *KINDS, "hang", "truncated"):
        print(f"| {k} | {outcomes[k]:,} | {upstream.get(k, 0) if k in ('ok', *KINDS) else '—'} |")
    print(f"latency p50 {result['latency_ms'].get('p50', 0):.1f} ms, max {result['latency_ms'].get('max', 0):.1f} ms")
    for name, ok in checks.items():
        print(f"{'PASS' if ok else 'FAIL'}  {name}")
    if args.json:
        args.json.write_text(json.dumps(result, indent=2))
    sys.exit(0 if all(checks.values()) else 1)


if __name__ == "__main__":
    main()
