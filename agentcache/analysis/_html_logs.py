"""The HTML page of an audit of agents' own logs (``agentcache audit LOGS --html FILE``; an
:class:`~agentcache.AuditReport` with ``mode = "reported"``): self-contained like the simulated report's page
(:mod:`._html`), with the same template machinery, stylesheet and chart helpers.

The page (``templates/report_logs.html.jinja``) tells the terminal's story (:mod:`._render_logs`) with the same
numbers: the logs read and the period; the ``reported`` and ``agentcache`` arms (cost, hit rate, saving against
``reported``) and what they mean; where the reported spend went; the misses per cause (USD lost, inferred or
diagnosed, what agentcache saves and by which lever, what to do) and the largest misses with their evidence; USD
per day and the breakdowns per day, project, model and client; the sessions as a tree (subagents under their
parent) and per-call charts of the sessions that lost the most, misses marked. :mod:`._html_logs_view` takes it all
from the report and bounds it; this module lays out the charts.
"""

from __future__ import annotations

from collections.abc import Mapping, Sequence
from typing import Any

from .. import __version__
from ._html_charts import Chart, arm_colors, turn_chart, turn_columns, usd
from ._html_env import template
from ._html_logs_charts import MAX_DAYS, Bar, bar_chart, day_chart
from ._html_logs_view import LogsView, build_logs_view
from ._report import AuditReport, MissRecord

__all__ = ["render_logs_html"]

#: Colours of the page's own series: what misses lost, and the parts of the reported spend (reads green, writes
#: amber with rewrites after misses the darkest, uncached red, as the token kinds elsewhere).
LOST = "#c62828"
SPEND_COLORS = {
    "reads": "#2e7d32",
    "writes.session_start": "#ffe082",
    "writes.subagent_start": "#ffca28",
    "writes.new_turns": "#f9a825",
    "writes.rewrites": "#e65100",
    "uncached": "#c62828",
}


def render_logs_html(
    report: AuditReport,
    inputs: Sequence[str] = (),
    *,
    top: int = 20,
    detail: int = 3,
    replayed: Mapping[str, Any] | None = None,
) -> str:
    """The whole HTML document for ``report`` (an audit of agents' logs). ``inputs``: the paths audited (in the
    title); ``top``: root sessions listed in the session tree (the others summed); ``detail``: sessions with
    per-call charts; ``replayed``: the simulated report's template variables for the same calls' request bodies
    (``audit --exact``; :func:`._html.render_html` builds them), drawn as the page's last section."""
    view = build_logs_view(report, inputs, top=top, detail=detail)
    colors = arm_colors(list(report.totals))
    _call_charts(view)
    by_name = {a.name: a for a in view.arms}
    return template("report_logs.html.jinja").render(
        v=view,
        reported=by_name["reported"],
        agentcache=by_name.get("agentcache"),
        colors=colors,
        lost_color=LOST,
        spend_colors=SPEND_COLORS,
        spend_chart=_spend_chart(view) if view.spend else None,
        cause_chart=_cause_chart(view, colors) if view.causes else None,
        day_chart=day_chart(view.days, colors, LOST) if view.days else None,
        max_days=MAX_DAYS,
        version=__version__,
        replayed=replayed,
    )


def _spend_chart(view: LogsView) -> Chart:
    bars = [
        Bar(s.label, s.usd, f"{usd(s.usd)} · {s.share:.1%}", SPEND_COLORS[s.key], f"{s.label}: {usd(s.usd)}")
        for s in view.spend
    ]
    return bar_chart("Where the reported input spend went (USD)", bars, "reported input USD")


def _cause_chart(view: LogsView, colors: dict[str, str]) -> Chart:
    bars = []
    for c in view.causes:
        r = c.row
        text = f"lost {usd(r.usd_lost)}" + (f" · agentcache saves {usd(r.saved_usd)}" if r.saved_by else "")
        title = f"{r.cause}: {r.misses:,} misses, {r.tokens_lost:,} tokens, {text}"
        bars.append(Bar(r.cause, r.usd_lost, text, LOST, title, max(0.0, r.saved_usd), colors["agentcache"]))
    return bar_chart("USD lost to misses per cause, and what agentcache saves of it", bars, "USD lost to misses")


def _mark(m: MissRecord, ours: bool) -> str:
    """A miss's tooltip in a per-call chart."""
    how = "inferred" if m.inferred else "diagnosed"
    text = f"call {m.request}: {'still a miss: ' if ours else ''}{m.cause} ({how}), {m.tokens_lost:,} tokens lost"
    text += f", {usd(m.usd_lost)}" if m.usd_lost is not None else ""
    return text + (f"; {m.detail}" if m.detail else "")


def _call_charts(view: LogsView) -> None:
    """Per-call panels of each detailed session, one per arm on one token scale, its misses marked."""
    for d in view.details:
        arms = [a for a in ("reported", "agentcache") if a in d.report.arms]
        peak = max((c[2] for a in arms for c in turn_columns(a, d.turns)), default=1)
        marks = {"reported": d.misses, "agentcache": d.ours}
        d.charts = [
            {
                "arm": a,
                "chart": turn_chart(
                    a, d.turns, peak, marks={m.request: _mark(m, a != "reported") for m in marks[a]}, noun="call"
                ),
            }
            for a in arms
        ]
