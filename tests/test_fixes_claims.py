""" "What to do" in the recording audit: a fix's "(agentcache does)" claim stands only where the agentcache arm
achieved it in the audited traffic; otherwise the advice says what remains (requests, tokens, where) and why when
agentcache knows it, in the terminal and in the HTML page."""

from __future__ import annotations

import io
import json
from pathlib import Path

from rich.console import Console
from typer.testing import CliRunner

from agentcache._cli import app
from agentcache.analysis._render import render_report
from agentcache.analysis._report import ArmMetrics, AuditReport, MissRecord, SessionReport
from agentcache.analysis._report_logs import FIXES, fixes_for

from .conftest import CASES

runner = CliRunner()


def test_claim_kept_where_agentcache_achieves_it() -> None:
    out = runner.invoke(app, ["audit", str(CASES / "k01-tools-reordered.json"), "--provider", "anthropic"])
    assert out.exit_code == 0, out.output
    text = " ".join(out.output.split())
    assert "markers.missing: place cache markers (agentcache does)" in text
    assert "tools.reordered: build the tool list in a fixed order (agentcache repairs it)" in text


def test_claim_replaced_by_what_remains(tmp_path: Path) -> None:
    case = str(CASES / "k15-resume-rewrites-assistant-text.json")
    doc = json.loads(runner.invoke(app, ["audit", case, "--provider", "anthropic", "--json"]).output)
    ours = [m for m in doc["misses"] if m["arm"] == "agentcache" and m["cause"] == "markers.missing"]
    assert [(m["tokens_lost"], m["where"]) for m in ours] == [(647, "messages[4].content[0]")]
    out = runner.invoke(app, ["audit", case, "--provider", "anthropic", "--html", str(tmp_path / "r.html")])
    text = " ".join(out.output.split())
    want = "place cache markers (agentcache's requests still lose it here: 1 request, 647 tokens, at "
    want += "messages[4].content[0])"
    assert f"markers.missing: {want}" in text and "(agentcache does)" not in text
    assert "Misses by arm and cause (simulated)" in text  # no reported usage: every arm is simulated
    html = (tmp_path / "r.html").read_text()
    assert want.replace("'", "&#39;") in html and "place cache markers (agentcache does)" not in html


def test_why_a_client_key_remains() -> None:
    misses = [
        MissRecord(f"s{i}", 0, arm, "cache_key.changed", 3870, where="prompt_cache_key")
        for i in (1, 2)
        for arm in ("as_sent", "agentcache")
    ]
    report = AuditReport(
        "openai", "gpt-5", {a: ArmMetrics() for a in ("as_sent", "agentcache")}, [SessionReport("s1")], [], misses
    )
    fix = fixes_for(report)["cache_key.changed"]
    assert fix == (
        "one prompt_cache_key per session lineage (agentcache's requests still lose it here: 2 requests, each a "
        "session's first, 7,740 tokens, at prompt_cache_key; because the client sets its own prompt_cache_key, and "
        "agentcache keeps a client's key)"
    )
    assert (
        fixes_for(AuditReport("openai", "gpt-5", {}, [], [], misses[::2]))["cache_key.changed"]
        == FIXES["cache_key.changed"]
    )
    buf = io.StringIO()
    render_report(report, Console(file=buf, width=400))
    assert f"cache_key.changed: {fix}" in buf.getvalue()
