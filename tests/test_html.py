"""The HTML audit report: a header naming its inputs with the terminal's "saved" figures, explained arms, labelled
charts, misses grouped by cause, TTL decisions, escaping, a size bound on large inputs, and a real headless
Chromium rendering (screenshot checked for size and colours, chart widths measured)."""

from __future__ import annotations

import dataclasses
import io
import re
import shutil
import subprocess
from collections import Counter
from html.parser import HTMLParser
from pathlib import Path

import pytest
from rich.console import Console
from typer.testing import CliRunner

from agentcache import _cli as cli
from agentcache import audit
from agentcache._exceptions import InputError
from agentcache.analysis._groups import group_ttl
from agentcache.analysis._html import render_html
from agentcache.analysis._html_charts import MAX_COLUMNS, turn_columns
from agentcache.analysis._html_view import ARM_HELP
from agentcache.analysis._render import render_report
from agentcache.analysis._report import (
    ArmMetrics,
    AuditReport,
    BreakRecord,
    MissRecord,
    ProviderMissRecord,
    SessionReport,
    TurnRecord,
)
from agentcache.analysis._report_logs import fixes_for
from agentcache.loaders import load
from agentcache.simulate import SimUsage
from tests import needs

from .conftest import CASES, DATA

CHROMIUM = shutil.which("chromium") or shutil.which("chromium-browser")
FLAGS = [
    "--headless",
    "--no-sandbox",
    "--disable-gpu",
    "--disable-quic",
    "--no-first-run",
    "--disable-background-networking",
    "--disable-component-update",
    "--disable-sync",
    "--hide-scrollbars",
]
TAU = DATA / "tau-bench" / "gpt-4o-airline.json"
needs_chromium = pytest.mark.skipif(CHROMIUM is None, reason=needs.CHROMIUM)


class _Tables(HTMLParser):
    """Every <table> of a page as rows of cell texts, with the <h2>/<h3> heading before it."""

    def __init__(self) -> None:
        super().__init__()
        self.tables: list[tuple[str, list[list[str]]]] = []
        self.heading = ""
        self._in_heading = False
        self._cell: list[str] | None = None

    def handle_starttag(self, tag: str, attrs: list[tuple[str, str | None]]) -> None:
        if tag in ("h2", "h3"):
            self._in_heading, self.heading = True, ""
        elif tag == "table":
            self.tables.append((self.heading, []))
        elif tag == "tr" and self.tables:
            self.tables[-1][1].append([])
        elif tag in ("td", "th"):
            self._cell = []

    def handle_endtag(self, tag: str) -> None:
        if tag in ("h2", "h3"):
            self._in_heading = False
        elif tag in ("td", "th") and self._cell is not None:
            self.tables[-1][1][-1].append(" ".join("".join(self._cell).split()))
            self._cell = None

    def handle_data(self, data: str) -> None:
        if self._in_heading:
            self.heading += data
        if self._cell is not None:
            self._cell.append(data)


def tables(page: str, heading: str) -> list[list[list[str]]]:
    """The tables under headings starting with ``heading`` (rows without the header row)."""
    p = _Tables()
    p.feed(page)
    return [rows[1:] for h, rows in p.tables if h.strip().startswith(heading)]


@pytest.fixture(scope="module")
def tau() -> AuditReport:
    return audit(load(TAU).records, "anthropic")


@pytest.fixture(scope="module")
def tau_page(tau: AuditReport) -> str:
    return render_html(tau, ["data/tau-bench/gpt-4o-airline.json"])


@pytest.fixture(scope="module")
def compare() -> AuditReport:
    return audit(load(CASES / "k11-parallel-fanout-24-blocks.json").records, "anthropic", compare=True)


def test_page_is_self_contained_and_needs_no_script(tau_page: str) -> None:
    assert not re.search(r"""(src|href)\s*=\s*["']?(https?:)?//""", tau_page)  # no network
    assert "<script" not in tau_page and "<link" not in tau_page


