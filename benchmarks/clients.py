"""Real agent CLIs through ``agentcache proxy``: per client, what the proxy understood (issue 11).

Runs each installed client (Claude Code, Codex CLI, opencode) through the scenarios of ``tests/clients`` (a fresh
run, two continues/resumes, a fresh run with the same opening prompt, a subagent spawn) against the scripted fake
upstream, through the proxy, and prints per client: requests, cache markers the client set and how many are
still set in the forwarded requests (plus those agentcache added), sessions against true conversations, subagents
linked to their parent, and the breaks the proxy reported with their causes (and how many the client itself
caused).

    python benchmarks/clients.py [--clients claude-code,codex,opencode] [--json]

Needs the clients on PATH or in ``~/.cache/agentcache/npm`` (``.ci/run`` installs them). ~1-2 min.
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

from tests.clients.drivers import CLIENTS, find_binary
from tests.clients.harness import Trace, break_is_client_caused, markers, run_trace


def figures(trace: Trace) -> dict[str, Any]:
    """The per-client figures of one proxied trace (see the module docstring)."""
    set_by_client = kept = added = 0
    for ex in trace.exchanges:
        sent = set(markers(ex.sent.body))
        forwarded = set(markers(ex.forwarded.body if ex.forwarded else {}))
        set_by_client += len(sent)
        kept += len(sent & forwarded)
        added += len(forwarded - sent)
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
    return {
        "client": trace.client,
        "requests": len(trace.exchanges),
        "markers_client_set": set_by_client,
        "markers_still_set": kept,
        "markers_added": added,
        "sessions": len(sessions),
        "conversations": len(labels),
        "subagent_links": f"{linked}/{len(subs)}",
        "breaks": sum(causes.values()),
        "breaks_client_caused": client_caused,
        "break_causes": dict(causes),
    }


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    parser.add_argument("--clients", default=",".join(CLIENTS))
    parser.add_argument("--json", action="store_true", help="print the figures as JSON")
    args = parser.parse_args()
    rows = []
    home = Path(tempfile.mkdtemp(prefix="agentcache-clients-bench-"))
    for name in args.clients.split(","):
        if find_binary(CLIENTS[name].binary) is None:
            print(f"{name}: {CLIENTS[name].binary} not installed, skipped", file=sys.stderr)
            continue
        rows.append(figures(run_trace(name, "proxy", home / name)))
    if args.json:
        print(json.dumps(rows, indent=2))
        return
    print(
        "| client | requests | markers client-set / still set (+ added) | sessions / conversations "
        "| subagent links | breaks (client-caused) | causes |"
    )
    print("|---|---|---|---|---|---|---|")
    for r in rows:
        causes = ", ".join(f"{k} {v}" for k, v in sorted(r["break_causes"].items())) or "—"
        print(
            f"| {r['client']} | {r['requests']} | {r['markers_client_set']} / {r['markers_still_set']} "
            f"(+{r['markers_added']}) | {r['sessions']} / {r['conversations']} | {r['subagent_links']} "
            f"| {r['breaks']} ({r['breaks_client_caused']}) | {causes} |"
        )


if __name__ == "__main__":
    main()
