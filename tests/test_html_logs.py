"""The HTML page of an audit of agents' own logs (``mode = "reported"``): the header's sources, period and arms, the
arm legend, the spend split, the causes with their fixes and the largest misses, the per-day chart and breakdowns,
the session tree with subagents under their parent and per-call charts with misses marked. Every number is checked
against the report (and the terminal's "saved" figure); a large generated audit checks the size bound and what is
summed; headless Chromium renders the page."""

from __future__ import annotations

import dataclasses
import datetime as dt
import io
import re
from pathlib import Path

import pytest
from rich.console import Console

from agentcache._audit_logs import audit_logs
from agentcache.analysis._html import render_html
from agentcache.analysis._html_charts import usd
from agentcache.analysis._html_logs_view import LOG_ARM_HELP
from agentcache.analysis._render_logs import render_logs_report
from agentcache.analysis._report import ArmMetrics, AuditReport
from agentcache.analysis._report_logs import FIXES, SourceRow
from agentcache.loaders import UsageRecord
from agentcache.model._provider import ProviderDiagnosis

from .logs_corpus import corpus, usage
from .test_html import _chromium, needs_chromium, tables

T0 = 1_790_000_000.0  # 2026-09-21 14:13 UTC
OPUS, SONNET = "claude-opus-4-8", "claude-sonnet-4-6"


def call(
    session: str,
    i: int,
    at: float,
    read: int,
    w5: int,
    *,
    model: str = OPUS,
    project: str = "/work/api",
    parent: str | None = None,
    events: tuple[str, ...] = (),
    diagnosis: ProviderDiagnosis | None = None,
) -> UsageRecord:
    u = dataclasses.replace(usage(read, w5, uncached=5), diagnosis=diagnosis)
    kind = "subagent" if parent else "main"
    return UsageRecord(
        session, "claude-code", "anthropic.messages", u, model, T0 + at, f"{session}-{i}", parent, project,
        kind, events,  # type: ignore[arg-type]
    )  # fmt: skip


def handmade() -> list[UsageRecord]:
    """Session ``p`` (two pauses past 5 minutes: ``ttl.expired``; the second one the TTL policy bridges) with its
    subagent ``p/agent-1``; session ``q`` the next day in another project (a model switch the provider diagnosed,
    then a compaction)."""
    day = 86_400.0
    return [
        call("p", 0, 0, 0, 20_000),
        call("p", 1, 30, 20_000, 2_000),
        call("p/agent-1", 0, 40, 0, 9_000, parent="p"),
        call("p/agent-1", 1, 50, 9_000, 300, parent="p"),
        call("p", 2, 60, 22_000, 2_000),
        call("p", 3, 660, 0, 26_000),
        call("p", 4, 700, 26_000, 1_000),
        call("p", 5, 1630, 0, 28_000),
        call("p", 6, 1700, 28_000, 500),
        call("q", 0, day, 0, 15_000, project="/work/web"),
        call(
            "q",
            1,
            day + 20,
            0,
            16_000,
            project="/work/web",
            model=SONNET,
            diagnosis=ProviderDiagnosis("anthropic", "model_changed"),
        ),
        call("q", 2, day + 40, 0, 5_000, project="/work/web", model=SONNET, events=("compacted",)),
    ]


SOURCES = [
    SourceRow(
        "claude-code", ("/home/me/.claude/projects/-work-api", "/home/me/.claude/projects/-work-web"), 3, 12, 3, 2
    )
]


@pytest.fixture(scope="module")
def report() -> AuditReport:
    return audit_logs(handmade(), sources=SOURCES)


@pytest.fixture(scope="module")
def page(report: AuditReport) -> str:
    return render_html(report, ["/home/me/.claude/projects"])


def _cells(m: ArmMetrics) -> list[str]:
    """An arm's totals as the page's table prints them."""
    rate = f"{m.hit_rate * 100:.1f}%"
    tokens = (m.requests, m.prompt_tokens, m.cache_read_tokens, m.cache_write_tokens, m.uncached_tokens)
    return [*(f"{n:,}" for n in tokens), rate, usd(m.cost_usd)]