def test_header_names_input_provider_model_sessions_requests(tau: AuditReport, tau_page: str) -> None:
    header = tau_page[tau_page.index("<header>") : tau_page.index("</header>")]
    assert "data/tau-bench/gpt-4o-airline.json" in header
    assert "<dd>anthropic</dd>" in header and f"<dd>{tau.model}</dd>" in header
    assert len(tau.sessions) == 200 and "<dd>200</dd>" in header
    requests = sum(s.requests for s in tau.sessions)
    assert requests == 2454 and f"<dd>{requests:,}</dd>" in header
    # gpt-4o is not in the Anthropic price table: the header says what it was priced as.
    assert "<code>gpt-4o</code> (2,454 requests) is not in the anthropic price table" in header
    assert "data/tau-bench/gpt-4o-airline.json" in tau_page[: tau_page.index("</title>")]


def test_cli_writes_the_report_naming_its_inputs(tmp_path: Path) -> None:
    a, b = CASES / "k01-tools-reordered.json", CASES / "k05-seconds-timestamp-in-system.json"
    out = tmp_path / "report.html"
    result = CliRunner().invoke(cli.app, ["audit", str(a), str(b), "--html", str(out)], catch_exceptions=False)
    assert result.exit_code == 0, result.output
    page = out.read_text()
    assert f"HTML report: {out} ({len(page) / 1024:.0f} KB of text)" in result.stdout  # the terminal says where
    (breaks,) = tables(page, "Prefix breaks by cause")
    assert {r[0] for r in breaks} == {"tools.reordered", "system.volatile"}
    header = page[: page.index("</header>")]
    assert f"{a}<br>{b}</dd>" in header and "<dd>2</dd>" in header  # both files, 2 sessions


def _terminal_saved(report: AuditReport) -> dict[str, tuple[float, float]]:
    """Each arm's "saved" cell (USD, %) as ``agentcache audit`` prints it in the terminal."""
    out = io.StringIO()
    render_report(report, Console(file=out, width=200, highlight=False, color_system=None))
    saved = {}
    for line in out.getvalue().splitlines():
        m = re.match(r"\s*(\w+)\s.*\s(-?[\d,]+\.\d{4}) \((-?[\d.]+)%\)\s*$", line)
        if m and m.group(1) in report.totals:
            saved[m.group(1)] = (float(m.group(2).replace(",", "")), float(m.group(3)))
    return saved


def test_saved_figures_are_the_terminals(tau: AuditReport, tau_page: str) -> None:
    terminal = _terminal_saved(tau)
    assert set(terminal) == {"agentcache", "ideal"}
    (arms,) = tables(tau_page, "What the arms mean")
    html_saved = {}
    for row in arms:
        m = re.fullmatch(r"(-?)\$([\d,]+\.\d{4}) \((-?[\d.]+)%\)", row[-1])
        if m:
            html_saved[row[0]] = (float(m.group(1) + m.group(2).replace(",", "")), float(m.group(3)))
    assert html_saved == terminal
    usd, pct = terminal["agentcache"]
    assert usd == pytest.approx(tau.totals["as_sent"].cost_usd - tau.totals["agentcache"].cost_usd, abs=1e-4)
    assert pct > 80  # tau-bench sends no markers: agentcache's breakpoints save most of the input cost
    # The cards and the headline carry the same figure.
    assert tau_page.count(f"saved ${usd:,.4f}") >= 2


def test_every_arm_is_explained_and_a_new_arm_appears_without_code(compare: AuditReport) -> None:
    report = dataclasses.replace(compare, totals=dict(compare.totals))
    extra = ArmMetrics(requests=3, prompt_tokens=900, cache_read_tokens=600, uncached_tokens=300, cost_usd=0.01)
    report.totals["openai_new_strategy"] = extra  # an arm this renderer has never heard of
    page = render_html(report)
    (arms,) = tables(page, "What the arms mean")
    assert [r[0] for r in arms] == list(report.totals)
    for row in arms:
        assert row[1] == ARM_HELP.get(row[0], "An arm this report adds (no description known).")
    assert len(arms) == 8 and all(r[1] for r in arms)
    # It is charted like the others: a bar in the token chart with its numbers in the tooltip.
    assert "<title>openai_new_strategy, cache read: 600 tokens (66.7% of prompt)</title>" in page
    assert "900 · 66.7% read" in page


