"""Geometry of the HTML report's inline SVG charts: bars, axes with ticks, value labels and tooltip text. The
template (``templates/report.html.jinja``) turns a :class:`Chart` into ``<svg>`` markup, escaping every string.

Coordinates are in the SVG's own units (``viewBox``); the page scales each chart to the width of its column.
Token segments use the kinds ``read`` (cache read), ``write`` (cache write) and ``uncached``.
"""

from __future__ import annotations

import math
from collections.abc import Callable, Mapping, Sequence
from dataclasses import dataclass, field

from ._report import ArmMetrics, TurnRecord, saving_of

__all__ = ["Chart", "arm_colors", "cost_chart", "share_by_request_chart", "token_chart", "turn_chart", "turn_columns"]

_PALETTE = ("#00897b", "#ef6c00", "#6d4c41", "#c2185b", "#0097a7", "#7cb342", "#3949ab", "#546e7a")
_FIXED = {"as_sent": "#9e9e9e", "agentcache": "#1565c0", "ideal": "#8e24aa", "reported": "#263238"}


@dataclass(frozen=True, slots=True)
class Rect:
    """A filled rectangle; ``kind`` is a token kind (``read``/``write``/``uncached``) or ``arm`` (coloured by
    ``color``); ``title`` its tooltip (empty: none)."""

    x: float
    y: float
    w: float
    h: float
    kind: str
    title: str = ""
    color: str = ""


@dataclass(frozen=True, slots=True)
class Text:
    """A label at (x, y); ``anchor`` is the SVG text-anchor (``start``/``middle``/``end``)."""

    x: float
    y: float
    text: str
    anchor: str = "start"
    cls: str = ""


@dataclass(frozen=True, slots=True)
class Group:
    """Rectangles sharing one tooltip (a stacked bar)."""

    title: str
    rects: list[Rect]


@dataclass(frozen=True, slots=True)
class Line:
    """A polyline of one series with its colour."""

    points: str
    color: str
    title: str
    dashed: bool = False


@dataclass(slots=True)
class Chart:
    """One SVG: ``width`` x ``height`` units, its grid lines (x1, y1, x2, y2), labels, bar groups, lines and a
    transparent ``hover`` rectangle per x position carrying a tooltip. ``label`` is the accessible name."""

    width: float
    height: float
    label: str
    grid: list[tuple[float, float, float, float]] = field(default_factory=list)
    axes: list[tuple[float, float, float, float]] = field(default_factory=list)
    texts: list[Text] = field(default_factory=list)
    groups: list[Group] = field(default_factory=list)
    lines: list[Line] = field(default_factory=list)
    hover: list[Rect] = field(default_factory=list)


def arm_colors(arms: Sequence[str]) -> dict[str, str]:
    """A colour per arm: fixed for the core arms, the palette in order for the others."""
    out, i = {}, 0
    for a in arms:
        if a in _FIXED:
            out[a] = _FIXED[a]
        else:
            out[a] = _PALETTE[i % len(_PALETTE)]
            i += 1
    return out


def nice_ticks(top: float, count: int = 5) -> list[float]:
    """Round tick values from 0 to at least ``top`` (about ``count`` intervals: steps of 1, 2 or 5 x 10^k)."""
    if top <= 0:
        return [0.0, 1.0]
    raw = top / count
    mag = 10 ** math.floor(math.log10(raw))
    step = next(m * mag for m in (1, 2, 2.5, 5, 10) if m * mag >= raw)
    n = math.ceil(top / step - 1e-9)
    return [i * step for i in range(n + 1)]


def compact(n: float) -> str:
    """``1234567`` → ``1.2M``, ``12500`` → ``12.5k``, small numbers as they are."""
    for div, suffix in ((1e9, "G"), (1e6, "M"), (1e3, "k")):
        if abs(n) >= div:
            return f"{n / div:.3g}{suffix}"
    return f"{n:g}"


