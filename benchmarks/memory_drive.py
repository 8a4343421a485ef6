"""Memory drive: ``agentcache proxy`` under traffic made to grow every structure it holds, its resident memory (RSS)
sampled against its budget ``max_state_mb``, and two sessions taking turns throughout that must keep their
generation (issue 24).

Run: ``python benchmarks/memory_drive.py [--max-state-mb 64] [--sessions 50000] [--prefixes 5000] [--models 1000]
[--huge 40] [--huge-mb 4] [--streams 8] [--seed 24] [--sample 2] [--json OUT]``. CI runs a small size of the same
drive (``tests/test_memory_drive.py``).

The traffic (seeded, so every run sends the same bodies): ``--sessions`` new conversations (four in five one turn,
the rest two), round-robin over the three pipeline routes and eight API keys (tenants); each starts from one of
``--prefixes`` tools+system prefixes (a new tool set and system prompt: new key-planner families, tool memories
and simulated prefixes) and names one of ``--models`` client-chosen model strings; ``--huge`` requests, spread
evenly, name a model string of ``--huge-mb`` MiB each (one tenant). Sessions ``drive-A`` and ``drive-B``
(``x-agentcache-session``) take a turn each every ``--every`` requests, their history growing; every one of their
answers must carry generation 0 (``x-agentcache-generation``): the sessions were never evicted.

The fake upstream (``proxy_bench.serve_upstream``, its own process) streams one short answer to everything. The
proxy's RSS is read from ``/proc/<pid>/status`` every ``--sample`` seconds; ``baseline`` is its RSS once started
and warmed by 200 requests. The run passes when no request failed, the two sessions kept their generation, the
peak RSS stayed within ``baseline + 1.5 × max_state_mb`` and the last third of the run grew by less than a tenth of
the budget (a plateau). The proxy's own accounting (``agentcache_proxy_state_bytes{part}`` against
``agentcache_proxy_state_budget_bytes{part}``) is printed beside it.
"""

from __future__ import annotations

import argparse
import asyncio
import json
import random
import sys
import time
from collections.abc import Iterator
from dataclasses import dataclass
from pathlib import Path
from typing import Any

sys.path.insert(0, str(Path(__file__).resolve().parent))

from proxy_bench import Conn, _rss_kb, proxy_behind, serve_upstream

ROUTES = ("/v1/messages", "/v1/chat/completions", "/v1/responses")
TENANTS = 8
WORDS = (
    "flight", "booking", "reservation", "passenger", "baggage", "refund", "upgrade", "seat", "cabin", "policy",
    "cancel", "change", "airport", "delay", "voucher", "member", "gold", "silver", "economy", "business",
)  # fmt: skip


@dataclass(frozen=True)
class Job:
    """One request: its route, body, API key and the session id it names (None: inferred)."""

    route: str
    body: bytes
    key: str
    session: str | None = None


def _text(rng: random.Random, n: int) -> str:
    return " ".join(rng.choice(WORDS) for _ in range(n))


def _prefix(p: int) -> tuple[str, list[dict[str, Any]]]:
    """Prefix ``p``'s system prompt (~1.5 KB) and tools (3-6, named for it)."""
    rng = random.Random(p)
    system = f"You are support agent {p} of team {p % 97}. " + _text(rng, 220)
    tools = [
        {"name": f"tool_{p % 400}_{j}", "description": _text(rng, 20),
         "input_schema": {"type": "object", "properties": {"q": {"type": "string"}, "n": {"type": "integer"}}}}
        for j in range(3 + p % 4)
    ]  # fmt: skip
    return system, tools


def body(route: str, model: str, prefix: int, messages: list[dict[str, str]]) -> bytes:
    """A streaming request of ``route`` with prefix ``prefix`` and ``messages`` (role/content pairs)."""
    system, tools = _prefix(prefix)
    if route == "/v1/messages":
        doc: dict[str, Any] = {"model": model, "max_tokens": 64, "stream": True, "system": system, "tools": tools,
                               "messages": messages}  # fmt: skip
    elif route == "/v1/chat/completions":
        fns = [{"type": "function", "function": {"name": t["name"], "description": t["description"],
                                                 "parameters": t["input_schema"]}} for t in tools]  # fmt: skip
        doc = {"model": model, "stream": True, "tools": fns, "messages": [{"role": "system", "content": system},
                                                                          *messages]}  # fmt: skip
    else:
        fns = [{"type": "function", "name": t["name"], "description": t["description"],
                "parameters": t["input_schema"]} for t in tools]  # fmt: skip
        doc = {"model": model, "stream": True, "instructions": system, "tools": fns, "input": messages}
    return json.dumps(doc).encode()