def test_the_handmade_report_has_what_the_page_must_show(report: AuditReport) -> None:
    assert report.mode == "reported" and len(report.sessions) == 3
    assert [(c.cause, c.misses, c.diagnosed) for c in report.causes] == [
        ("ttl.expired", 2, 0),
        ("options.model", 1, 1),
        ("messages.compacted", 1, 0),
    ]
    assert report.causes[0].saved_by.keys() == {"ttl"}
    assert [r.key for r in report.groups["day"]] == ["2026-09-21", "2026-09-22"]


def test_header_names_sources_period_sessions_calls(report: AuditReport, page: str) -> None:
    header = page[page.index("<header>") : page.index("</header>")]
    assert "<dd>2026-09-21 to 2026-09-22</dd>" in header
    assert "<dd>3 <small>(1 subagent)</small></dd>" in header
    assert f"<dd>{report.totals['reported'].requests}</dd>" in header and report.totals["reported"].requests == 12
    models = [r.key for r in report.groups["model"]]  # the costliest first
    assert report.model == "mixed" and sorted(models) == [OPUS, SONNET]
    assert "<dd>anthropic</dd>" in header and f"<dt>models</dt><dd>{models[0]}, {models[1]}</dd>" in header
    (sources,) = tables(page, "Logs read")
    assert sources == [
        ["claude-code", "/home/me/.claude/projects/-work-api/home/me/.claude/projects/-work-web", "3", "12", "3", "2"]
    ]
    lost = sum(c.usd_lost for c in report.causes)
    assert f"<dt>lost to misses</dt><dd>{usd(lost)}</dd>" in header
    # One card per arm with its cost and hit rate; the agentcache card says what it saves against reported.
    for name, m in report.totals.items():
        card = header[header.index(f'<div class="name">{name}</div>') :]
        assert card.startswith(f'<div class="name">{name}</div>\n<div class="big">{usd(m.cost_usd)}</div>')
        assert f"{m.hit_rate * 100:.1f}% read from cache" in card[:300]
    saved, share = report.totals["agentcache"].saved_against(report.totals["reported"])
    assert saved > 0 and share is not None
    assert f"saves {usd(saved)} · {share * 100:.1f}%" in header
    assert (
        "<title>agentcache audit of agents' logs: /home/me/.claude/projects (2026-09-21 to 2026-09-22)</title>" in page
    )


def _terminal(report: AuditReport) -> str:
    out = io.StringIO()
    render_logs_report(report, Console(file=out, width=250, highlight=False, color_system=None), ("day",))
    return out.getvalue()


def test_arms_table_is_the_terminals_totals_with_the_legend(report: AuditReport, page: str) -> None:
    (arms,) = tables(page, "What the arms mean")
    assert [r[0] for r in arms] == ["reported", "agentcache"]
    for row in arms:
        m = report.totals[row[0]]
        assert row[1] == LOG_ARM_HELP[row[0]] and row[2:9] == _cells(m)
    assert "refreshes are counted as requests" in arms[1][1] and "only what was known before each call" in arms[1][1]
    # The saving is the terminal's "saved" cell (USD and share), with a "$".
    line = next(x for x in _terminal(report).splitlines() if re.match(r"\s*agentcache\s+\d", x))
    m = re.search(r"([\d,]+\.\d{4}) \(([\d.]+)%\)\s*$", line)
    assert m is not None and arms[1][9] == f"${m.group(1)} ({m.group(2)}%)" and arms[0][9] == "—"
    # The agentcache arm counts the keep-warm refreshes as calls: never fewer than the reported calls.
    assert report.totals["agentcache"].requests >= report.totals["reported"].requests


