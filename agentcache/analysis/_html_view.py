"""What the HTML report shows, computed from an :class:`~agentcache.AuditReport` (no HTML here: the template in
``templates/report.html.jinja`` draws it, :mod:`._html_charts` lays out its charts).

Everything is taken from the report as the audit computed it: the per-arm totals and their USD saved against
``as_sent`` (:meth:`ArmMetrics.saved_against`, the terminal's "saved" column), the sessions, breaks, misses, TTL
decisions and provider diagnoses. Arms are read from the report, so an arm the audit adds appears without a change
here (described as "no description" until :data:`ARM_HELP` names it). The size stays bounded on large inputs: the
per-session detail covers the ``detail`` sessions agentcache saves the most on (fewer when their charts would pass
:data:`COLUMN_BUDGET` columns), the sessions table the ``top`` first,
the rest are summed in one row; misses, breaks and TTL decisions are grouped, with at most ``max_rows`` rows each.
"""

from __future__ import annotations

from collections import Counter, defaultdict
from collections.abc import Sequence
from dataclasses import dataclass, field
from typing import Any

from ._groups import MissGroup, TTLGroup, group_misses, group_ttl
from ._html_charts import MAX_COLUMNS
from ._report import (
    ArmMetrics,
    AuditReport,
    BreakRecord,
    MissRecord,
    SessionReport,
    TurnRecord,
    provider_summary,
    saving_of,
    unreported,
)

__all__ = ["ARM_HELP", "COLUMN_BUDGET", "ReportView", "build_view"]

#: Most chart columns (requests x arms) in the per-session detail: what keeps a report with many arms small.
COLUMN_BUDGET = 500

#: What each arm means (the legend of the page). Sources: agentcache/_audit.py and analysis/_ledger.py (the arms),
#: policies/anchors.py (the ``--compare`` baseline strategies).
ARM_HELP: dict[str, str] = {
    "as_sent": "The requests exactly as recorded, with the client's own cache markers (if any), priced under the "
    "provider's cache rules: what this traffic costs today.",
    "agentcache": "The same requests after agentcache's safe repairs and policies (cache breakpoints and TTL on "
    "Anthropic, routing keys on OpenAI): what it would cost through agentcache.",
    "ideal": "The bound: every token already sent earlier in the same cache scope counts as a cache read (after "
    "safe repairs); no placement of markers can do better.",
    "reported": "The usage the provider reported in the recorded responses, priced by the same price table.",
    "anthropic_auto": "Baseline: Anthropic's automatic caching, one top-level cache_control (a breakpoint on the "
    "last cacheable block).",
    "langchain": "Baseline: LangChain's AnthropicPromptCachingMiddleware as modelled here (last system block, last "
    "tool, message tail).",
    "litellm": "Baseline: a LiteLLM cache_control_injection_points setup (system prompt and last user message).",
    "no_markers": "Baseline: no cache markers at all (nothing is cached).",
}


@dataclass(frozen=True, slots=True)
class ArmRow:
    """One arm's totals with its legend text and its USD ``saved`` against the report's base arm (``as_sent``; on
    an audit of agents' logs ``reported``), None for the base itself or when there is none; ``share``: saved / the
    base's cost."""

    name: str
    help: str
    metrics: ArmMetrics
    saved: float | None
    share: float | None


@dataclass(frozen=True, slots=True)
class TTLRun:
    """Consecutive requests ``first``..``last`` of a session given the same ``ttl``, with the last ``reason``."""

    ttl: str
    first: int
    last: int
    reason: str


@dataclass(slots=True)
class SessionDetail:
    """One session shown in detail: its metrics, per-request usage, grouped misses, breaks and TTL runs; ``charts``
    (one ``{"arm", "chart"}`` per arm) are added by the renderer."""

    report: SessionReport
    saved: float | None
    turns: list[TurnRecord]
    misses: list[MissGroup]
    breaks: list[BreakRecord]
    ttl: list[TTLRun]
    charts: list[dict[str, Any]] = field(default_factory=list)


@dataclass(slots=True)
class ReportView:
    """The page's content (see the module docstring)."""

    inputs: list[str]
    provider: str
    model: str
    sessions: int
    requests: int
    arms: list[ArmRow]
    models: list[dict[str, Any]]
    errors: list[str]
    errors_total: int
    breaks_by_cause: list[dict[str, Any]]
    largest_breaks: list[BreakRecord]
    misses: list[MissGroup]
    miss_groups: int
    ttl: list[TTLGroup]
    provider_diagnostics: dict[str, Any]
    provider_groups: list[dict[str, Any]]
    top_sessions: list[tuple[SessionReport, float | None]]
    rest: dict[str, Any] | None
    details: list[SessionDetail] = field(default_factory=list)
    #: the ``reported`` arm's misses: reuse the upstream lost although the requests as sent could read it
    upstream_losses: list[MissRecord] = field(default_factory=list)
    #: (requests without reported usage, requests in all), when some carried none
    unreported: tuple[int, int] | None = None