def model_name(route: str, i: int) -> str:
    """The ``i``-th client-chosen model string of a route's provider (60-120 bytes)."""
    base = "claude-sonnet-4-5" if route == "/v1/messages" else "gpt-4o"
    return f"{base}-ft-{i:04d}-" + "v" * (40 + i % 60)


def flood(args: argparse.Namespace) -> Iterator[Job]:
    """The drive's conversations (see the module docstring), with the huge-model requests spread among them."""
    rng = random.Random(args.seed)
    every_huge = max(1, args.sessions // max(1, args.huge)) if args.huge else 0
    huge = 0
    for s in range(args.sessions):
        route = ROUTES[s % len(ROUTES)]
        key = f"sk-drive-{s % TENANTS}"
        model = model_name(route, s % args.models)
        msgs = [{"role": "user", "content": f"conversation {s}: " + _text(rng, 60)}]
        yield Job(route, body(route, model, s % args.prefixes, msgs), key)
        if rng.random() < 0.2:
            msgs += [{"role": "assistant", "content": _text(rng, 40)}, {"role": "user", "content": _text(rng, 30)}]
            yield Job(route, body(route, model, s % args.prefixes, msgs), key)
        if every_huge and s % every_huge == every_huge - 1 and huge < args.huge:
            name = f"claude-huge-{huge}-" + "m" * (args.huge_mb << 20)
            yield Job("/v1/messages", body("/v1/messages", name, s % args.prefixes, msgs[:1]), "sk-drive-0")
            huge += 1


class Client(Conn):
    """A keep-alive connection that also sends ``x-agentcache-session`` and keeps the answer's headers."""

    async def send(self, job: Job) -> tuple[int, dict[bytes, bytes]]:
        if self.writer is None:
            await self.open()
        assert self.reader is not None and self.writer is not None
        sid = f"x-agentcache-session: {job.session}\r\n" if job.session else ""
        head = (
            f"POST {job.route} HTTP/1.1\r\nhost: 127.0.0.1\r\ncontent-type: application/json\r\n{sid}"
            f"x-api-key: {job.key}\r\nauthorization: Bearer {job.key}\r\ncontent-length: {len(job.body)}\r\n\r\n"
        ).encode()
        self.writer.write(head + job.body)
        await self.writer.drain()
        raw = await self.reader.readuntil(b"\r\n\r\n")
        status = int(raw.split(b" ", 2)[1])
        headers = {k.strip().lower(): v.strip() for k, _, v in (ln.partition(b":") for ln in raw.split(b"\r\n")[1:])}
        if b"chunked" in headers.get(b"transfer-encoding", b""):
            while True:
                size = int((await self.reader.readuntil(b"\r\n")).split(b";")[0], 16)
                await self.reader.readexactly(size + 2)
                if size == 0:
                    break
        else:
            await self.reader.readexactly(int(headers.get(b"content-length", b"0")))
        return status, headers


async def drive(port: int, pid: int, args: argparse.Namespace) -> dict[str, Any]:
    """The load and the samples: ``{"requests", "errors", "turns", "generations", "baseline", "samples"}``."""
    jobs = flood(args)
    count = {"requests": 0, "errors": 0}
    generations: list[str] = []
    turns = {"drive-A": [{"role": "user", "content": "hello A"}], "drive-B": [{"role": "user", "content": "hello B"}]}
    state = {"next_turn": args.every, "warm": False}

    async def take_turns(conn: Client) -> None:
        for sid, msgs in turns.items():
            status, headers = await conn.send(Job("/v1/messages", body("/v1/messages", "claude-sonnet-4-5", 7, msgs),
                                                  "sk-drive-0", sid))  # fmt: skip
            count["errors"] += status != 200
            generations.append(headers.get(b"x-agentcache-generation", b"?").decode())
            msgs += [{"role": "assistant", "content": f"ok {len(msgs)}"}, {"role": "user", "content": f"more {sid}"}]

    async def worker(w: int) -> None:
        conn = Client(port)
        for job in jobs:
            try:
                status, _ = await conn.send(job)
            except (asyncio.IncompleteReadError, ConnectionError):
                conn.writer, status = None, 0
            count["requests"] += 1
            count["errors"] += status != 200
            if w == 0 and count["requests"] >= state["next_turn"]:
                state["next_turn"] += args.every
                await take_turns(turns_conn)

    turns_conn = Client(port)
    samples: list[tuple[float, int, float]] = []
    tasks = [asyncio.create_task(worker(w)) for w in range(args.streams)]
    t0 = time.monotonic()
    baseline = None
    while not all(t.done() for t in tasks):
        await asyncio.sleep(0.2 if baseline is None else args.sample)
        rss = _rss_kb(pid) / 1024
        if baseline is None and count["requests"] >= 200:
            baseline, t0 = rss, time.monotonic()
        if baseline is not None:
            samples.append((time.monotonic() - t0, count["requests"], rss))
    await asyncio.gather(*tasks)
    samples.append((time.monotonic() - t0, count["requests"], _rss_kb(pid) / 1024))
    return {**count, "generations": generations, "baseline": baseline or samples[0][2], "samples": samples}


async def accounting(port: int) -> dict[str, tuple[float, float]]:
    """The proxy's own ``part → (bytes held, budget bytes)`` from ``/metrics``."""
    reader, writer = await asyncio.open_connection("127.0.0.1", port)
    writer.write(b"GET /metrics HTTP/1.1\r\nhost: 127.0.0.1\r\nconnection: close\r\n\r\n")
    text = (await reader.read()).decode()
    writer.close()
    out: dict[str, list[float]] = {}
    for line in text.splitlines():
        for name, slot in (("agentcache_proxy_state_bytes{", 0), ("agentcache_proxy_state_budget_bytes{", 1)):
            if line.startswith(name):
                part = line.split('part="')[1].split('"')[0]
                out.setdefault(part, [0.0, 0.0])[slot] = float(line.rsplit(" ", 1)[1])
    return {k: (v[0], v[1]) for k, v in out.items()}


def checks(run: dict[str, Any], budget: int) -> dict[str, bool]:
    """The pass conditions of the module docstring."""
    samples, base = run["samples"], run["baseline"]
    peak = max(s[2] for s in samples)
    third = [s for s in samples if s[0] >= samples[-1][0] * 2 / 3]
    late = third[-1][2] - third[0][2] if len(third) > 1 else 0.0
    return {
        "no request failed": run["errors"] == 0,
        f"both sessions kept generation 0 ({len(run['generations'])} turns)": set(run["generations"]) == {"0"},
        f"peak RSS within baseline + 1.5 × max_state_mb ({base:.0f} + {1.5 * budget:.0f} MB)": peak
        <= base + 1.5 * budget,
        "plateau: the last third grew < 10% of the budget": late < 0.1 * budget,
    }


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("--serve-upstream", type=int, help=argparse.SUPPRESS)
    parser.add_argument("--max-state-mb", type=int, default=64)
    parser.add_argument("--sessions", type=int, default=50_000)
    parser.add_argument("--prefixes", type=int, default=5_000)
    parser.add_argument("--models", type=int, default=1_000)
    parser.add_argument("--huge", type=int, default=40)
    parser.add_argument("--huge-mb", type=int, default=4)
    parser.add_argument("--streams", type=int, default=8)
    parser.add_argument("--every", type=int, default=250, help="requests between two turns of drive-A and drive-B")
    parser.add_argument("--seed", type=int, default=24)
    parser.add_argument("--sample", type=float, default=2.0)
    parser.add_argument("--json", type=Path)
    args = parser.parse_args()
    if args.serve_upstream:
        serve_upstream(args.serve_upstream)
        return
    with proxy_behind(__file__, args.max_state_mb) as (px, pid):
        run = asyncio.run(drive(px, pid, args))
        parts = asyncio.run(accounting(px))
    result = checks(run, args.max_state_mb)
    report(run, parts, result, args)
    if args.json:
        doc = {"args": {k: str(v) for k, v in vars(args).items()}, **run, "parts": parts, "checks": result}
        args.json.write_text(json.dumps(doc))
    sys.exit(0 if all(result.values()) else 1)


def report(run: dict[str, Any], parts: dict[str, tuple[float, float]], result: dict[str, bool], args: Any) -> None:
    """Print the run's figures (markdown tables)."""
    print(
        f"{args.sessions:,} sessions, {args.prefixes:,} prefixes, {args.models:,} model strings, {args.huge} × "
        f"{args.huge_mb} MiB model strings, {args.streams} streams; max_state_mb {args.max_state_mb}: "
        f"{run['requests']:,} requests, baseline RSS {run['baseline']:.0f} MB"
    )
    print("| t (s) | requests | RSS (MB) | over baseline (MB) |\n|---:|---:|---:|---:|")
    samples = run["samples"]
    step = max(1, len(samples) // 12)
    for t, n, rss in [*samples[::step], samples[-1]]:
        print(f"| {t:.0f} | {n:,} | {rss:.0f} | {rss - run['baseline']:.0f} |")
    if parts:
        print("\n| part | held (MB) | share (MB) |\n|---|---:|---:|")
        for part, (held, share) in sorted(parts.items()):
            print(f"| {part} | {held / 2**20:.1f} | {share / 2**20:.1f} |")
    for name, ok in result.items():
        print(f"{'PASS' if ok else 'FAIL'}  {name}")


if __name__ == "__main__":
    main()
