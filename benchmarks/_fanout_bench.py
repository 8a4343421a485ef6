"""The fan-out part of ``proxy_bench.py`` (``--fanout``): sibling subagents sent at once through the agentcache
proxy, with coalescing on and off, in front of the bench's fake upstream answering after ``ttft`` seconds.

Each round sends ``siblings`` requests of one parent at once: the 14 airline tools and the airline policy, with a
round number prepended to the first tool's description and to the policy (a new ~3.1K-token prefix each round, so
nothing is cached yet), and each subagent's own task. Figures: how many requests were held, the hold-time
distribution (from the proxy's ``proxy.request`` log lines, field ``coalesce.hold_ms``), the estimated write
tokens saved, and the whole-response latency per request (client side), coalescing on against
``--no-coalesce``.
"""

from __future__ import annotations

import asyncio
import json
import statistics
import subprocess
import sys
import tempfile
import time
from pathlib import Path
from typing import Any

import httpx


def _bodies(system: str, tools: list[dict[str, Any]], round_: int, siblings: int) -> list[dict[str, Any]]:
    head = f"Run {round_}. "
    if tools:  # the round's number leads the prefix (tools come first), so each round's ~3.1K tokens are new
        tools = [{**tools[0], "description": head + tools[0]["description"]}, *tools[1:]]
    return [
        {
            "model": "claude-opus-4-8",
            "max_tokens": 64,
            "stream": True,
            "system": head + system,
            "tools": tools,
            "messages": [{"role": "user", "content": f"Subagent {k}: check reservation case {round_}-{k}."}],
        }
        for k in range(siblings)
    ]


async def _round(port: int, bodies: list[dict[str, Any]], round_: int) -> list[float]:
    async with httpx.AsyncClient(base_url=f"http://127.0.0.1:{port}", timeout=30) as client:

        async def one(k: int, body: dict[str, Any]) -> float:
            t0 = time.perf_counter()
            headers = {"x-agentcache-session": f"p{round_}/a{k}", "x-agentcache-parent": f"p{round_}"}
            r = await client.post("/v1/messages", json=body, headers=headers)
            r.raise_for_status()
            return time.perf_counter() - t0

        return list(await asyncio.gather(*(one(k, b) for k, b in enumerate(bodies))))


def _proxy(
    start: Any, free_port: Any, up_port: int, log: Path, coalesce: bool
) -> tuple[subprocess.Popen[bytes], int, Any]:
    port = free_port()
    argv = [sys.executable, "-m", "agentcache", "--log-format", "json", "--log-level", "info", "proxy",
            "--upstream", f"http://127.0.0.1:{up_port}", "--port", str(port)]  # fmt: skip
    if not coalesce:
        argv.append("--no-coalesce")
    out = log.open("wb")
    proc = subprocess.Popen(argv, stdout=subprocess.DEVNULL, stderr=out)
    start(port)
    return proc, port, out


def _holds(log: Path) -> list[dict[str, Any]]:
    out = []
    for line in log.read_text().splitlines():
        try:
            doc = json.loads(line)
        except ValueError:
            continue
        if doc.get("event") == "proxy.request" and isinstance(doc.get("coalesce"), dict):
            out.append(doc["coalesce"])
    return out


def _dist(xs: list[float]) -> dict[str, float]:
    if not xs:
        return {"n": 0}
    xs = sorted(xs)
    q = statistics.quantiles(xs, n=10, method="inclusive") if len(xs) > 1 else [xs[0]] * 9
    return {"n": len(xs), "p10": q[0], "p50": statistics.median(xs), "p90": q[8], "max": xs[-1]}


def fanout(
    up_port: int,
    start: Any,
    free_port: Any,
    system: str,
    tools: list[dict[str, Any]],
    *,
    rounds: int = 20,
    siblings: int = 4,
) -> dict[str, Any]:
    """Run ``rounds`` rounds through a proxy with coalescing and one without; ``start(port)`` waits for a port,
    ``free_port()`` picks one. Returns the figures (times in ms)."""
    out: dict[str, Any] = {"rounds": rounds, "siblings": siblings}
    with tempfile.TemporaryDirectory() as tmp:
        for coalesce in (True, False):
            log = Path(tmp) / f"proxy-{coalesce}.log"
            proc, port, handle = _proxy(start, free_port, up_port, log, coalesce)
            try:
                asyncio.run(_round(port, _bodies("Warm-up.", [], -1, 1), -1))
                latencies: list[float] = []
                for r in range(rounds):
                    latencies += asyncio.run(_round(port, _bodies(system, tools, r, siblings), r))
            finally:
                proc.terminate()
                proc.wait(timeout=20)
                handle.close()
            holds = _holds(log)
            key = "coalesce" if coalesce else "no_coalesce"
            out[key] = {
                "latency_ms": _dist([x * 1000 for x in latencies]),
                "held": len(holds),
                "outcomes": {o: sum(h["outcome"] == o for h in holds) for o in {h["outcome"] for h in holds}},
                "hold_ms": _dist([float(h["hold_ms"]) for h in holds]),
                "saved_write_tokens": sum(int(h["saved_write_tokens"]) for h in holds),
            }
    return out


def markdown(r: dict[str, Any], ttft: float) -> str:
    """The fan-out figures as markdown."""
    lines = [
        "",
        f"fan-out: {r['rounds']} rounds of {r['siblings']} sibling subagents sent at once (a new ~3.1K-token shared "
        f"prefix each round), upstream first byte after {ttft * 1000:.0f} ms:",
        "",
        "| proxy | requests held | hold p10 | hold p50 | hold p90 | hold max | write tokens saved (est.) | "
        "latency p50 | latency p90 | latency max |",
        "|---|---:|---:|---:|---:|---:|---:|---:|---:|---:|",
    ]
    for key in ("coalesce", "no_coalesce"):
        m = r[key]
        h, lat = m["hold_ms"], m["latency_ms"]
        hold = " | ".join(f"{h[q]:.0f}" if h["n"] else "—" for q in ("p10", "p50", "p90", "max"))
        lines.append(
            f"| {key.replace('_', ' ')} | {m['held']} {m['outcomes'] or ''} | {hold} | {m['saved_write_tokens']:,} | "
            f"{lat['p50']:.0f} | {lat['p90']:.0f} | {lat['max']:.0f} |"
        )
    lines.append("")
    lines.append("times in ms; latency: whole response, client side (a held request's includes its hold)")
    return "\n".join(lines)