def test_charts_have_axes_value_labels_and_tooltips(tau: AuditReport, tau_page: str) -> None:
    charts = re.findall(r"<svg class=\"chart\".*?</svg>", tau_page, re.S)
    # Token and cost charts, cache-read share by request, and 3 arms x 3 detailed sessions.
    assert len(charts) == 3 + 3 * 3
    for c in charts:
        assert re.match(r'<svg class="chart" viewBox="0 0 [\d.]+ [\d.]+"', c) and " width=" not in c[:80]
        assert '<line class="axis"' in c and 'class="tick"' in c and "<title>" in c
    tokens, cost = charts[0], charts[1]
    for m in tau.totals.values():
        assert f"{m.prompt_tokens:,} · {m.hit_rate:.1%} read" in tokens  # value label
    ours = tau.totals["agentcache"]
    assert f"<title>agentcache, cache read: {ours.cache_read_tokens:,} tokens" in tokens  # tooltip
    for tick in ("0", "2.5M", "5M", "10M"):
        assert f">{tick}</text>" in tokens  # x axis in tokens
    assert "prompt tokens</text>" in tokens and "input cost (USD)</text>" in cost
    assert f"${ours.cost_usd:,.4f} · saved $" in cost
    # A per-request column's tooltip carries that request's numbers for that arm.
    first = max(tau.sessions, key=lambda s: s.arms["as_sent"].cost_usd - s.arms["agentcache"].cost_usd)
    turn = next(t for t in tau.turns if t.session == first.session and t.request == 5)
    u = turn.arms["agentcache"]
    assert f"<title>request 5: {u.prompt_tokens:,} tokens; {u.cache_read_tokens:,} read," in tau_page


def test_long_sessions_are_bucketed_in_per_request_charts(tau: AuditReport) -> None:
    turns = [t for t in tau.turns if t.session == tau.sessions[0].session]
    long = [dataclasses.replace(turns[i % len(turns)], request=i) for i in range(250)]
    cols = turn_columns("agentcache", long)
    assert len(cols) == 50 <= MAX_COLUMNS and cols[0][0] == "0-4" and cols[-1][0] == "245-249"
    assert sum(c[2] for c in cols) == sum(t.arms["agentcache"].prompt_tokens for t in long)


def test_misses_are_grouped_by_cause(tau: AuditReport, tau_page: str) -> None:
    (rows,) = tables(tau_page, "Misses by cause")
    groups = Counter((m.cause, m.arm) for m in tau.misses)
    assert len(tau.misses) > 2000 and len(rows) == len(groups) == 2  # not one row per request
    for cause, arm, count, sessions, lost, _rejected, first, last, _where, todo in rows:
        assert todo == (fixes_for(tau)[cause] if arm == "as_sent" else "")  # the client's misses say what to do
        items = [m for m in tau.misses if (m.cause, m.arm) == (cause, arm)]
        assert int(count.replace(",", "")) == len(items) == groups[(cause, arm)]
        assert int(lost.replace(",", "")) == sum(m.tokens_lost for m in items)
        assert int(sessions.replace(",", "")) == len({m.session for m in items})
        assert (int(first), int(last)) == (min(m.request for m in items), max(m.request for m in items))
    # The detailed session's misses too: its 30 as_sent misses are one row.
    detail = tables(tau_page, "Misses in this session")[0]
    assert len(detail) == 1 and detail[0][:3] == ["markers.missing", "as_sent", "30"]
    # agentcache's own requests still miss on 7 of them: the advice says so rather than claim agentcache does it
    ours = [m for m in tau.misses if m.arm == "agentcache"]
    assert (len(ours), sum(m.tokens_lost for m in ours)) == (7, 285)
    assert detail[0][-1] == (
        "place cache markers (agentcache's requests still lose it here: 7 requests, 285 tokens, at messages[2].content)"
    )


