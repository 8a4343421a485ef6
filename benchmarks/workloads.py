"""Workloads for the policy benchmark, all built from real recorded traffic in ``data/``.

* ``taubench``: the 200 tau-bench airline sessions as recorded (2,454 requests, no timestamps).
* ``swe-agent``: the SWE-agent function-calling trajectory (its client elides old tool outputs).
* ``fanout``: tau-bench sessions where every tool call is fanned out into 12 parallel calls, so each
  tool turn appends 24+ blocks (more than Anthropic's 20-block lookback).
* ``gaps``: tau-bench sessions with timestamps: a few seconds after a tool call (the agent loop),
  5–30 minutes after the agent answered the user (the human's think time).
* ``subagents``: generated Claude Code-shaped runs, each launching 4 subagents at once that share a new task
  context (``benchmarks/_subagents.py``; no recorded text). Audited with concurrency (a 1 s TTFT), so the
  ``agentcache_coalesced`` arm shows what coalescing adds.
All derivations are deterministic (seeded).
"""

from __future__ import annotations

import copy
import random
from collections.abc import Callable
from pathlib import Path
from typing import Any

from _subagents import subagents

from agentcache.loaders import Record, load

ROOT = Path(__file__).resolve().parent.parent
TAU = ROOT / "data" / "tau-bench" / "gpt-4o-airline.json"
SWE = ROOT / "data" / "swe-agent" / "marshmallow-code__marshmallow-1867.function_calling.traj"
FANOUT = 12


def taubench() -> list[Record]:
    """The recorded tau-bench sessions."""
    return load(TAU).records


def swe_agent() -> list[Record]:
    """The recorded SWE-agent trajectory."""
    return load(SWE).records


def _fan_messages(messages: list[dict[str, Any]]) -> list[dict[str, Any]]:
    out: list[dict[str, Any]] = []
    for m in messages:
        if m.get("role") == "assistant" and m.get("tool_calls"):
            m = copy.copy(m)
            calls = []
            for call in m["tool_calls"]:
                calls += [{**call, "id": f"{call['id']}_{k}"} for k in range(FANOUT)]
            m["tool_calls"] = calls
            out.append(m)
        elif m.get("role") == "tool":
            out += [{**m, "tool_call_id": f"{m['tool_call_id']}_{k}"} for k in range(FANOUT)]
        else:
            out.append(m)
    return out


def fanout() -> list[Record]:
    """tau-bench with 12-way parallel tool calls (same call and result, distinct ids)."""
    return [
        Record(
            r.session, r.api, {**r.body, "messages": _fan_messages(r.body["messages"])}, r.at, None, r.source, r.index
        )
        for r in taubench()
    ]


def gaps(seed: int = 7) -> list[Record]:
    """tau-bench with timestamps: 2–10 s after a tool call, 5–30 min after a reply to the user.
    Sessions start 20 s apart."""
    rng = random.Random(seed)
    out: list[Record] = []
    by_session: dict[str, list[Record]] = {}
    for r in taubench():
        by_session.setdefault(r.session, []).append(r)
    for n, (_, recs) in enumerate(by_session.items()):
        t = 20.0 * n
        for i, r in enumerate(recs):
            if i:
                # The previous request's response is the first message this request adds.
                response = r.body["messages"][len(recs[i - 1].body["messages"])]
                t += rng.uniform(2, 10) if response.get("tool_calls") else rng.uniform(300, 1800)
            out.append(Record(r.session, r.api, r.body, t, None, r.source, r.index))
    return out


WORKLOADS: dict[str, Callable[[], list[Record]]] = {
    "taubench": taubench,
    "swe-agent": swe_agent,
    "fanout": fanout,
    "gaps": gaps,
    "subagents": subagents,
}
#: Workloads audited with concurrency: seconds from a request's start to its first byte.
TTFT: dict[str, float] = {"subagents": 1.0}