def test_spend_table_and_chart(report: AuditReport, page: str) -> None:
    (spend,) = tables(page, "Where the reported spend went")
    total = sum(report.spend.values())
    expected = {
        "cache reads": report.spend["reads"],
        "writes: session starts": report.spend["writes.session_start"],
        "writes: subagent starts": report.spend["writes.subagent_start"],
        "writes: new turns": report.spend["writes.new_turns"],
        "writes: rewrites after misses": report.spend["writes.rewrites"],
        "uncached input": report.spend["uncached"],
    }
    assert [r[0] for r in spend] == list(expected)  # every part is non-zero here, in the terminal's order
    for label, usd_cell, share in spend:
        assert usd_cell == usd(expected[label]) and share == f"{expected[label] / total * 100:.1f}%"
    assert total == pytest.approx(report.totals["reported"].cost_usd)
    rewrites = usd(report.spend["writes.rewrites"])
    assert f"<title>writes: rewrites after misses: {rewrites}</title>" in page  # the bar's tooltip


def test_causes_with_fixes_and_the_largest_misses(report: AuditReport, page: str) -> None:
    (causes, largest) = tables(page, "Misses by cause")[0], tables(page, "Largest misses")[0]
    assert [r[0] for r in causes] == [c.cause for c in report.causes]
    for row, c in zip(causes, report.causes, strict=True):
        assert row[1:6] == [
            str(c.misses),
            str(c.misses - c.diagnosed),
            str(c.diagnosed),
            f"{c.tokens_lost:,}",
            usd(c.usd_lost),
        ]
        assert row[8] == FIXES[c.cause]
    ttl = report.causes[0]
    assert causes[0][6] == usd(ttl.saved_usd) and causes[0][7] == f"TTL policy {usd(ttl.saved_by['ttl'])}"
    assert causes[1][6:8] == ["—", "—"]  # nothing agentcache's time-only levers can do about a model switch
    # Each miss with its evidence, the largest first; the one the TTL policy bridges is read by agentcache.
    misses = sorted((m for m in report.misses if m.arm == "reported"), key=lambda m: -(m.usd_lost or 0))
    assert [(r[0], r[1], r[3], r[4], r[5]) for r in largest] == [
        (
            m.session,
            str(m.request),
            m.cause + ("" if m.inferred else " diagnosed"),
            f"{m.tokens_lost:,}",
            usd(m.usd_lost or 0),
        )
        for m in misses
    ]
    by_call = {(r[0], r[1]): r for r in largest}
    assert by_call["p", "3"][6:] == ["misses too", "10m pause > 5m TTL"]
    assert by_call["p", "5"][6:] == ["reads it", "15m 30s pause > 5m TTL"]
    assert by_call["p", "5"][2] == "2026-09-21 14:40"
    assert by_call["q", "1"][7] == "the provider's diagnosis: model_changed"
    assert by_call["q", "2"][7] == "the log records a compaction before this call"
    # The headline story: USD lost per cause and what agentcache saves.
    assert (
        f"<b>{usd(ttl.usd_lost)}</b> lost to <code>ttl.expired</code> (2 misses): agentcache would have saved" in page
    )


def test_per_day_chart_and_breakdowns(report: AuditReport, page: str) -> None:
    for by in ("day", "project", "model", "client"):
        (rows,) = tables(page, f"By {by}")
        groups = report.groups[by]
        assert [r[0] for r in rows] == [g.key for g in groups]
        for row, g in zip(rows, groups, strict=True):
            rep, ours = g.arms["reported"], g.arms["agentcache"]
            cells = [str(g.sessions), f"{rep.requests:,}", f"{rep.hit_rate * 100:.1f}%", usd(rep.cost_usd)]
            assert row[1:] == [*cells, usd(ours.cost_usd), usd(g.usd_lost)]
    day = report.groups["day"][0]
    assert day.sessions == 2 and day.arms["reported"].requests == 9  # p and its subagent
    chart = re.search(r'<svg class="chart"[^>]*aria-label="USD per UTC day.*?</svg>', page, re.S)
    assert chart is not None
    rep = day.arms["reported"]
    assert (
        f"<title>2026-09-21: 9 calls in 2 sessions, {rep.hit_rate:.1%} read; reported {usd(rep.cost_usd)}, "
        f"agentcache {usd(day.arms['agentcache'].cost_usd)}, lost to misses {usd(day.usd_lost)}</title>"
    ) in chart.group(0)
    assert ">09-21</text>" in chart.group(0) and ">09-22</text>" in chart.group(0)


