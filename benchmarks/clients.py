"""Real agent CLIs through ``agentcache proxy``: per client, what the proxy understood and what it cost (issues 11
and 23).

Runs each installed client set-up (Claude Code, Codex CLI, opencode; Qwen Code in OpenAI Chat and Anthropic modes;
aider in OpenAI and Anthropic modes), at the pinned and the newest version, through the scenarios of
``tests/clients`` (a fresh run, continues/resumes, a fresh run with the same opening prompt, a subagent spawn)
against the scripted fake upstream, through the proxy, and prints per client and provider: requests, cache markers
the client set and how many are still set with the same value in the forwarded requests (plus those agentcache
added), sessions against true conversations, subagents linked to their parent, the breaks the proxy reported with
their causes (and how many the client itself caused), and the proxy's live report of the client's own traffic
(``as_sent``) against what agentcache sent (``agentcache``): simulated cost in USD and hit rate.

    python benchmarks/clients.py [--clients claude-code,qwen-code,...] [--builds pinned,newest] [--json]

Needs the clients where ``.ci/run`` installs them (``~/.cache/agentcache/npm``, ``npm-latest``, ``aider``); a newest
build that is the pinned version is left out. ~10 min on a loaded 2-vCPU VM.
"""

from __future__ import annotations

import argparse
import json
import sys
import tempfile
from collections import Counter
from pathlib import Path
from typing import Any

sys.path.insert(0, str(Path(__file__).resolve().parent.parent))

from tests.clients.drivers import BUILDS, CLIENTS, find_binary
from tests.clients.harness import Trace, break_is_client_caused, markers, run_trace


def figures(trace: Trace) -> dict[str, Any]:
    """The per-client figures of one proxied trace (see the module docstring)."""
    set_by_client = kept = added = 0
    for ex in trace.exchanges:
        sent = markers(ex.sent.body)
        forwarded = markers(ex.forwarded.body if ex.forwarded else {})
        set_by_client += len(sent)
        kept += sum(1 for p, m in sent.items() if forwarded.get(p) == m)
        added += len(set(forwarded) - set(sent))
    labels = {ex.label for ex in trace.exchanges}
    sessions = {ex.session for ex in trace.exchanges}
    subs = {ex.session for ex in trace.exchanges if ex.label.endswith(":sub")}
    parent = next((ex.session for ex in trace.exchanges if ex.label == "subagent:main"), None)
    linked = sum(1 for s in subs if s is not None and s != parent and trace.parents.get(s) == parent)
    causes: Counter[str] = Counter()
    client_caused = 0
    for brk in trace.report.get("breaks", []):
        causes[brk["cause"]] += 1
        client_caused += break_is_client_caused(trace, brk)
    totals = trace.report["totals"]
    route = trace.exchanges[0].forwarded.route if trace.exchanges and trace.exchanges[0].forwarded else ""
    return {
        "client": trace.client,
        "version": trace.version,
        "provider": "anthropic" if route == "messages" else "openai",
        "requests": len(trace.exchanges),
        "markers_client_set": set_by_client,
        "markers_kept_by_value": kept,
        "markers_added": added,
        "sessions": len(sessions),
        "conversations": len(labels),
        "subagent_links": f"{linked}/{len(subs)}",
        "breaks": sum(causes.values()),
        "breaks_client_caused": client_caused,
        "break_causes": dict(causes),
        "as_sent": {k: totals["as_sent"][k] for k in ("cost_usd", "hit_rate")},
        "agentcache": {k: totals["agentcache"][k] for k in ("cost_usd", "hit_rate")},
    }


def _row(r: dict[str, Any]) -> str:
    a, b = r["as_sent"], r["agentcache"]
    saved = (a["cost_usd"] - b["cost_usd"]) / a["cost_usd"] if a["cost_usd"] else 0.0
    causes = ", ".join(f"{k} {v}" for k, v in sorted(r["break_causes"].items())) or "—"
    return (
        f"| {r['client']} {r['version']} | {r['provider']} | {r['requests']} | {a['cost_usd']:.4f} / "
        f"{a['hit_rate']:.1%} | {b['cost_usd']:.4f} / {b['hit_rate']:.1%} | {saved:+.1%} | {r['sessions']} / "
        f"{r['conversations']} | {r['subagent_links']} | {r['markers_client_set']} / {r['markers_kept_by_value']} "
        f"(+{r['markers_added']}) | {r['breaks']} ({r['breaks_client_caused']}) {causes} |"
    )


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    parser.add_argument("--clients", default=",".join(CLIENTS))
    parser.add_argument("--builds", default=",".join(BUILDS))
    parser.add_argument("--json", action="store_true", help="print the figures as JSON")
    args = parser.parse_args()
    rows: list[dict[str, Any]] = []
    home = Path(tempfile.mkdtemp(prefix="agentcache-clients-bench-"))
    for name in args.clients.split(","):
        seen: set[str] = set()
        for build in args.builds.split(","):
            if find_binary(CLIENTS[name].binary, build) is None:
                print(f"{name} ({build}): {CLIENTS[name].binary} not installed, skipped", file=sys.stderr)
                continue
            version = CLIENTS[name](home / "versions", build).version()
            if version in seen:
                continue
            seen.add(version)
            rows.append(figures(run_trace(name, "proxy", home / f"{name}-{build}", build=build)))
    if args.json:
        print(json.dumps(rows, indent=2))
        return
    print(
        "| client | provider | requests | as_sent USD / hit rate | agentcache USD / hit rate | saved "
        "| sessions / conversations | subagent links | markers client-set / kept by value (+ added) "
        "| breaks (client-caused) |"
    )
    print("|---|---|---:|---:|---:|---:|---|---|---|---|")
    for r in rows:
        print(_row(r))


if __name__ == "__main__":
    main()