def usd(x: float) -> str:
    """``8.62149`` → ``$8.6215``, ``-0.0136`` → ``-$0.0136`` (the terminal's 4 decimals)."""
    return f"-${-x:,.4f}" if x < 0 else f"${x:,.4f}"


def _r(v: float) -> float:
    return round(v, 1)


_KINDS = (("read", "cache read"), ("write", "cache write"), ("uncached", "uncached"))


def token_chart(totals: dict[str, ArmMetrics]) -> Chart:
    """Horizontal stacked bars, one per arm: cache-read / cache-write / uncached prompt tokens, with an x axis in
    tokens and each bar's total and hit rate beside it."""
    left, right, top, row, gap = 120.0, 200.0, 8.0, 26.0, 10.0
    width = 1000.0
    plot = width - left - right
    height = top + len(totals) * (row + gap) + 36
    ticks = nice_ticks(max([m.prompt_tokens for m in totals.values()] + [1]))
    scale = plot / ticks[-1]
    chart = Chart(width, height, "Prompt tokens per arm: cache read, cache write, uncached")
    bottom = height - 36
    x_axis(chart, ticks, left, scale, top, bottom, compact)
    chart.texts.append(Text(left + plot / 2, height - 4, "prompt tokens", "middle", "axis-title"))
    for i, (arm, m) in enumerate(totals.items()):
        y = top + i * (row + gap) + gap / 2
        chart.texts.append(Text(left - 8, y + row / 2 + 4, arm, "end", "arm"))
        x, rects = left, []
        for (kind, name), v in zip(_KINDS, (m.cache_read_tokens, m.cache_write_tokens, m.uncached_tokens), strict=True):
            share = v / m.prompt_tokens if m.prompt_tokens else 0.0
            if v:
                title = f"{arm}, {name}: {v:,} tokens ({share:.1%} of prompt)"
                rects.append(Rect(_r(x), _r(y), _r(v * scale), row, kind, title))
            x += v * scale
        chart.groups.append(Group("", rects))
        chart.texts.append(Text(_r(x + 6), y + row / 2 + 4, f"{m.prompt_tokens:,} · {m.hit_rate:.1%} read", "start"))
    return chart


def cost_chart(totals: dict[str, ArmMetrics], colors: dict[str, str]) -> Chart:
    """Horizontal bars of each arm's input cost in USD, with an x axis in USD and the saving against ``as_sent``
    beside each bar (:meth:`ArmMetrics.saved_against`)."""
    left, right, top, row, gap = 120.0, 260.0, 8.0, 26.0, 10.0
    width = 1000.0
    plot = width - left - right
    height = top + len(totals) * (row + gap) + 36
    ticks = nice_ticks(max([m.cost_usd for m in totals.values()] + [1e-6]))
    scale = plot / ticks[-1]
    chart = Chart(width, height, "Input cost per arm (USD)")
    bottom = height - 36
    x_axis(chart, ticks, left, scale, top, bottom, lambda v: f"${v:,.4g}")
    chart.texts.append(Text(left + plot / 2, height - 4, "input cost (USD)", "middle", "axis-title"))
    base = totals.get("as_sent")
    for i, (arm, m) in enumerate(totals.items()):
        y = top + i * (row + gap) + gap / 2
        chart.texts.append(Text(left - 8, y + row / 2 + 4, arm, "end", "arm"))
        label = usd(m.cost_usd)
        if (saving := saving_of(arm, m, base)) is not None:
            saved, share = saving
            label += f" · saved {usd(saved)}" + (f" ({share:.1%})" if share is not None else "")
        w = m.cost_usd * scale
        chart.groups.append(Group("", [Rect(left, _r(y), _r(w), row, "arm", f"{arm}: {label}", colors[arm])]))
        chart.texts.append(Text(_r(left + w + 6), y + row / 2 + 4, label, "start"))
    return chart


#: Most columns in one per-request chart; longer sessions are drawn in buckets of consecutive requests.
MAX_COLUMNS = 60


