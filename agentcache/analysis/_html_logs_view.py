"""What the audit-of-logs page shows (:class:`~agentcache.AuditReport` with ``mode = "reported"``), taken from the
report as the audit computed it: no HTML here (``templates/report_logs.html.jinja`` draws it, :mod:`._html_logs`
lays out its charts), and no figure the audit already has is computed again.

The page tells the terminal's story (:mod:`._render_logs`) with the same numbers: the logs read, each arm's totals
and its saving against ``reported`` (:meth:`ArmMetrics.saved_against`), the reported spend split, the misses per
cause with what agentcache saves and what to do (:data:`FIXES`), the breakdowns per day, project, model and client.
It adds what a page can hold and a terminal cannot: the largest misses with their evidence, the sessions as a tree
(each root with its subagents) and per-call charts. Sizes stay bounded on large inputs: each table shows at most
``max_rows`` rows (the days the latest ones) and sums the rest in one row; the tree the ``top`` lineages that lost
the most, each with at most :data:`MAX_CHILDREN` subagents; per-call charts for the ``detail`` sessions that lost
the most (:mod:`._html_logs_tree` builds the tree and the details).
"""

from __future__ import annotations

from collections.abc import Sequence
from dataclasses import dataclass, field
from typing import Any

from ._html_logs_tree import SessionCalls, TreeRow, build_tree, costliest_sessions, miss_times
from ._html_view import ArmRow
from ._report import ArmMetrics, AuditReport, MissRecord, ModelRecord
from ._report_logs import FIXES, SPEND, SPEND_LABELS, CauseRow, GroupRow, NotWorthIt, SourceRow, not_worth_it

__all__ = ["LEVERS", "LOG_ARM_HELP", "LogsView", "build_logs_view"]

#: What each arm of an audit of agents' logs means (the legend of the page). Sources: agentcache/_audit_logs.py
#: (the arms), analysis/_whatif.py (the what-if).
LOG_ARM_HELP: dict[str, str] = {
    "reported": "The usage the provider reported for each call, as the agent's log kept it, priced per model on the "
    "cache that served it (5m writes 1.25×, 1h writes 2× the input price, reads at the model's read rate): what "
    "these calls cost.",
    "agentcache": "A what-if on the same calls: agentcache's TTL policy (5m or 1h for each write, from the session's "
    "pauses so far) and keep-warm (requests that read the cached prefix before it expires) applied to the recorded "
    "pauses. Every decision uses only what was known before each call; keep-warm refreshes are counted as requests "
    "and paid. The logs keep no request bodies, so nothing is repaired.",
}

#: What each lever of the agentcache arm is called on the page.
LEVERS = {"keep_warm": "keep-warm", "ttl": "TTL policy"}


@dataclass(frozen=True, slots=True)
class SpendLine:
    """One part of the reported spend (:data:`SPEND`): its ``key``, ``label``, ``usd`` and ``share`` of the
    total."""

    key: str
    label: str
    usd: float
    share: float


@dataclass(frozen=True, slots=True)
class CauseLine:
    """A :class:`CauseRow` with what the page adds: how many misses were ``inferred``, the ``fix`` text and the
    saving per lever (``levers``: ``(name, usd)``)."""

    row: CauseRow
    inferred: int
    fix: str
    levers: list[tuple[str, float]]


@dataclass(frozen=True, slots=True)
class MissLine:
    """One of the largest misses: the record, when its call was made (``at``, unix seconds; None: unknown) and
    whether the agentcache arm still misses there (``ours_misses``; else it read those tokens)."""

    miss: MissRecord
    at: float | None
    ours_misses: bool


@dataclass(frozen=True, slots=True)
class GroupTable:
    """A breakdown (``by``: day, project, model, client): the ``rows`` shown, how many there are in all
    (``total``), and the others summed (``rest``, None when all are shown; its ``sessions`` is 0: a session can
    span several rows; for days, the earlier ones)."""

    by: str
    rows: list[GroupRow]
    total: int
    rest: GroupRow | None


@dataclass(slots=True)
class LogsView:
    """The page's content (see the module docstring)."""

    inputs: list[str]
    provider: str
    model: str
    models: list[str]
    price_models: list[ModelRecord]
    sources: list[SourceRow]
    first_day: str | None
    last_day: str | None
    sessions: int
    subagents: int
    calls: int
    arms: list[ArmRow]
    lost_usd: float
    spend: list[SpendLine]
    causes: list[CauseLine]
    largest: list[MissLine]
    misses: int
    days: list[GroupRow]
    groups: list[GroupTable]
    tree: list[TreeRow]
    tree_rest: dict[str, Any] | None
    max_rows: int
    details: list[SessionCalls] = field(default_factory=list)
    not_worth_it: NotWorthIt | None = None


