"""The proxy's live page (``GET /agentcache/``): the live report (:class:`~agentcache.proxy._live.LiveReport`) drawn
with the HTML audit report's templates and chart helpers (``templates/live.html.jinja``, :mod:`._html_charts`,
the session tree of :mod:`._html_logs_tree`).

It shows, for the tenant whose report it is: the arms' totals (USD spent as reported, USD agentcache saved against
the client's own requests); the sessions as a tree (lineage → sessions → subagents and side calls, such as a
title request) with their client, models, turns, hit rate, USD spent and saved, and their last break or miss; a
timeline per recent session (each turn's prompt tokens read / written / uncached as the upstream reported them, a
mark above each turn that broke its prefix or missed the cache); breaks and misses by cause with the tokens and USD
they lost; the TTL, keep-warm and coalescing decisions of the recent turns. Everything is read from the report;
nothing here keeps state. A break's or miss's USD lost is what its lost tokens cost beyond reading them, at its
turn's model's prices (a repaired break lost nothing); beside each cause, what to do about it (the audits' one
table, :data:`~._report_logs.FIXES`).
"""

from __future__ import annotations

from collections import defaultdict
from dataclasses import dataclass, field
from typing import Any

from .. import __version__
from ..model._usage import CacheUsage
from ..simulate import SimUsage
from ..targets import cost_usd
from ._groups import TTLGroup, group_ttl
from ._html_charts import arm_colors, token_chart, turn_chart, turn_columns
from ._html_env import template
from ._html_logs_tree import TreeRow, build_tree
from ._inferred import usd_beyond_reading
from ._report import ArmMetrics, AuditReport, ModelRecord, SessionReport, TurnRecord, unreported
from ._report_logs import fixes_for

__all__ = ["LiveView", "build_live_view", "render_live"]

#: Sessions drawn as timelines (the most recently active first), lineages in the tree.
TIMELINES, LINEAGES = 6, 40
#: The arm a timeline draws and a miss counts on: the requests as agentcache sent them.
SENT = "agentcache"


@dataclass(frozen=True, slots=True)
class CauseRow:
    """Breaks (``kind`` ``break``) or misses of one ``cause``: how many, in how many sessions, how many agentcache
    ``repaired``, the tokens lost (unrepaired ones), what they cost (USD, beyond reading them) and what to do
    about them (``fix``: the one table of causes' fixes, :func:`~._report_logs.fixes_for`; empty when it has none)."""

    kind: str
    cause: str
    count: int
    sessions: int
    repaired: int
    tokens_lost: int
    usd_lost: float
    fix: str = ""


@dataclass(frozen=True, slots=True)
class DecisionRow:
    """Requests that got one ``decision`` (keep-warm: ``send`` or ``skip``; coalescing: the hold's outcome), in how
    many sessions, with a ``total`` (keep-warm: pings planned; coalescing: seconds held), the write tokens holding
    saved (``saved``; 0 for keep-warm) and the latest ``reason`` (keep-warm's)."""

    decision: str
    requests: int
    sessions: int
    total: float
    saved: int
    reason: str


@dataclass(slots=True)
class Timeline:
    """One session's turns drawn as a chart, with its marks (request index → what broke or missed there)."""

    session: SessionReport
    label: str
    arm: str
    chart: Any
    marks: dict[int, str]


@dataclass(slots=True)
class LiveView:
    """The page's content (see the module docstring)."""

    tenant: str
    provider: str
    model: str
    price_models: list[ModelRecord]
    sessions: int
    requests: int
    totals: dict[str, ArmMetrics]
    saved: float | None
    tree: list[TreeRow]
    rest: dict[str, Any] | None
    labels: dict[str, tuple[str, str]]
    kinds: dict[str, str]
    session_saved: dict[str, float | None]
    timelines: list[Timeline]
    causes: list[CauseRow]
    ttl: list[TTLGroup]
    keep_warm: list[DecisionRow]
    coalesced: list[DecisionRow]
    colors: dict[str, str] = field(default_factory=dict)
    #: (requests without reported usage, requests in all), when some carried none
    unreported: tuple[int, int] | None = None


