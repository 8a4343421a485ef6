"""A subagent fan-out workload for ``agentcache plan``, built from the bundled tau-bench text.

``parents`` agent sessions (tau-bench airline runs, their recorded requests ``turn_gap`` seconds apart) each fan
out, at their middle turn, into ``fanout`` subagent sessions. A subagent's first request is the parent's prompt
so far plus its own subtask (a long shared prefix, as a coding agent's ``Task`` tool sends it); it runs ``steps``
requests, each adding a tool call and a real tau-bench tool output, then ends. The parent resumes ``wait``
seconds after the fan-out (the slowest subtask). Parents start ``stagger`` seconds apart, so one parent's
subagents run while another parent waits: the case where session-aware eviction keeps the waiting parent's
prefix and plain LRU evicts it. Deterministic (no randomness).

``python benchmarks/subagents.py OUT.jsonl`` writes it as a JSONL request log (``agentcache plan OUT.jsonl``).
"""

from __future__ import annotations

import json
import sys
from pathlib import Path
from typing import Any

ROOT = Path(__file__).resolve().parent.parent
sys.path.insert(0, str(ROOT))

from agentcache.loaders import Record, load  # noqa: E402

TAU = ROOT / "data" / "tau-bench" / "gpt-4o-airline.json"


def _tool_outputs(records: list[Record]) -> list[str]:
    seen: dict[str, None] = {}
    for r in records:
        for m in r.body["messages"]:
            if m.get("role") == "tool" and isinstance(m.get("content"), str) and len(m["content"]) > 200:
                seen[m["content"]] = None
    return list(seen)


def subagent_fanout(
    parents: int = 8,
    fanout: int = 6,
    steps: int = 3,
    turn_gap: float = 5.0,
    wait: float = 120.0,
    stagger: float = 40.0,
) -> list[Record]:
    """The workload described in the module docstring, as records in time order (``at`` in seconds)."""
    tau = load(TAU).records
    outputs = _tool_outputs(tau)
    by_session: dict[str, list[Record]] = {}
    for r in tau:
        by_session.setdefault(r.session, []).append(r)
    runs = [recs for recs in by_session.values() if len(recs) >= 6][:parents]
    out: list[Record] = []
    k = 0
    for p, recs in enumerate(runs):
        parent = f"parent{p}"
        t = p * stagger
        mid = len(recs) // 2
        for i, r in enumerate(recs):
            if i == mid:
                base: dict[str, Any] = recs[i - 1].body
                for s in range(fanout):
                    messages = [
                        *base["messages"],
                        {"role": "user", "content": f"Subtask {s}: check {outputs[k % len(outputs)][:80]}"},
                    ]
                    for step in range(steps):
                        body = {**base, "messages": list(messages)}
                        out.append(Record(f"{parent}.sub{s}", "openai.chat", body, t + 0.5 * s + 4.0 * step))
                        call = {
                            "id": f"c{p}_{s}_{step}",
                            "type": "function",
                            "function": {"name": "lookup", "arguments": "{}"},
                        }
                        messages += [
                            {"role": "assistant", "content": None, "tool_calls": [call]},
                            {"role": "tool", "tool_call_id": call["id"], "content": outputs[k % len(outputs)]},
                        ]
                        k += 1
                t += wait
            out.append(Record(parent, "openai.chat", r.body, t))
            t += turn_gap
    out.sort(key=lambda r: r.at or 0.0)
    return out


def main(argv: list[str]) -> int:
    """Write the workload to ``argv[0]`` as JSONL."""
    if len(argv) != 1:
        print("usage: python benchmarks/subagents.py OUT.jsonl", file=sys.stderr)
        return 2
    with open(argv[0], "w") as f:
        for r in subagent_fanout():
            f.write(json.dumps({"session": r.session, "api": r.api, "at": r.at, "body": r.body}) + "\n")
    return 0


if __name__ == "__main__":
    raise SystemExit(main(sys.argv[1:]))
