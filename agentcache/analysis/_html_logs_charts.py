"""Geometry of the charts only the audit-of-logs page has (:mod:`._html_logs`): horizontal bars with a value label
(where the reported spend went, USD lost per cause with the part agentcache saves) and grouped columns per UTC day
(reported and agentcache USD, USD lost). Built from :class:`._html_charts.Chart` pieces, so the shared ``svg``
macro draws them like the other charts: axes, ticks, value labels and ``<title>`` tooltips."""

from __future__ import annotations

import math
from collections.abc import Sequence
from dataclasses import dataclass

from ._html_charts import Chart, Group, Rect, Text, nice_ticks, usd, x_axis
from ._report_logs import GroupRow

__all__ = ["Bar", "bar_chart", "day_chart"]


@dataclass(frozen=True, slots=True)
class Bar:
    """One horizontal bar: its ``name`` (left of the axis), ``value`` (USD), ``text`` (right of the bar), fill
    ``color`` and tooltip ``title``; ``inner``: a second value drawn as a thinner bar inside it, in
    ``inner_color`` (the part agentcache saves of what a cause lost)."""

    name: str
    value: float
    text: str
    color: str
    title: str
    inner: float = 0.0
    inner_color: str = ""


def _money(v: float) -> str:
    return f"${v:,.4g}"


def bar_chart(label: str, bars: Sequence[Bar], axis_title: str) -> Chart:
    """Horizontal bars, one per ``bars`` entry, on one USD x axis; ``label`` names the chart."""
    left, right, top, row, gap = 210.0, 330.0, 8.0, 24.0, 10.0
    width = 1000.0
    plot = width - left - right
    height = top + len(bars) * (row + gap) + 36
    ticks = nice_ticks(max([b.value for b in bars] + [1e-6]))
    scale = plot / ticks[-1]
    chart = Chart(width, height, label)
    bottom = height - 36
    x_axis(chart, ticks, left, scale, top, bottom, _money)
    chart.texts.append(Text(left + plot / 2, height - 4, axis_title, "middle", "axis-title"))
    for i, b in enumerate(bars):
        y = top + i * (row + gap) + gap / 2
        chart.texts.append(Text(left - 8, y + row / 2 + 4, b.name, "end", "arm"))
        w = max(0.0, b.value) * scale
        rects = [Rect(left, round(y, 1), round(w, 1), row, "arm", "", b.color)]
        if b.inner > 0:
            inner = min(b.inner, b.value) * scale
            rects.append(
                Rect(left, round(y + row * 0.3, 1), round(inner, 1), round(row * 0.4, 1), "arm", "", b.inner_color)
            )
        chart.groups.append(Group(b.title, rects))
        chart.texts.append(Text(round(left + w + 6, 1), y + row / 2 + 4, b.text, "start"))
    return chart


#: Most days the per-day chart draws (the latest ones).
MAX_DAYS = 92


def day_chart(rows: Sequence[GroupRow], colors: dict[str, str], lost_color: str) -> Chart:
    """Per UTC day (``rows``: the report's ``day`` breakdown, at most the last :data:`MAX_DAYS`): the ``reported``
    and ``agentcache`` USD side by side and the USD the reported misses lost, on one USD y axis; each day's tooltip
    carries its numbers."""
    rows = [r for r in rows if r.key != "unknown"][-MAX_DAYS:]
    width, height = 1000.0, 250.0
    left, right, top, bottom = 64.0, 12.0, 10.0, 38.0
    plot_w, plot_h = width - left - right, height - top - bottom
    peak = max([max(r.arms["reported"].cost_usd, r.arms["agentcache"].cost_usd, r.usd_lost) for r in rows] + [1e-6])
    ticks = nice_ticks(peak, 4)
    scale = plot_h / ticks[-1]
    chart = Chart(width, height, "USD per UTC day: reported, agentcache, lost to misses")
    y0 = height - bottom
    for t in ticks:
        y = round(y0 - t * scale, 1)
        chart.grid.append((left, y, width - right, y))
        chart.texts.append(Text(left - 4, y + 4, _money(t), "end", "tick"))
    chart.axes.append((left, y0, width - right, y0))
    band = plot_w / max(len(rows), 1)
    bar = band * 0.8 / 3
    step = max(1, math.ceil(len(rows) / 16))
    for i, r in enumerate(rows):
        x = left + i * band + band * 0.1
        rep, ours = r.arms["reported"], r.arms["agentcache"]
        values = ((rep.cost_usd, colors["reported"]), (ours.cost_usd, colors["agentcache"]), (r.usd_lost, lost_color))
        rects = [
            Rect(round(x + k * bar, 1), round(y0 - v * scale, 1), round(bar, 1), round(v * scale, 1), "arm", "", c)
            for k, (v, c) in enumerate(values)
            if v > 0
        ]
        title = (
            f"{r.key}: {rep.requests:,} calls in {r.sessions:,} sessions, {rep.hit_rate:.1%} read; reported "
            f"{usd(rep.cost_usd)}, agentcache {usd(ours.cost_usd)}, lost to misses {usd(r.usd_lost)}"
        )
        chart.groups.append(Group(title, rects))
        if i % step == 0:
            chart.texts.append(Text(round(x + band * 0.4, 1), y0 + 14, r.key[5:], "middle", "tick"))
    chart.texts.append(Text(left + plot_w / 2, height - 4, "UTC day (month-day)", "middle", "axis-title"))
    return chart