def _to_usage(u: SimUsage) -> CacheUsage:
    return CacheUsage(
        u.prompt_tokens, u.cache_read_tokens, u.cache_write_tokens, u.uncached_tokens, "live", u.cache_write_1h_tokens
    )


def usd_lost(turn: TurnRecord | None, tokens: int) -> float:
    """USD that ``tokens`` lost on ``turn`` (its sent arm's usage) cost beyond reading them (0 when unknown)."""
    if turn is None or tokens <= 0 or SENT not in turn.arms:
        return 0.0
    live = turn.prepared
    provider, model = getattr(live, "provider", None), getattr(live, "model", None)
    return usd_beyond_reading(_to_usage(turn.arms[SENT]), tokens, lambda u: cost_usd(u, provider, model)) or 0.0


def _causes(report: AuditReport, turns: dict[tuple[str, int], TurnRecord]) -> list[CauseRow]:
    """Breaks (all), misses of what was sent (:data:`SENT`) and the upstream's (``reported``: its usage read less
    than the client's own requests could; USD lost as the core priced it), grouped by cause, the most USD lost
    first."""
    rows: dict[tuple[str, str], list[Any]] = defaultdict(list)
    fixes = fixes_for(report)  # a fix's "(agentcache does)" only where what it sent did
    for b in report.breaks:
        rows["break", b.cause].append((b.session, b.repaired, 0 if b.repaired else b.tokens_lost, b.request, None))
    for m in report.misses:
        if m.arm in (SENT, "reported"):
            kind = "miss" if m.arm == SENT else "reported miss"
            rows[kind, m.cause].append((m.session, False, m.tokens_lost, m.request, m.usd_lost))
    out = [
        CauseRow(
            kind,
            cause,
            len(items),
            len({i[0] for i in items}),
            sum(1 for i in items if i[1]),
            sum(i[2] for i in items),
            sum(usd_lost(turns.get((i[0], i[3])), i[2]) if i[4] is None else i[4] for i in items),
            fixes.get(cause, ""),
        )
        for (kind, cause), items in rows.items()
    ]
    return sorted(out, key=lambda r: (-r.usd_lost, -r.tokens_lost, r.kind, r.cause))


def _decisions(turns: list[TurnRecord], name: str) -> list[DecisionRow]:
    """The keep-warm (``name`` ``keep_warm``) or coalescing (``coalesced``) decisions of ``turns``, grouped."""
    rows: dict[str, list[Any]] = defaultdict(list)
    for t in turns:
        d = getattr(t.prepared, name, None)
        if d is None:
            continue
        if name == "keep_warm":
            key, item = ("send" if d.send else "skip"), (t.session, d.count if d.send else 0, 0, d.reason)
        else:
            key, item = d.outcome, (t.session, d.waited_s, d.saved_tokens, "")
        rows[key].append(item)
    return [
        DecisionRow(k, len(v), len({i[0] for i in v}), sum(i[1] for i in v), sum(i[2] for i in v), v[-1][3])
        for k, v in sorted(rows.items())
    ]


def _marks(report: AuditReport) -> tuple[dict[str, dict[int, str]], dict[str, str]]:
    """Per session, request index → tooltip of its breaks and misses on :data:`SENT`; and its last cause."""
    marks: dict[str, dict[int, str]] = defaultdict(dict)
    last: dict[str, tuple[int, str]] = {}
    events = [(b.session, b.request, b.cause, "break", b.tokens_lost, b.repaired) for b in report.breaks]
    events += [
        (m.session, m.request, m.cause, "simulated miss" if m.arm == SENT else "reported miss", m.tokens_lost, False)
        for m in report.misses
        if m.arm in (SENT, "reported")
    ]
    for session, request, cause, kind, lost, repaired in sorted(events, key=lambda e: e[1]):
        text = f"{kind} {cause}: {lost:,} tokens" + (" (repaired)" if repaired else " lost")
        had = marks[session].get(request)
        marks[session][request] = f"{had}; {text}" if had else text
        if request >= last.get(session, (-1, ""))[0]:
            last[session] = (request, f"{cause}" + (" (repaired)" if repaired else ""))
    return marks, {s: c for s, (_, c) in last.items()}