def test_ttl_decisions_are_shown() -> None:
    report = audit(load(CASES / "ttl-expired-after-7-minutes.json").records, "anthropic")
    page = render_html(report)
    (rows,) = tables(page, "TTL decisions (agentcache arm)")
    expected = group_ttl(report.turns)
    assert [r[:3] for r in rows] == [[g.ttl, str(g.requests), str(g.sessions)] for g in expected]
    assert sum(g.requests for g in expected) == 3
    assert all("gaps seen" in r[3] or "no timing" in r[3] for r in rows)
    runs = tables(page, "TTL decisions in this session")[0]
    assert sum(len(range(int(r[0].split("–")[0]), int(r[0].split("–")[-1]) + 1)) for r in runs) == 3


def test_prompt_text_and_names_are_escaped() -> None:
    evil = "<script>alert(1)</script>"
    recs = []
    for r in load(CASES / "k05-seconds-timestamp-in-system.json").records:
        body = dict(r.body, model="<img src=x onerror=alert(2)>")
        body["system"] = [
            dict(b, text=b["text"].replace("The current time is", evil + " The time is")) for b in body["system"]
        ]
        recs.append(dataclasses.replace(r, session=evil, body=body))
    report = audit(recs, "anthropic")
    assert report.breaks and report.breaks[0].volatile is not None  # the changing line is in the page
    page = render_html(report, [evil + ".json"])
    assert "<script" not in page and "<img" not in page
    assert "&lt;script&gt;alert(1)&lt;/script&gt;" in page and "&lt;img src=x onerror=alert(2)&gt;" in page


def test_provider_diagnoses_and_skipped_records_are_listed(compare: AuditReport) -> None:
    misses = [
        ProviderMissRecord("s", 2, "anthropic", "system_changed", 1234, "system.changed", True),
        ProviderMissRecord("s", 3, "anthropic", "tools_changed", None, "tools.reordered", True),
        ProviderMissRecord("t", 3, "anthropic", "tools_changed", None, "tools.reordered", True),
        ProviderMissRecord("s", 4, "anthropic", "messages_changed", None, None, False),
    ]
    errors = [InputError("not JSON", source="bad.jsonl", record=i) for i in range(25)]
    page = render_html(dataclasses.replace(compare, provider_misses=misses, errors=errors))
    (rows,) = tables(page, "Provider-reported misses")
    assert rows == [
        ["anthropic: tools_changed", "tools.reordered", "2", "yes"],
        ["anthropic: system_changed", "system.changed", "1", "yes"],
        ["anthropic: messages_changed", "(none)", "1", "no"],
    ]
    assert "<b>75.0%</b> (3 of 4 compared)" in page
    assert '<dt>records skipped</dt><dd class="warn">25</dd>' in page
    assert "<li>bad.jsonl record 19: not JSON</li>" in page and "record 20:" not in page
    assert "… 5 more" in page


def _large_report(sessions: int = 500, requests: int = 100) -> AuditReport:
    """A synthetic audit of ``sessions`` x ``requests`` requests with 8 arms, a miss per request on two arms and a
    volatile break every tenth request (what makes a naive page grow)."""
    arms = ["as_sent", "agentcache", "ideal", "anthropic_auto", "langchain", "litellm", "no_markers", "reported"]
    usage = {a: SimUsage(5000, 4000 * (a != "as_sent"), 300, 700 + 4000 * (a == "as_sent"), 0.01) for a in arms}
    reps, turns, misses, breaks = [], [], [], []
    totals = {a: ArmMetrics() for a in arms}
    for s in range(sessions):
        name = f"run/task{s}-trial{s % 4}"
        rep = SessionReport(name, requests, {a: ArmMetrics() for a in arms})
        for i in range(requests):
            turns.append(TurnRecord(name, i, float(i), usage))
            for a in arms:
                rep.arms[a].add(usage[a])
                totals[a].add(usage[a])
            misses += [
                MissRecord(name, i, "as_sent", "markers.missing", 4000),
                MissRecord(name, i, "litellm", "lookback.exceeded", 900, where=f"messages[{i}].content"),
            ]
            if i % 10 == 9:
                span = {"start": 0, "end": 8, "kinds": ["time"], "text": f"15:00:{i:02d}", "suggestion": "move it"}
                breaks.append(BreakRecord(name, i, "system[0]", "system.volatile", 3000, True, None, span))
        reps.append(rep)
    return AuditReport("anthropic", "claude-opus-4-8", totals, reps, breaks, misses, turns)


