"""Memory soak: ``agentcache proxy`` under traffic whose every request is new to it, sampling the proxy's
resident memory (RSS) against its budget ``max_state_mb``.

Run: ``python benchmarks/memory_soak.py [--seconds 90] [--streams 16] [--max-state-mb 64] [--model-bytes 2000]
[--sample 5] [--json OUT]``.

Each of ``--streams`` clients replays multi-turn conversations (``proxy_bench.Conversations``, tau-bench text,
~12 KB bodies) where every request carries a system prompt stamped with the current time (an agent that puts
``now`` in its prompt: a new tools+system prefix, so a new session and a new key-planner family, per request)
and every conversation picks a new client-chosen ``model`` of ``--model-bytes`` characters. Half the clients
speak Anthropic ``/v1/messages``, half OpenAI ``/v1/chat/completions`` (the key planner and the OpenAI
simulator). The fake upstream (``proxy_bench.serve_upstream``, its own process) streams the same short answer
to everything.

The proxy's RSS is read from ``/proc/<pid>/status`` every ``--sample`` seconds. ``baseline`` is its RSS once
started and warmed by 50 requests; the run passes when the growth over the baseline never exceeds
1.1 × ``max_state_mb`` (the budget counts estimates; what it leaves out is small and fixed-size: the
model-rules LRU caches, 4,096 lineages, allocator slack) and the last third of the run grew by less than 10%
of the budget (a plateau, not a slope).
"""

from __future__ import annotations

import argparse
import asyncio
import json
import sys
import time
from pathlib import Path
from typing import Any

sys.path.insert(0, str(Path(__file__).resolve().parent))

from proxy_bench import Conn, Conversations, _rss_kb, proxy_behind, serve_upstream


def _stamp(body: bytes, model: str, chat: bool) -> bytes:
    """``body`` (an Anthropic request) with a time-stamped system prompt and ``model``; as OpenAI Chat when
    ``chat``."""
    doc: dict[str, Any] = json.loads(body)
    system = f"Current time: {time.time():.6f}.\n{doc['system']}"
    doc["model"] = model
    if not chat:
        doc["system"] = system
        return json.dumps(doc).encode()
    messages = [{"role": "system", "content": system}]
    for m in doc["messages"]:
        messages.append({"role": m["role"], "content": "".join(p.get("text", "") for p in m["content"])})
    tools = [
        {"type": "function", "function": {"name": t["name"], "description": t.get("description", ""),
                                          "parameters": t.get("input_schema", {})}}
        for t in doc.get("tools", [])
    ]  # fmt: skip
    return json.dumps({"model": model, "messages": messages, "tools": tools, "stream": True}).encode()


async def drive(port: int, pid: int, streams: int, seconds: float, model_bytes: int, sample: float) -> dict[str, Any]:
    """The load and the RSS samples: ``{"requests", "errors", "samples": [(t, requests, rss_mb)]}``."""
    convs = Conversations(target=12_000)
    count = {"requests": 0, "errors": 0}
    serial = 0

    async def worker(w: int, until: float) -> None:
        nonlocal serial
        conn = Conn(port)
        chat = w % 2 == 1
        path = "/v1/chat/completions" if chat else "/v1/messages"
        bodies: list[bytes] = []
        model = ""
        while time.monotonic() < until:
            if not bodies:
                bodies, serial = convs.session(w), serial + 1
                name = f"claude-sonnet-4-5-{serial}-" if not chat else f"gpt-4o-{serial}-"
                model = (name + "x" * model_bytes)[:model_bytes]
            try:
                status, _, _ = await conn.post(path, _stamp(bodies.pop(0), model, chat), f"sk-soak-{w % 4}")
            except (asyncio.IncompleteReadError, ConnectionError):
                conn.writer = None
                status = 0
            count["requests"] += 1
            count["errors"] += status != 200

    warm_until = time.monotonic() + 600
    warm = [asyncio.create_task(worker(w, warm_until)) for w in range(2)]
    while count["requests"] < 50:
        await asyncio.sleep(0.1)
    for task in warm:
        task.cancel()
    await asyncio.gather(*warm, return_exceptions=True)
    count["requests"] = count["errors"] = 0
    t0 = time.monotonic()
    samples = [(0.0, 0, _rss_kb(pid) / 1024)]
    until = t0 + seconds
    tasks = [asyncio.create_task(worker(w, until)) for w in range(streams)]
    while time.monotonic() < until:
        await asyncio.sleep(min(sample, max(0.0, until - time.monotonic())))
        samples.append((time.monotonic() - t0, count["requests"], _rss_kb(pid) / 1024))
    await asyncio.gather(*tasks)
    return {**count, "samples": samples}


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("--serve-upstream", type=int, help=argparse.SUPPRESS)
    parser.add_argument("--seconds", type=float, default=90.0)
    parser.add_argument("--streams", type=int, default=16)
    parser.add_argument("--max-state-mb", type=int, default=64)
    parser.add_argument("--model-bytes", type=int, default=2000)
    parser.add_argument("--sample", type=float, default=5.0)
    parser.add_argument("--json", type=Path)
    args = parser.parse_args()
    if args.serve_upstream:
        serve_upstream(args.serve_upstream)
        return
    with proxy_behind(__file__, args.max_state_mb) as (px, pid):
        run = asyncio.run(drive(px, pid, args.streams, args.seconds, args.model_bytes, args.sample))
    samples = run["samples"]
    base = samples[0][2]
    peak = max(s[2] for s in samples)
    third = [s for s in samples if s[0] >= samples[-1][0] * 2 / 3]
    late = third[-1][2] - third[0][2] if len(third) > 1 else 0.0
    checks = {
        "no request failed": run["errors"] == 0,
        f"growth over baseline within 1.1 × max_state_mb ({args.max_state_mb} MB)": peak - base
        <= 1.1 * args.max_state_mb,
        "plateau: last third grew < 10% of the budget": late < 0.1 * args.max_state_mb,
    }
    print(
        f"{args.streams} streams × {args.seconds:.0f} s, max_state_mb {args.max_state_mb}, model names of "
        f"{args.model_bytes} B, a new time-stamped system prompt per request: {run['requests']:,} requests"
    )
    print("| t (s) | requests | RSS (MB) | over baseline (MB) | budget (MB) |\n|---|---|---|---|---|")
    for t, n, rss in samples:
        print(f"| {t:.0f} | {n:,} | {rss:.1f} | {rss - base:.1f} | {args.max_state_mb} |")
    for name, ok in checks.items():
        print(f"{'PASS' if ok else 'FAIL'}  {name}")
    if args.json:
        args.json.write_text(json.dumps({"args": vars(args) | {"json": str(args.json)}, **run, "checks": checks}))
    sys.exit(0 if all(checks.values()) else 1)


if __name__ == "__main__":
    main()
