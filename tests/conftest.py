"""Shared fixtures: real tau-bench bulk text (airline policy and tools) for synthetic sequences."""

from __future__ import annotations

import copy
import json
from collections import Counter
from collections.abc import Iterator
from pathlib import Path
from typing import Any

import pytest

from tests import needs

ROOT = Path(__file__).resolve().parent.parent
DATA = ROOT / "data"
CASES = Path(__file__).resolve().parent / "cases"


def _taubench() -> list[dict[str, Any]]:
    with open(DATA / "tau-bench" / "gpt-4o-airline.json") as f:
        runs: list[dict[str, Any]] = json.load(f)
    return runs


_RUNS = _taubench()
_TOOLS: list[dict[str, Any]] = json.loads((DATA / "tau-bench" / "airline_tools.json").read_text())


@pytest.fixture(scope="session")
def taubench_runs() -> list[dict[str, Any]]:
    """The 200 real tau-bench runs."""
    return _RUNS


def policy() -> str:
    """The airline policy (real system prompt of every tau-bench run)."""
    text: str = _RUNS[0]["traj"][0]["content"]
    return text


def openai_tools() -> list[dict[str, Any]]:
    """The 14 real airline tools in OpenAI function format (a deep copy)."""
    return copy.deepcopy(_TOOLS)


def anthropic_tools() -> list[dict[str, Any]]:
    """The same tools as Anthropic ``{name, description, input_schema}``."""
    return [
        {
            "name": t["function"]["name"],
            "description": t["function"]["description"],
            "input_schema": t["function"]["parameters"],
        }
        for t in openai_tools()
    ]


def real_turns(run: int = 0) -> list[dict[str, Any]]:
    """OpenAI chat messages of one real run, system message excluded."""
    msgs: list[dict[str, Any]] = copy.deepcopy(_RUNS[run]["traj"][1:])
    return msgs


def anthropic_messages(n: int, run: int = 0) -> list[dict[str, Any]]:
    """``n`` alternating Anthropic messages made from real tau-bench turn text (content blocks)."""
    texts = [m.get("content") or json.dumps(m.get("tool_calls")) for m in real_turns(run)]
    out = []
    for i in range(n):
        role = "user" if i % 2 == 0 else "assistant"
        out.append({"role": role, "content": [{"type": "text", "text": f"{texts[i % len(texts)]} (turn {i})"}]})
    return out


def skip_reasons(reports: list[Any]) -> list[tuple[int, str]]:
    """``(count, reason)`` per missing component (:mod:`tests.needs`) or other distinct skip reason of ``reports``
    (pytest's skipped test reports), most first."""
    counts: Counter[str] = Counter()
    for report in reports:
        longrepr = report.longrepr
        reason = longrepr[2] if isinstance(longrepr, tuple) and len(longrepr) == 3 else str(longrepr)
        counts[needs.component(str(reason).removeprefix("Skipped: ").strip()) or "no reason given"] += 1
    return sorted(((n, r) for r, n in counts.items()), key=lambda nr: (-nr[0], nr[1]))


def pytest_terminal_summary(terminalreporter: Any, exitstatus: int, config: pytest.Config) -> None:
    """Why tests were skipped, grouped by missing component (``149 skipped: 119 needs SGLang ...``), even under
    ``-q``: a bare count hides whether a skip is an expected missing component (tests/README.md) or a fixture that
    should have been there."""
    reports = [r for r in terminalreporter.stats.get("skipped", []) if getattr(r, "when", "") != "teardown"]
    if not reports:
        return
    grouped = skip_reasons(reports)
    terminalreporter.write_line(f"{len(reports)} skipped: " + "; ".join(f"{n} {r}" for n, r in grouped[:1]))
    for n, reason in grouped[1:]:
        terminalreporter.write_line(f"  {n} {reason}")


@pytest.fixture(autouse=True)
def _no_remembered_engines() -> Iterator[None]:
    """Forget the engines ``probe`` remembered per origin: the OS reuses a closed fake upstream's port, and a test
    must not read another test's answer for it."""
    from agentcache.targets._detect import forget

    forget()
    yield


@pytest.fixture(autouse=True)
def _no_leftover_logging() -> Iterator[None]:
    """Undo any ``configure_logging`` a test's CLI run did (``proxy``/``serve`` log at info): a handler left at
    info would make later tests' session events pile up in pytest's log capture."""
    yield
    from agentcache._log_output import reset_logging

    reset_logging()