def _timelines(report: AuditReport, marks: dict[str, dict[int, str]]) -> list[Timeline]:
    """The :data:`TIMELINES` sessions with the most recent turns, each drawn on its reported usage (else sent)."""
    by_session: dict[str, list[TurnRecord]] = defaultdict(list)
    latest: dict[str, int] = {}
    for i, t in enumerate(report.turns):
        by_session[t.session].append(t)
        latest[t.session] = i
    sessions = {s.session: s for s in report.sessions}
    recent = sorted(by_session, key=lambda s: -latest[s])[:TIMELINES]
    out = []
    for key in recent:
        if key not in sessions:
            continue
        turns = sorted(by_session[key], key=lambda t: t.request)
        arm = "reported" if all("reported" in t.arms for t in turns) else SENT
        peak = max((c[2] for c in turn_columns(arm, turns)), default=1)
        chart = turn_chart(arm, turns, peak, marks=marks.get(key, {}), noun="turn")
        out.append(Timeline(sessions[key], key.partition("/")[2] or key, arm, chart, marks.get(key, {})))
    return out


def _labels(turns: list[TurnRecord]) -> tuple[dict[str, tuple[str, str]], dict[str, str]]:
    """Per session of the kept ``turns``: (its latest client, every model it named, in order of first use, joined
    by ", "); and what a child session is: ``side call`` when none of its kept turns carried tools (a title or
    summary call), else ``subagent``."""
    clients: dict[str, str] = {}
    models: dict[str, dict[str, None]] = defaultdict(dict)  # an ordered set per session
    loops: dict[str, bool] = {}
    for t in turns:
        clients[t.session] = getattr(t.prepared, "client", None) or "—"
        if model := getattr(t.prepared, "model", ""):
            models[t.session][model] = None
        loops[t.session] = loops.get(t.session, False) or getattr(t.prepared, "loop", True)
    labels = {s: (c, ", ".join(models[s]) or "—") for s, c in clients.items()}
    return labels, {s: "subagent" if loop else "side call" for s, loop in loops.items()}


def build_live_view(report: AuditReport, tenant: str | None) -> LiveView:
    """The live page's view of ``report`` (``tenant``'s, or every tenant's when None)."""
    turns = {(t.session, t.request): t for t in report.turns}
    labels, kinds = _labels(report.turns)
    marks, last = _marks(report)
    tree, rest = build_tree(report.sessions, (), LINEAGES, last=last)
    base, ours = report.totals.get("as_sent"), report.totals.get(SENT)
    saved = {
        s.session: s.arms[SENT].saved_against(s.arms["as_sent"])[0] if "as_sent" in s.arms else None
        for s in report.sessions
    }
    return LiveView(
        tenant="all tenants" if tenant is None else tenant,
        provider=report.provider,
        model=report.model,
        price_models=list(report.models),
        sessions=len(report.sessions),
        requests=sum(s.requests for s in report.sessions),
        totals=report.totals,
        saved=ours.saved_against(base)[0] if base is not None and ours is not None else None,
        tree=tree,
        rest=rest,
        labels=labels,
        kinds=kinds,
        session_saved=saved,
        timelines=_timelines(report, marks),
        causes=_causes(report, turns),
        ttl=group_ttl(report.turns),
        keep_warm=_decisions(report.turns, "keep_warm"),
        coalesced=_decisions(report.turns, "coalesced"),
        colors=arm_colors(list(report.totals)),
        unreported=unreported(report.totals, sum(s.requests for s in report.sessions)),
    )


def render_live(
    report: AuditReport,
    tenant: str | None,
    *,
    fragment: bool = False,
    poll_ms: int = 2000,
    nonce: str = "",
    worker: str | None = None,
) -> str:
    """The live page (HTML) of ``report`` for ``tenant`` (None: all tenants); ``fragment``: only the part the page
    replaces when it polls (``<div id="live">``'s content); ``poll_ms``: how often the page polls, milliseconds;
    ``nonce``: its script's Content-Security-Policy nonce; ``worker``: which of several worker processes drew it
    (their pages differ), or None."""
    view = build_live_view(report, tenant)
    page = template("live.html.jinja")
    chart = token_chart(view.totals) if view.requests else None
    return page.render(
        v=view, token_chart=chart, fragment=fragment, poll_ms=poll_ms, nonce=nonce, version=__version__, worker=worker
    )
