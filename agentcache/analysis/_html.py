"""A self-contained HTML audit report (``agentcache audit --html FILE``): one file, no network and no script, so it
opens offline in any browser and can be sent to a colleague.

The page (``templates/report.html.jinja``, rendered by Jinja2 with autoescape: prompt text, session names and file
names are escaped) has a header (inputs, provider, model, sessions, requests, each arm's cost, hit rate and USD
saved against ``as_sent``), a legend of the arms, inline SVG charts with axes, value labels and ``<title>``
tooltips (:mod:`._html_charts`), the misses and breaks grouped by cause, the TTL decisions, the provider's own miss
reasons, the sessions agentcache saves the most on and per-request charts for the first few of them
(:mod:`._html_view` bounds all of these, so the page stays small on large inputs).

An audit of agents' own logs (``mode = "reported"``: usage as the provider reported it, no request bodies) gets its
own page from the same templates and chart helpers (:mod:`._html_logs`).
"""

from __future__ import annotations

from collections.abc import Sequence
from typing import Any

from .. import __version__
from ._html_charts import arm_colors, cost_chart, share_by_request_chart, token_chart, turn_chart, turn_columns
from ._html_env import template
from ._html_logs import render_logs_html
from ._html_view import build_view
from ._report import AuditReport
from ._report_logs import fixes_for

__all__ = ["render_html"]


def render_html(
    report: AuditReport,
    inputs: Sequence[str] = (),
    *,
    top: int | None = None,
    detail: int = 3,
    replayed: AuditReport | None = None,
) -> str:
    """The whole HTML document for ``report``. ``inputs``: the audited file names, shown in the header and title;
    ``top``: sessions listed (the others summed in one row; default 10), or for an audit of agents' logs
    (``mode = "reported"``: :func:`._html_logs.render_logs_html`'s page) root sessions in the session tree (default
    20); ``detail``: sessions with per-request charts. ``replayed``: with an audit of agents' logs, the audit of the
    same calls' request bodies (``audit --exact``), drawn as a section of its page."""
    if report.mode == "reported":
        body = _context(replayed, inputs, 10 if top is None else top, detail) if replayed is not None else None
        return render_logs_html(report, inputs, top=20 if top is None else top, detail=detail, replayed=body)
    return template("report.html.jinja").render(_context(report, inputs, 10 if top is None else top, detail))


def _context(report: AuditReport, inputs: Sequence[str], top: int, detail: int) -> dict[str, Any]:
    """The variables of the simulated report's templates (``report.html.jinja``, ``_report_body.html.jinja``)."""
    view = build_view(report, inputs, top=top, detail=detail)
    arms = list(report.totals)
    colors = arm_colors(arms)
    for d in view.details:
        shown = [a for a in arms if a in d.report.arms]
        peak = max((c[2] for a in shown for c in turn_columns(a, d.turns)), default=1)
        d.charts = [{"arm": a, "chart": turn_chart(a, d.turns, peak)} for a in shown]
    by_name = {a.name: a for a in view.arms}
    return {
        "v": view,
        "base": by_name.get("as_sent"),
        "agentcache": by_name.get("agentcache") if "as_sent" in by_name else None,
        "ideal": by_name.get("ideal"),
        "colors": colors,
        "token_chart": token_chart(report.totals),
        "cost_chart": cost_chart(report.totals, colors),
        "share_chart": share_by_request_chart(report.turns, arms, colors),
        "fixes": fixes_for(report),
        "version": __version__,
    }