def turn_chart(
    arm: str,
    turns: Sequence[TurnRecord],
    top_tokens: int | None = None,
    *,
    marks: Mapping[int, str] | None = None,
    noun: str = "request",
) -> Chart:
    """Vertical stacked columns, one per request of a session (or per bucket of consecutive requests, summed, past
    :data:`MAX_COLUMNS`), for ``arm``: cache-read / cache-write / uncached tokens, y axis in tokens up to
    ``top_tokens`` (default: this chart's tallest column; pass one value to give a session's panels one scale), x
    axis the request index. ``marks``: request index → tooltip of a marker drawn above its column (a miss);
    ``noun``: what a column is called in labels and tooltips (``call`` for agents' logs)."""
    width, height = 460.0, 210.0
    left, right, top, bottom = 48.0, 8.0, 8.0, 34.0
    plot_w, plot_h = width - left - right, height - top - bottom
    columns = turn_columns(arm, turns)
    peak = top_tokens if top_tokens is not None else max((c[2] for c in columns), default=1)
    ticks = nice_ticks(max(peak, 1), 4)
    scale = plot_h / ticks[-1]
    chart = Chart(width, height, f"{arm}: prompt tokens per {noun}")
    y0 = height - bottom
    for t in ticks:
        y = _r(y0 - t * scale)
        chart.grid.append((left, y, width - right, y))
        chart.texts.append(Text(left - 4, y + 4, compact(t), "end", "tick"))
    chart.axes.append((left, y0, width - right, y0))
    band = plot_w / max(len(columns), 1)
    step = max(1, math.ceil(len(columns) / 10))
    marked = _marks_by_column(turns, marks or {})
    for i, (label, parts, prompt, cost) in enumerate(columns):
        x = left + i * band
        if i % step == 0:
            chart.texts.append(Text(_r(x + band / 2), y0 + 14, label.split("-")[0], "middle", "tick"))
        if prompt == 0 and cost == 0:
            continue
        rects, y = [], y0
        for (kind, _), v in zip(_KINDS, parts, strict=True):
            if v:
                h = v * scale
                y -= h
                rects.append(Rect(_r(x + band * 0.1), _r(y), _r(band * 0.8), _r(h), kind))
        read, write, uncached = parts
        title = (
            f"{noun} {label}: {prompt:,} tokens; {read:,} read, {write:,} written, {uncached:,} uncached; ${cost:.4f}"
        )
        chart.groups.append(Group(title, rects))
        if i in marked:  # above the column, its own tooltip (the miss), not the column's
            mark = Rect(_r(x + band * 0.1), _r(max(1.0, y - 9)), _r(band * 0.8), 6, "miss", marked[i])
            chart.groups.append(Group("", [mark]))
    chart.texts.append(
        Text(left + plot_w / 2, height - 4, f"{noun} (0-based, within the session)", "middle", "axis-title")
    )
    return chart


def _per_column(n: int) -> int:
    """Requests per column of a per-request chart of ``n`` requests (:data:`MAX_COLUMNS` at most)."""
    return max(1, math.ceil(n / MAX_COLUMNS))


