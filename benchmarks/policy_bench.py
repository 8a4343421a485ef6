"""Policy benchmark: the ``agentcache`` arm against every baseline strategy on five workloads,
under Anthropic rules with claude-opus-4-8 prices.

Run: ``python benchmarks/policy_bench.py [--json OUT]``. Prints a markdown table per workload:
cost and cached share per arm, and per session whether ``agentcache`` is at or below the best
baseline (the cheapest of anthropic_auto, langchain, litellm, no_markers for that session).
"""

from __future__ import annotations

import argparse
import json
import sys
import time
from collections import Counter
from pathlib import Path
from typing import Any

sys.path.insert(0, str(Path(__file__).resolve().parent))

from workloads import TTFT, WORKLOADS

from agentcache import audit
from agentcache.policies import STRATEGIES

MODEL = "claude-opus-4-8"


def run(name: str) -> dict[str, Any]:
    """Audit one workload with ``--compare`` and summarise it."""
    records = WORKLOADS[name]()
    t0 = time.perf_counter()
    report = audit(records, "anthropic", MODEL, compare=True, ttft=TTFT.get(name))
    elapsed = time.perf_counter() - t0
    at_or_below = strictly_below = 0
    worst: tuple[float, str] = (0.0, "")
    for s in report.sessions:
        best = min(s.arms[a].cost_usd for a in STRATEGIES)
        ours = s.arms["agentcache"].cost_usd
        at_or_below += ours <= best + 1e-12
        strictly_below += ours < best - 1e-12
        if ours - best > worst[0]:
            worst = (ours - best, s.session)
    totals = {a: m.to_dict() for a, m in report.totals.items()}
    best_total = min(STRATEGIES, key=lambda a: totals[a]["cost_usd"])
    ttl = Counter(t.prepared.ttl.ttl for t in report.turns if t.prepared is not None and t.prepared.ttl is not None)
    reasons = Counter(r for t in report.turns if t.prepared is not None for r in t.prepared.marker_reasons)
    return {
        "workload": name,
        "sessions": len(report.sessions),
        "requests": report.totals["as_sent"].requests,
        "seconds": round(elapsed, 2),
        "totals": totals,
        "best_anchor": best_total,
        "saving_vs_best_anchor": 1 - totals["agentcache"]["cost_usd"] / totals[best_total]["cost_usd"],
        "sessions_at_or_below_best": at_or_below,
        "sessions_strictly_below_best": strictly_below,
        "worst_session": {"session": worst[1], "excess_usd": worst[0]},
        "cached_share_vs_ideal": totals["agentcache"]["hit_rate"] - totals["ideal"]["hit_rate"],
        "ttl_choices": dict(ttl),
        "marker_reasons": dict(reasons),
        "ttft": TTFT.get(name),
    }


def table(res: dict[str, Any]) -> str:
    """Markdown table of one workload."""
    lines = [
        f"### {res['workload']} ({res['sessions']} sessions, {res['requests']:,} requests, "
        f"audited in {res['seconds']} s)",
        "",
        "| arm | hit rate | cost (USD) |",
        "|---|---:|---:|",
    ]
    for arm, m in res["totals"].items():
        lines.append(f"| {arm} | {m['hit_rate'] * 100:.1f}% | {m['cost_usd']:.4f} |")
    lines += [
        "",
        f"- best baseline overall: `{res['best_anchor']}`; agentcache costs "
        f"{res['saving_vs_best_anchor'] * 100:.1f}% less",
        f"- sessions where agentcache ≤ the best baseline for that session: "
        f"{res['sessions_at_or_below_best']} of {res['sessions']} "
        f"(strictly below: {res['sessions_strictly_below_best']})",
        f"- worst session: {res['worst_session']['session'] or '—'} "
        f"(+{res['worst_session']['excess_usd']:.6f} USD over its best baseline)",
        f"- cached share minus ideal's: {res['cached_share_vs_ideal'] * 100:+.2f} points",
        f"- TTL choices: {res['ttl_choices']}; marker reasons: {res['marker_reasons']}",
    ]
    if "agentcache_coalesced" in res["totals"]:
        co, ours = res["totals"]["agentcache_coalesced"]["cost_usd"], res["totals"]["agentcache"]["cost_usd"]
        best = res["totals"][res["best_anchor"]]["cost_usd"]
        lines.append(
            f"- concurrency modelled (TTFT {res['ttft']} s): agentcache with coalescing costs "
            f"{(1 - co / ours) * 100:.1f}% less than without, {(1 - co / best) * 100:.1f}% less than the best baseline"
        )
    lines.append("")
    return "\n".join(lines)


def main() -> None:
    """Run every workload and print the tables."""
    parser = argparse.ArgumentParser(description=__doc__)
    parser.add_argument("--json", type=Path, help="also write the results as JSON")
    parser.add_argument("--only", choices=sorted(WORKLOADS), action="append")
    args = parser.parse_args()
    results = [run(name) for name in (args.only or WORKLOADS)]
    for res in results:
        print(table(res))
    if args.json:
        args.json.write_text(json.dumps(results, indent=2))


if __name__ == "__main__":
    main()
