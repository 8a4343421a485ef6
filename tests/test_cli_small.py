"""Small things a newcomer trips on (issue 15 item 7): an empty Sessions is truthy, the audit's misses table is
grouped by arm, "Top 1 session" is singular, and the test run says why tests were skipped."""

from __future__ import annotations

import io
import subprocess
import sys
from pathlib import Path
from types import SimpleNamespace
from typing import Any

from rich.console import Console

import agentcache
from agentcache.analysis._render import _render_misses, render_report
from agentcache.analysis._report import MissRecord
from agentcache.loaders import load

from . import needs
from .conftest import skip_reasons

ROOT = Path(__file__).resolve().parent.parent
K01 = ROOT / "tests" / "cases" / "k01-tools-reordered.json"


def test_empty_sessions_is_truthy() -> None:
    sessions = agentcache.Sessions()
    assert len(sessions) == 0 and bool(sessions) is True
    chosen = sessions if sessions else None  # the idiom that silently skipped wrapping
    assert chosen is sessions


def _rows(text: str) -> list[list[str]]:
    """The body rows of a rendered table (cells split on runs of blanks; the cells here hold no blanks)."""
    lines = text.splitlines()
    rule = next(i for i, ln in enumerate(lines) if ln.strip().startswith("─"))
    return [ln.split() for ln in lines[rule + 1 :] if ln.strip()]


def test_misses_are_grouped_by_arm_then_count() -> None:
    def misses(arm: str, cause: str, n: int, lost: int) -> list[MissRecord]:
        return [MissRecord("s", i, arm, cause, lost) for i in range(n)]

    records = [
        *misses("langchain", "ttl_expired", 1, 9000),
        *misses("agentcache", "below_minimum", 3, 10),
        *misses("anthropic_auto", "lookback_exceeded", 5, 100),
        *misses("langchain", "below_minimum", 4, 10),
        *misses("agentcache", "ttl_expired", 2, 5000),
        *misses("as_sent", "ttl_expired", 1, 1),
        *misses("anthropic_auto", "ttl_expired", 1, 8000),
    ]
    out = io.StringIO()
    _render_misses(records, Console(file=out, width=200, color_system=None))
    rows = [(r[0], r[1], r[2]) for r in _rows(out.getvalue())]
    assert rows == [
        ("as_sent", "ttl_expired", "1"),
        ("agentcache", "below_minimum", "3"),  # most misses first, though ttl_expired lost more tokens
        ("agentcache", "ttl_expired", "2"),
        ("anthropic_auto", "lookback_exceeded", "5"),  # --compare arms: each one together, by name
        ("anthropic_auto", "ttl_expired", "1"),
        ("langchain", "below_minimum", "4"),
        ("langchain", "ttl_expired", "1"),
    ]


def test_top_sessions_title_is_pluralised() -> None:
    report = agentcache.audit(load(K01).records, provider="anthropic")
    assert len(report.sessions) == 1
    out = io.StringIO()
    render_report(report, Console(file=out, width=200, color_system=None))
    assert "Top 1 session by saving" in out.getvalue() and "Top 1 sessions" not in out.getvalue()


def test_skip_reasons_are_grouped() -> None:
    def skipped(reason: str) -> SimpleNamespace:
        return SimpleNamespace(longrepr=("tests/x.py", 3, f"Skipped: {reason}"))

    reports = [skipped("need SGLang"), skipped("need a GPU"), skipped("need SGLang"), skipped("")]
    assert skip_reasons(reports) == [(2, "need SGLang"), (1, "need a GPU"), (1, "no reason given")]
    # pytest.importorskip's reasons count under the extra that installs the module: one line per component
    sdk = [skipped(f"could not import '{m}': No module named '{m}'") for m in ("openai", "anthropic", "openai")]
    assert skip_reasons([*sdk, skipped(needs.LLAMA)]) == [(3, needs.extra("sdk")), (1, needs.LLAMA)]


def test_pytest_q_prints_the_skip_summary(tmp_path: Path) -> None:
    (tmp_path / "test_skips.py").write_text(
        "import pytest\n\n"
        "@pytest.mark.parametrize('i', range(3))\n"
        "def test_gpu(i):\n    pytest.skip('need a GPU')\n\n"
        "@pytest.mark.skip(reason='need SGLang')\n"
        "def test_sglang():\n    pass\n\n"
        "def test_ok():\n    pass\n"
    )
    done = subprocess.run(
        [sys.executable, "-m", "pytest", "-q", "-p", "tests.conftest", "-o", "addopts=", "-p", "no:cacheprovider",
         "--rootdir", str(tmp_path), str(tmp_path / "test_skips.py")],
        cwd=ROOT, capture_output=True, text=True, timeout=120, check=False,
    )  # fmt: skip
    assert done.returncode == 0, done.stdout + done.stderr
    lines = done.stdout.splitlines()
    at = lines.index("4 skipped: 3 need a GPU")
    assert lines[at + 1] == "  1 need SGLang"


def test_proxy_warns_when_an_engine_is_declared_without_its_url(monkeypatch: Any, caplog: Any) -> None:
    """``--engine llama.cpp`` without ``--upstream`` would send requests to Anthropic: the start says so."""
    import uvicorn

    from agentcache.proxy import load_proxy_config, serve

    monkeypatch.setattr(uvicorn.Server, "run", lambda self, sockets=None: None)
    with caplog.at_level("WARNING", logger="agentcache"):
        serve(load_proxy_config(engine="llama.cpp", port=0))
        serve(load_proxy_config(engine="llama.cpp", upstream="http://127.0.0.1:8080", port=0))
    warned = [r.getMessage() for r in caplog.records if "engine_without_upstream" in r.getMessage()]
    assert len(warned) == 1 and "llama.cpp" in warned[0] and "--upstream" in warned[0]


def test_proxy_on_port_zero_names_the_port_it_got_and_says_when_it_stopped() -> None:
    import re
    import signal
    import urllib.request

    proc = subprocess.Popen(
        [sys.executable, "-m", "agentcache", "proxy", "--port", "0", "--upstream", "http://127.0.0.1:9"],
        stderr=subprocess.PIPE,
        text=True,
    )
    try:
        assert proc.stderr is not None
        line = proc.stderr.readline()
        port = re.search(r"port=(\d+)", line)
        assert "proxy.start" in line and port is not None and int(port.group(1)) > 0, line
        with urllib.request.urlopen(f"http://127.0.0.1:{port.group(1)}/agentcache/v1/health", timeout=10) as r:
            assert r.status == 200
        proc.send_signal(signal.SIGINT)
        rest = proc.stderr.read()
        assert proc.wait(timeout=20) == 0
        assert "proxy.stopped" in rest and f"port={port.group(1)}" in rest and "Traceback" not in rest, rest
    finally:
        proc.kill()