def test_subagent_is_under_its_parent_in_the_session_tree(report: AuditReport, page: str) -> None:
    (tree,) = tables(page, "Sessions")
    by = {s.session: s for s in report.sessions}
    p, sub, q = by["p"], by["p/agent-1"], by["q"]
    assert p.usd_lost > q.usd_lost  # p's lineage lost the most: it comes first, its subagent right under it
    assert [r[0].split(" lineage:")[0] for r in tree] == ["p", "└agent-1 subagent", "q"]
    lineage = p.arms["reported"].cost_usd + sub.arms["reported"].cost_usd
    assert tree[0][0] == f"p lineage: 2 sessions, 9 calls, {usd(lineage)} reported, {usd(p.usd_lost)} lost"
    for row, s in ((tree[0], p), (tree[1], sub), (tree[2], q)):
        assert row[1:9] == [
            "claude-code",
            s.project,
            dt_minute(s.started),
            str(s.requests),
            f"{s.arms['reported'].hit_rate * 100:.1f}%",
            usd(s.arms["reported"].cost_usd),
            usd(s.arms["agentcache"].cost_usd),
            usd(s.usd_lost),
        ]
    assert [r[9] for r in tree] == ["ttl.expired", "—", "messages.compacted"]  # each session's last miss


def dt_minute(at: float | None) -> str:
    assert at is not None
    return dt.datetime.fromtimestamp(at, dt.UTC).strftime("%Y-%m-%d %H:%M")


def test_per_call_charts_mark_the_misses(report: AuditReport, page: str) -> None:
    assert "<h2>Per call, the 2 sessions that lost the most</h2>" in page  # p and q; the subagent lost nothing
    p = next(m for m in report.misses if (m.session, m.request, m.arm) == ("p", 3, "reported"))
    lost = usd(p.usd_lost or 0)
    mark = f"<title>call 3: ttl.expired (inferred), 24,000 tokens lost, {lost}; 10m pause &gt; 5m TTL</title>"
    assert mark in page
    assert "<title>call 3: still a miss: ttl.expired (inferred), 24,000 tokens lost" in page  # agentcache's panel
    assert "<title>call 5: still a miss" not in page and "<title>call 5: ttl.expired" in page
    assert "<title>call 1: options.model (diagnosed), 15,000 tokens lost" in page
    assert page.count('class="miss"') == 4 + 3  # reported: 2 in p, 2 in q; agentcache: 1 in p, 2 in q
    (rows,) = tables(page, "Misses in this session")[:1]
    assert [r[:2] for r in rows] == [["3", "ttl.expired"], ["5", "ttl.expired"]]
    assert [r[4] for r in rows] == ["misses too", "reads it"]


def test_names_are_escaped() -> None:
    evil = "<script>alert(1)</script>"
    recs = [
        dataclasses.replace(r, session=evil + r.session, project=evil, parent=r.parent and evil + r.parent)
        for r in handmade()
    ]
    page = render_html(audit_logs(recs, sources=[SourceRow(evil, (evil,), 1, 1, 1)]), [evil])
    assert "<script" not in page and "&lt;script&gt;alert(1)&lt;/script&gt;" in page


def test_no_misses_says_so() -> None:
    page = render_html(audit_logs(handmade()[:2]))
    assert "No cache misses in the reported usage: every call read what its session had cached." in page
    assert "<h2>Per call" not in page and not tables(page, "Largest misses")


def test_simulated_reports_keep_their_page(report: AuditReport) -> None:
    simulated = dataclasses.replace(report, mode="simulated")
    page = render_html(simulated)
    assert "<h2>Prefix breaks by cause</h2>" in page and "agents' logs" not in page


@pytest.fixture(scope="module")
def large() -> AuditReport:
    return audit_logs(corpus(3_000, 120, (4, 20), seed=11))