def build_view(
    report: AuditReport, inputs: Sequence[str] = (), *, top: int = 10, detail: int = 3, max_rows: int = 20
) -> ReportView:
    """The view of ``report``: ``inputs`` are the audited file names (shown in the header), ``top`` sessions in the
    sessions table, ``detail`` of them with per-request charts, ``max_rows`` rows at most per grouped table."""
    base = report.totals.get("as_sent")
    arms = []
    for name, m in report.totals.items():
        saved, share = saving_of(name, m, base) or (None, None)
        arms.append(
            ArmRow(name, ARM_HELP.get(name, "An arm this report adds (no description known)."), m, saved, share)
        )
    ranked = sorted(report.sessions, key=lambda s: -(_session_saving(s) or 0.0))
    shown = ranked[:top]
    by_session: dict[str, list[TurnRecord]] = defaultdict(list)
    chosen = _detail_sessions(ranked, detail, len(report.totals))
    wanted = {s.session for s in chosen}
    for t in report.turns:
        if t.session in wanted:
            by_session[t.session].append(t)
    details = [
        SessionDetail(
            s,
            _session_saving(s),
            by_session.get(s.session, []),
            group_misses(m for m in report.misses if m.session == s.session)[:max_rows],
            sorted((b for b in report.breaks if b.session == s.session), key=lambda b: b.request)[:max_rows],
            ttl_runs(by_session.get(s.session, []))[:max_rows],
        )
        for s in chosen
    ]
    pd = provider_summary(report.provider_misses)
    all_misses = group_misses(report.misses)
    return ReportView(
        inputs=list(inputs),
        provider=report.provider,
        model=report.model,
        sessions=len(report.sessions),
        requests=sum(s.requests for s in report.sessions),
        arms=arms,
        models=[m.to_dict() for m in report.models],
        errors=[str(e) for e in report.errors[:max_rows]],
        errors_total=len(report.errors),
        breaks_by_cause=_breaks_by_cause(report.breaks),
        largest_breaks=sorted(report.breaks, key=lambda b: -b.tokens_lost)[:max_rows],
        misses=all_misses[:max_rows],
        miss_groups=len(all_misses),
        ttl=group_ttl(report.turns),
        provider_diagnostics={k: v for k, v in pd.items() if k != "misses"},
        provider_groups=_provider_groups(report)[:max_rows],
        top_sessions=[(s, _session_saving(s)) for s in shown],
        rest=_rest(ranked[top:]),
        details=details,
        unreported=unreported(report.totals, sum(s.requests for s in report.sessions)),
        upstream_losses=sorted((m for m in report.misses if m.arm == "reported"), key=lambda m: -m.tokens_lost)[
            :max_rows
        ],
    )


def _detail_sessions(ranked: list[SessionReport], detail: int, arms: int) -> list[SessionReport]:
    """The first ``detail`` sessions of ``ranked`` whose per-request charts fit :data:`COLUMN_BUDGET` columns in all
    (the first always shown)."""
    out: list[SessionReport] = []
    used = 0
    for s in ranked[:detail]:
        cost = min(s.requests, MAX_COLUMNS) * arms
        if out and used + cost > COLUMN_BUDGET:
            break
        out.append(s)
        used += cost
    return out


def _session_saving(s: SessionReport) -> float | None:
    base, ours = s.arms.get("as_sent"), s.arms.get("agentcache")
    return ours.saved_against(base)[0] if base is not None and ours is not None else None


def ttl_runs(turns: Sequence[TurnRecord]) -> list[TTLRun]:
    """One session's TTL decisions as runs of consecutive requests with the same TTL."""
    runs: list[TTLRun] = []
    for t in turns:
        ttl = getattr(t.prepared, "ttl", None)
        if ttl is None:
            continue
        if runs and runs[-1].ttl == ttl.ttl:
            runs[-1] = TTLRun(ttl.ttl, runs[-1].first, t.request, ttl.reason)
        else:
            runs.append(TTLRun(ttl.ttl, t.request, t.request, ttl.reason))
    return runs


def _breaks_by_cause(breaks: list[BreakRecord]) -> list[dict[str, Any]]:
    groups: dict[str, list[BreakRecord]] = defaultdict(list)
    for b in breaks:
        groups[b.cause].append(b)
    rows = [
        {
            "cause": cause,
            "count": len(items),
            "sessions": len({b.session for b in items}),
            "tokens_lost": sum(b.tokens_lost for b in items),
            "repaired": sum(b.repaired for b in items),
        }
        for cause, items in groups.items()
    ]
    return sorted(rows, key=lambda r: -r["tokens_lost"])


def _provider_groups(report: AuditReport) -> list[dict[str, Any]]:
    groups: Counter[tuple[str, str, str]] = Counter()
    for m in report.provider_misses:
        agrees = "unknown" if m.agrees is None else ("yes" if m.agrees else "no")
        groups[(f"{m.provider}: {m.reason}", m.ours or "(none)", agrees)] += 1
    return [{"reason": r, "ours": o, "agrees": a, "count": n} for (r, o, a), n in groups.most_common()]


def _rest(sessions: list[SessionReport]) -> dict[str, Any] | None:
    """The sessions not listed, summed: their count, requests, per-arm totals and saving."""
    if not sessions:
        return None
    arms: dict[str, ArmMetrics] = {}
    for s in sessions:
        for a, m in s.arms.items():
            arms.setdefault(a, ArmMetrics()).merge(m)
    saved = sum(v for v in (_session_saving(s) for s in sessions) if v is not None)
    return {"count": len(sessions), "requests": sum(s.requests for s in sessions), "arms": arms, "saved": saved}
