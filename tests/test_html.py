"""The HTML report is self-contained and draws its charts in a real headless Chromium."""

from __future__ import annotations

import re
import shutil
import subprocess
from pathlib import Path

import pytest

from agentcache import audit
from agentcache.analysis._html import render_html
from agentcache.loaders import load

from .conftest import CASES

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
]


@pytest.fixture(scope="module")
def page(tmp_path_factory: pytest.TempPathFactory) -> Path:
    report = audit(load(CASES / "k11-parallel-fanout-24-blocks.json").records, "anthropic", compare=True)
    path = tmp_path_factory.mktemp("html") / "report.html"
    path.write_text(render_html(report))
    return path


def test_page_is_self_contained(page: Path) -> None:
    text = page.read_text()
    # No network: no external scripts, styles or images.
    assert not re.search(r"""(src|href)\s*=\s*["']?(https?:)?//""", text)
    assert "lookback.exceeded" in text and "anthropic_auto" in text


@pytest.mark.skipif(CHROMIUM is None, reason="chromium not installed (.ci/run installs it)")
def test_charts_render_in_headless_chromium(page: Path, tmp_path: Path) -> None:
    assert CHROMIUM is not None
    cmd = [CHROMIUM, *FLAGS, f"--user-data-dir={tmp_path / 'profile'}", "--dump-dom", page.as_uri()]
    dom = subprocess.run(cmd, capture_output=True, text=True, timeout=120, check=True).stdout
    assert 'data-rendered="yes"' in dom  # the script ran to the end
    # Totals chart: 7 arms; per-turn charts: 7 panels x 3 turns, each a stack of read/write/uncached.
    assert dom.count('class="chart"') == 8
    rects = re.findall(r'<rect [^>]*width="([0-9.]+)"', dom)
    assert len(rects) >= 7 * 3 and all(float(w) > 0 for w in rects)
    assert re.search(r"<td>1</td><td>as_sent</td><td>lookback.exceeded</td>", dom)
    shot = tmp_path / "report.png"
    subprocess.run(
        [
            CHROMIUM,
            *FLAGS,
            f"--user-data-dir={tmp_path / 'p2'}",
            f"--screenshot={shot}",
            "--window-size=1200,1400",
            page.as_uri(),
        ],
        capture_output=True,
        timeout=120,
        check=True,
    )
    assert shot.stat().st_size > 20_000