def _marks_by_column(turns: Sequence[TurnRecord], marks: Mapping[int, str]) -> dict[int, str]:
    """The tooltips of ``marks`` per chart column (a bucket's marks joined, the first three named)."""
    texts: dict[int, list[str]] = {}
    per = _per_column(len(turns))
    for pos, t in enumerate(turns):
        if t.request in marks:
            texts.setdefault(pos // per, []).append(marks[t.request])
    return {col: "; ".join(ts[:3]) + (f"; … {len(ts) - 3} more" if len(ts) > 3 else "") for col, ts in texts.items()}


def turn_columns(arm: str, turns: Sequence[TurnRecord]) -> list[tuple[str, tuple[int, int, int], int, float]]:
    """``arm``'s per-request usage as chart columns ``(label, (read, write, uncached), prompt tokens, USD)``: one
    per request, or per bucket of consecutive requests (label ``first-last``) when there are more than
    :data:`MAX_COLUMNS`."""
    per = _per_column(len(turns))
    out = []
    for i in range(0, len(turns), per):
        chunk = turns[i : i + per]
        read = write = uncached = prompt = 0
        cost = 0.0
        for t in chunk:
            u = t.arms.get(arm)
            if u is not None:
                read, write, uncached = (
                    read + u.cache_read_tokens,
                    write + u.cache_write_tokens,
                    uncached + u.uncached_tokens,
                )
                prompt += u.prompt_tokens
                cost += u.cost_usd
        label = str(chunk[0].request) if per == 1 else f"{chunk[0].request}-{chunk[-1].request}"
        out.append((label, (read, write, uncached), prompt, cost))
    return out


def share_by_request_chart(turns: Sequence[TurnRecord], arms: Sequence[str], colors: dict[str, str]) -> Chart | None:
    """One line per arm: the share of prompt tokens read from the cache at each request index, summed over all
    sessions (index ``i`` = every session's ``i``-th request); None without turns. Indices past 100 are merged
    into buckets so the chart stays small."""
    if not turns:
        return None
    n = max(t.request for t in turns) + 1
    per = max(1, math.ceil(n / 100))
    buckets = math.ceil(n / per)
    read = {a: [0] * buckets for a in arms}
    prompt = {a: [0] * buckets for a in arms}
    sessions: list[set[str]] = [set() for _ in range(buckets)]
    for t in turns:
        b = t.request // per
        sessions[b].add(t.session)
        for a in arms:
            u = t.arms.get(a)
            if u is not None:
                read[a][b] += u.cache_read_tokens
                prompt[a][b] += u.prompt_tokens
    width, height = 1000.0, 240.0
    left, right, top, bottom = 48.0, 12.0, 10.0, 34.0
    plot_w, plot_h = width - left - right, height - top - bottom
    y0 = height - bottom
    chart = Chart(width, height, "Share of prompt tokens read from the cache, by request index, all sessions")
    for pct in (0, 25, 50, 75, 100):
        y = _r(y0 - pct / 100 * plot_h)
        chart.grid.append((left, y, width - right, y))
        chart.texts.append(Text(left - 4, y + 4, f"{pct}%", "end", "tick"))
    chart.axes.append((left, y0, width - right, y0))
    band = plot_w / buckets

    def share(a: str, b: int) -> float:
        return read[a][b] / prompt[a][b] if prompt[a][b] else 0.0

    for a in arms:
        pts = " ".join(
            f"{_r(left + (b + 0.5) * band)},{_r(y0 - share(a, b) * plot_h)}" for b in range(buckets) if prompt[a][b]
        )
        chart.lines.append(Line(pts, colors[a], a, dashed=a == "ideal"))  # the bound, drawn over the others
    step = max(1, math.ceil(buckets / 15))
    for b in range(buckets):
        x = left + b * band
        label = str(b * per) if per == 1 else f"{b * per}-{min(n, (b + 1) * per) - 1}"
        if b % step == 0:
            chart.texts.append(Text(_r(x + band / 2), y0 + 14, label, "middle", "tick"))
        parts = ", ".join(f"{a} {share(a, b):.1%}" for a in arms if prompt[a][b])
        title = f"request {label} ({len(sessions[b])} sessions): {parts}"
        chart.hover.append(Rect(_r(x), top, _r(band), plot_h, "hover", title))
    chart.texts.append(Text(left + plot_w / 2, height - 4, "request index within the session", "middle", "axis-title"))
    return chart


def x_axis(
    chart: Chart, ticks: list[float], left: float, scale: float, top: float, bottom: float, fmt: Callable[[float], str]
) -> None:
    for t in ticks:
        x = _r(left + t * scale)
        chart.grid.append((x, top, x, bottom))
        chart.texts.append(Text(x, bottom + 14, fmt(t), "middle", "tick"))
    chart.axes.append((left, bottom, left + ticks[-1] * scale, bottom))
