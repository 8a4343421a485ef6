"""The soak and the memory drive (issue 24) at CI size: the repository's own tools (``benchmarks/proxy_load.py``,
``benchmarks/memory_drive.py``), seeded, each against a real ``agentcache proxy`` process and a fake upstream
process; their full sizes are in benchmarks/README.md. Marked ``soak`` (about a minute each)."""

from __future__ import annotations

import json
import subprocess
import sys
from pathlib import Path

import pytest

BENCH = Path(__file__).resolve().parent.parent / "benchmarks"

pytestmark = pytest.mark.soak


def _run(script: str, tmp_path: Path, *args: str) -> dict[str, object]:
    out = tmp_path / "result.json"
    done = subprocess.run(
        [sys.executable, str(BENCH / script), *args, "--json", str(out)], capture_output=True, text=True, timeout=600
    )
    assert out.exists(), done.stdout + done.stderr
    doc: dict[str, object] = json.loads(out.read_text())
    checks = doc["checks"]
    assert isinstance(checks, dict)
    assert all(checks.values()), f"{[k for k, ok in checks.items() if not ok]}\n{done.stdout}"
    assert done.returncode == 0
    return doc


def test_soak_with_upstream_faults_and_idle_keep_alive_clients(tmp_path: Path) -> None:
    """5% upstream faults (500s, resets, stalls, cut streams) and clients idling 5-6 s on keep-alive connections:
    nothing lost, hung or dropped, every request counted once, every log line JSON."""
    doc = _run("proxy_load.py", tmp_path, "--streams", "16", "--idle-streams", "4", "--seconds", "20", "--seed", "7")
    client = doc["client"]
    assert isinstance(client, dict) and client.get("cut", 0) > 0 and client.get("ok", 0) > 300


def test_memory_drive_keeps_the_budget_and_the_sessions_that_take_turns(tmp_path: Path) -> None:
    """New sessions, prefixes, model names and 4 MiB model names past every share of a 32 MB budget: RSS stays within
    baseline + 1.5 × budget on a plateau, and two sessions taking turns keep generation 0."""
    doc = _run(
        "memory_drive.py", tmp_path, "--max-state-mb", "32", "--sessions", "2500", "--prefixes", "250",
        "--models", "100", "--huge", "5", "--every", "50", "--seed", "24",
    )  # fmt: skip
    generations = doc["generations"]
    assert isinstance(generations, list) and len(generations) >= 80