def build_logs_view(
    report: AuditReport,
    inputs: Sequence[str] = (),
    *,
    top: int = 20,
    detail: int = 3,
    max_rows: int = 31,
    largest: int = 15,
) -> LogsView:
    """The view of ``report`` (an audit of agents' logs): ``inputs`` are the paths audited, ``top`` lineages in the
    session tree, ``detail`` sessions with per-call charts, ``max_rows`` rows at most per breakdown, the
    ``largest`` misses listed."""
    base = report.totals["reported"]
    arms = []
    for name, m in report.totals.items():
        saved, share = m.saved_against(base) if name != "reported" else (None, None)
        arms.append(
            ArmRow(name, LOG_ARM_HELP.get(name, "An arm this report adds (no description known)."), m, saved, share)
        )
    days = [r.key for r in report.groups.get("day", []) if r.key != "unknown"]
    misses = [m for m in report.misses if m.arm == "reported"]
    biggest = sorted(misses, key=lambda m: -(m.usd_lost or 0.0))[:largest]
    tree, rest = build_tree(report.sessions, report.misses, top)
    worse = not_worth_it(report.sessions)
    return LogsView(
        inputs=list(inputs),
        provider=report.provider,
        model=report.model,
        models=[r.key for r in report.groups.get("model", [])],
        price_models=list(report.models),
        sources=list(report.sources),
        first_day=days[0] if days else None,
        last_day=days[-1] if days else None,
        sessions=len(report.sessions),
        subagents=sum(s.parent is not None for s in report.sessions),
        calls=base.requests,
        arms=arms,
        lost_usd=sum(c.usd_lost for c in report.causes),
        spend=_spend(report.spend),
        causes=[_cause(c, worse) for c in report.causes],
        not_worth_it=worse,
        largest=_largest(report, biggest),
        misses=len(misses),
        days=report.groups.get("day", []),
        groups=[_table(by, report.groups.get(by, []), max_rows) for by in ("day", "project", "model", "client")],
        tree=tree,
        tree_rest=rest,
        max_rows=max_rows,
        details=costliest_sessions(report, detail),
    )


def _spend(spend: dict[str, float]) -> list[SpendLine]:
    """The non-zero parts of the reported spend, in :data:`SPEND` order, with their share (as the terminal)."""
    total = sum(spend.values())
    if not total:
        return []
    return [SpendLine(k, SPEND_LABELS[k], spend[k], spend[k] / total) for k in SPEND if spend.get(k)]


def _cause(c: CauseRow, worse: NotWorthIt | None) -> CauseLine:
    levers = [(LEVERS.get(k, k), v) for k, v in sorted(c.saved_by.items(), key=lambda kv: -kv[1])]
    fix = (worse.fix(c.cause) if worse is not None else None) or FIXES.get(c.cause, "")
    return CauseLine(c, c.misses - c.diagnosed, fix, levers)


def _largest(report: AuditReport, largest: list[MissRecord]) -> list[MissLine]:
    """The largest misses with their call's time and whether the agentcache arm misses there too."""
    keys = {(m.session, m.request) for m in largest}
    ours = {(m.session, m.request) for m in report.misses if m.arm == "agentcache" and (m.session, m.request) in keys}
    at = miss_times(report.turns, keys)
    return [MissLine(m, at.get((m.session, m.request)), (m.session, m.request) in ours) for m in largest]


def _table(by: str, rows: list[GroupRow], limit: int) -> GroupTable:
    """At most ``limit`` rows of a breakdown (the latest days; the costliest projects, models, clients: the
    report's order), the others summed."""
    shown = rows[-limit:] if by == "day" else rows[:limit]
    hidden = rows[: len(rows) - len(shown)] if by == "day" else rows[len(shown) :]
    rest = None
    if hidden:
        label = f"{len(hidden):,} earlier days" if by == "day" else f"{len(hidden):,} other {by}s"
        rest = GroupRow(by, label, arms={a: ArmMetrics() for a in hidden[0].arms})
        for r in hidden:
            for a, m in r.arms.items():
                rest.arms.setdefault(a, ArmMetrics()).merge(m)
            rest.usd_lost += r.usd_lost
    return GroupTable(by, shown, len(rows), rest)
