"""The sessions of an audit of agents' logs as the page shows them: a tree (each root session, its lineage, with its
subagents under it, by the ``parent`` links the readers set) ranked by the USD its lineage lost, and the few
sessions that lost the most with their calls, for per-call charts. Everything is read from the report's sessions,
misses and turns; a lineage's figures are its sessions' sums."""

from __future__ import annotations

from collections import defaultdict
from collections.abc import Iterable, Sequence
from dataclasses import dataclass, field
from typing import Any

from ._report import ArmMetrics, AuditReport, MissRecord, SessionReport, TurnRecord

__all__ = ["MAX_CHILDREN", "SessionCalls", "TreeRow", "build_tree", "costliest_sessions", "miss_times"]

#: Most subagents listed under one root session; the others are summed in one row.
MAX_CHILDREN = 8


@dataclass(frozen=True, slots=True)
class TreeRow:
    """One row of the session tree: a ``session`` at ``depth`` (0: a root) with the cause of its last miss
    (``last_cause``); a root with subagents also carries its lineage's sums (``lineage``: ``sessions``,
    ``requests``, ``reported``, ``lost``). A row without ``session`` sums subagents not listed (``hidden``: the
    same keys)."""

    session: SessionReport | None
    depth: int
    last_cause: str | None = None
    lineage: dict[str, Any] | None = None
    hidden: dict[str, Any] | None = None


@dataclass(slots=True)
class SessionCalls:
    """A session shown call by call: its report, its calls (``turns``), its misses on the ``reported`` arm and the
    ones the ``agentcache`` arm still has (``ours``); ``charts`` are added by the renderer."""

    report: SessionReport
    turns: list[TurnRecord]
    misses: list[MissRecord]
    ours: list[MissRecord]
    charts: list[dict[str, Any]] = field(default_factory=list)


def _sums(sessions: Iterable[SessionReport]) -> dict[str, Any]:
    """Sessions, calls, each arm's USD and USD lost, summed."""
    out: dict[str, Any] = {"sessions": 0, "requests": 0, "lost": 0.0, "arms": {}}
    for s in sessions:
        out["sessions"] += 1
        out["requests"] += s.requests
        out["lost"] += s.usd_lost
        for a, m in s.arms.items():
            out["arms"].setdefault(a, ArmMetrics()).merge(m)
    return out


def _lineages(sessions: Sequence[SessionReport]) -> list[list[tuple[SessionReport, int]]]:
    """Each root session with its descendants (depth first, by start time), as ``(session, depth)``. A session
    whose parent is not in the report is a root; so is one only a cycle of parents leads to."""
    by_name = {s.session: s for s in sessions}
    children: dict[str, list[SessionReport]] = defaultdict(list)
    for s in sessions:
        if s.parent is not None and s.parent in by_name and s.parent != s.session:
            children[s.parent].append(s)
    for kids in children.values():
        kids.sort(key=lambda s: (s.started is None, s.started or 0.0))
    seen: set[str] = set()
    out = []
    roots = [s for s in sessions if s.parent is None or s.parent not in by_name]
    for root in [*roots, *sessions]:  # then whatever no root reaches (a cycle of parents)
        if root.session in seen:
            continue
        tree, stack = [], [(root, 0)]
        while stack:
            s, depth = stack.pop()
            if s.session in seen:
                continue
            seen.add(s.session)
            tree.append((s, depth))
            stack.extend((k, depth + 1) for k in reversed(children.get(s.session, [])))
        out.append(tree)
    return out


def _last_causes(misses: Iterable[MissRecord]) -> dict[str, str]:
    """Per session, the cause of its last miss on the ``reported`` arm."""
    last: dict[str, tuple[int, str]] = {}
    for m in misses:
        if m.arm == "reported" and m.request >= last.get(m.session, (-1, ""))[0]:
            last[m.session] = (m.request, m.cause)
    return {s: cause for s, (_, cause) in last.items()}


def build_tree(
    sessions: Sequence[SessionReport],
    misses: Iterable[MissRecord],
    top: int,
    max_children: int = MAX_CHILDREN,
    last: dict[str, str] | None = None,
) -> tuple[list[TreeRow], dict[str, Any] | None]:
    """The rows of the ``top`` lineages that lost the most USD (then cost the most), each root followed by at most
    ``max_children`` of its subagents; and the other lineages summed (None when all are shown). ``last``: each
    session's last miss cause (default: of its ``misses`` on the ``reported`` arm)."""

    def rank(tree: list[tuple[SessionReport, int]]) -> tuple[float, float]:
        return -sum(s.usd_lost for s, _ in tree), -sum(s.arms["reported"].cost_usd for s, _ in tree)

    lineages = sorted(_lineages(sessions), key=rank)
    last = _last_causes(misses) if last is None else last
    rows: list[TreeRow] = []
    for tree in lineages[:top]:
        root, _ = tree[0]
        lineage = _sums(s for s, _ in tree) if len(tree) > 1 else None
        rows.append(TreeRow(root, 0, last.get(root.session), lineage))
        kids = tree[1:]
        rows += [TreeRow(s, depth, last.get(s.session)) for s, depth in kids[:max_children]]
        if len(kids) > max_children:
            rows.append(TreeRow(None, 1, hidden=_sums(s for s, _ in kids[max_children:])))
    rest = None
    if len(lineages) > top:
        rest = _sums(s for tree in lineages[top:] for s, _ in tree)
        rest["lineages"] = len(lineages) - top
    return rows, rest


def costliest_sessions(report: AuditReport, count: int) -> list[SessionCalls]:
    """The ``count`` sessions whose misses lost the most USD (none that lost nothing), with their calls and
    misses."""
    chosen = sorted((s for s in report.sessions if s.usd_lost > 0), key=lambda s: -s.usd_lost)[:count]
    out = {s.session: SessionCalls(s, [], [], []) for s in chosen}
    for t in report.turns:
        if t.session in out:
            out[t.session].turns.append(t)
    for m in report.misses:
        if m.session in out:
            (out[m.session].misses if m.arm == "reported" else out[m.session].ours).append(m)
    return list(out.values())


def miss_times(turns: Iterable[TurnRecord], keys: set[tuple[str, int]]) -> dict[tuple[str, int], float | None]:
    """When each call of ``keys`` (session, call index) was made, from the report's turns."""
    return {(t.session, t.request): t.at for t in turns if (t.session, t.request) in keys}