def test_page_size_is_bounded_and_says_what_is_summed(large: AuditReport) -> None:
    calls, sessions = large.totals["reported"].requests, len(large.sessions)
    assert calls > 40_000 and sessions > 4_000 and len(large.misses) > 10_000 and len(large.groups["day"]) > 100
    page = render_html(large, ["~/.claude/projects"])
    size = len(page.encode())
    assert size < 400_000, size
    assert len(re.findall(r'<svg class="chart"', page)) == 3 + 2 * 3  # spend, causes, days; 3 sessions x 2 arms
    (days,) = tables(page, "By day")
    assert len(days) == 1 + 31 and re.fullmatch(r"\d+ earlier days, summed", days[0][0])
    assert sum(int(r[2].replace(",", "")) for r in days) == calls  # the summed row holds the rest
    (tree,) = tables(page, "Sessions")
    rest = tree[-1]
    m = re.fullmatch(r"([\d,]+) other lineages \(([\d,]+) sessions\), summed", rest[0])
    assert m is not None
    listed = [r for r in tree[:-1] if "more subagents" not in r[0]]
    hidden = sum(int(re.search(r"… (\d+) more", r[0]).group(1)) for r in tree if "more subagents" in r[0])  # type: ignore[union-attr]
    assert len(listed) + hidden + int(m.group(2).replace(",", "")) == sessions
    assert sum(int(r[4].replace(",", "")) for r in tree) == calls
    (largest,) = tables(page, "Largest misses")
    assert (
        len(largest) == 15
        and f"<h3>Largest misses (15 of {sum(m.arm == 'reported' for m in large.misses):,})</h3>" in page
    )
    assert "(the last 92 of" in page  # the per-day chart: the latest 92 days


@needs_chromium
def test_screenshot_in_headless_chromium(tmp_path: Path) -> None:
    from PIL import Image

    report = audit_logs(corpus(), sources=SOURCES)
    page = tmp_path / "logs.html"
    page.write_text(render_html(report, ["~/.claude/projects"]))
    colours = {}
    for height in (1000, 7000):
        shot = tmp_path / f"logs{height}.png"
        _chromium(tmp_path, f"--screenshot={shot}", f"--window-size=1400,{height}", page.as_uri())
        with Image.open(shot) as im:
            assert im.size == (1400, height)
            counted = im.convert("RGB").getcolors(maxcolors=1 << 24)
        assert counted is not None
        colours[height] = {colour: n for n, colour in counted}
    top, whole = colours[1000], colours[7000]
    assert len(top) > 50  # text, cards, tables: not a blank page
    # Above the fold: the two cards' top borders (reported dark, agentcache blue, 4 px x ~600 px each).
    assert top.get((0x26, 0x32, 0x38), 0) > 1_500 and top.get((0x15, 0x65, 0xC0), 0) > 1_500
    # Further down: the spend bars (rewrites dark orange), the lost-USD bars, the per-call charts' read green and
    # their purple miss marks.
    assert whole.get((0xE6, 0x51, 0x00), 0) > 5_000 and whole.get((0xC6, 0x28, 0x28), 0) > 10_000
    assert whole.get((0x2E, 0x7D, 0x32), 0) > 50_000 and whole.get((0x6A, 0x1B, 0x9A), 0) > 200


def test_a_model_not_in_the_price_table_is_named_with_its_estimate() -> None:
    """As the terminal says it: a call of an unknown model is counted at the default model's prices, and the page
    says so (a total is never silently another model's)."""
    recs = [dataclasses.replace(r, model="claude-nova-9") if r.session == "q" else r for r in handmade()]
    report = audit_logs(recs)
    (unknown,) = [m for m in report.models if not m.known]
    assert (unknown.model, unknown.requests, unknown.priced_as) == ("claude-nova-9", 3, OPUS)
    page = re.sub(r"<[^>]+>", "", render_html(report))
    assert "Model claude-nova-9 (3 requests) is not in the anthropic price table: its USD are priced as" in page
    assert f"{_terminal(report).count('unknown anthropic model claude-nova-9 (3 requests): priced as')}" == "1"