def test_size_stays_small_on_a_large_input() -> None:
    report = _large_report()
    assert len(report.turns) == 50_000 and len(report.misses) == 100_000
    page = render_html(report, ["big.jsonl"])
    assert len(page.encode()) < 300_000
    assert "490 other sessions" in page and "<h2>Per request, top 1 session</h2>" in page
    assert len(tables(page, "Misses by cause")[0]) == 2
    # One detailed session of 100 requests: 60 columns at most per arm (buckets of 2 requests).
    assert page.count("<title>request 0-1: ") == 8 and "<title>request 2: " not in page


def test_bundled_tau_bench_report_is_small(tau_page: str) -> None:
    assert len(tau_page.encode()) < 150_000


def _chromium(tmp_path: Path, *args: str) -> subprocess.CompletedProcess[str]:
    assert CHROMIUM is not None
    profile = tmp_path / f"profile{len(list(tmp_path.iterdir()))}"
    cmd = [CHROMIUM, *FLAGS, f"--user-data-dir={profile}", *args]
    return subprocess.run(cmd, capture_output=True, text=True, timeout=120, check=True)


@needs_chromium
def test_screenshot_in_headless_chromium(tau_page: str, tmp_path: Path) -> None:
    from PIL import Image

    page = tmp_path / "report.html"
    page.write_text(tau_page)
    shot = tmp_path / "report.png"
    _chromium(tmp_path, f"--screenshot={shot}", "--window-size=1400,1000", page.as_uri())
    with Image.open(shot) as im:
        assert im.size == (1400, 1000)
        counted = im.convert("RGB").getcolors(maxcolors=1 << 24)
    assert counted is not None
    colours = {colour: n for n, colour in counted}
    assert len(colours) > 50  # text, cards, charts: not a blank page
    # The token chart is above the fold: cache-read green and uncached red bars, as wide as the page allows.
    read, uncached = colours.get((0x2E, 0x7D, 0x32), 0), colours.get((0xC6, 0x28, 0x28), 0)
    assert read > 20_000 and uncached > 10_000


@needs_chromium
def test_charts_fill_the_window(tau_page: str, tmp_path: Path) -> None:
    # A copy of the page with a probe script that writes each chart's rendered width into the DOM.
    probe = (
        "<script>document.body.dataset.widths=[...document.querySelectorAll('svg.chart')]"
        ".map(s=>Math.round(s.getBoundingClientRect().width)).join(',')</script></body>"
    )
    page = tmp_path / "probe.html"
    page.write_text(tau_page.replace("</body>", probe))
    dom = _chromium(tmp_path, "--window-size=1400,1000", "--dump-dom", page.as_uri()).stdout
    m = re.search(r'data-widths="([\d,]+)"', dom)
    assert m is not None
    widths = [int(w) for w in m.group(1).split(",")]
    assert len(widths) == 12
    assert all(w >= 1200 for w in widths[:3])  # token, cost and share charts span the content column
    assert all(350 <= w <= 450 for w in widths[3:6])  # the open session's arms: three panels side by side


def test_reported_arm_shows_no_saving_in_the_page_as_in_the_terminal(tmp_path: Path) -> None:
    """The reported arm covers only the requests that carried usage: the page, like the terminal, gives it no
    "saved" figure against as_sent (a different set of requests)."""
    swe, hands = (
        DATA / "swe-agent/marshmallow-code__marshmallow-1867.function_calling.traj",
        DATA / "openhands/basic_gui_mode.json",
    )
    records = [*load(swe).records, *load(hands).records]
    report = audit(records, provider="anthropic")
    totals = report.totals
    assert "reported" in totals and totals["reported"].prompt_tokens < totals["as_sent"].prompt_tokens
    page = render_html(report)
    start = page.index('<div class="name">reported</div>')
    card = page[start : page.index('<p class="headline"', start)]
    assert "saved" not in card and "not compared" in card
