"""Progress on a terminal for the commands that can run long (issue 22): one helper (``agentcache._cli_progress``)
for ``audit``, ``plan`` and ``replay`` (off a terminal: tests/test_cli.py); ``plan`` reports rendered records then
simulated configurations, ``replay`` each finished request."""

from __future__ import annotations

import io
import json
import sys
from collections.abc import Iterator
from contextlib import contextmanager
from typing import Any

import httpx
import pytest

from agentcache import replay as replay_pkg
from agentcache._cli_progress import progress_bar
from agentcache.loaders import load
from agentcache.plan import BlockRenderer, plan
from agentcache.plan._flags import options_from_flags
from tests.test_cli import K01, invoke
from tests.test_replay import FakeEngine

PLAN_FLAGS: dict[str, Any] = dict(
    l1="4k,8k", l2="0,2x", l3="0", eviction="lru,session", page_size=64, kv_bytes_per_token=None,
    model_config=None, rate=1.0, concurrency=4, idle_timeout=3600.0, close_at_end=True, prefill_tps=None,
    l2_gbps=20.0, l3_gbps=2.0, model="MODEL",
)  # fmt: skip


def _terminal(monkeypatch: pytest.MonkeyPatch) -> io.StringIO:
    """Make stderr a terminal that writes into the returned buffer."""
    out = io.StringIO()
    out.isatty = lambda: True  # type: ignore[method-assign]
    monkeypatch.setattr(sys, "stderr", out)
    return out


def test_the_bar_shows_its_label_and_counts(monkeypatch: pytest.MonkeyPatch) -> None:
    out = _terminal(monkeypatch)
    with progress_bar(300, "planning") as advance:
        assert advance is not None
        advance(150)
        advance(320, 400)  # a run that learns its total late
    text = out.getvalue()
    assert "planning" in text and "320/400" in text


def test_plan_reports_records_then_configurations() -> None:
    records = load(K01).records
    calls: list[tuple[int, int]] = []
    report = plan(
        records, options_from_flags(**PLAN_FLAGS), BlockRenderer(), progress=lambda d, t: calls.append((d, t))
    )
    n, configs = len(records), len(report.configs)
    assert configs == 2 * 2 * 2  # two L1 sizes, two L2 sizes, two evictions
    assert calls[:n] == [(i, n) for i in range(1, n + 1)]
    assert calls[n:] == [(n + i, n + configs) for i in range(1, configs + 1)]


def test_plan_and_replay_commands_report_progress(monkeypatch: pytest.MonkeyPatch) -> None:
    bars: dict[str, tuple[int, list[int]]] = {}

    @contextmanager
    def recording(total: int, label: str, **kw: Any) -> Iterator[Any]:
        bars[label] = (total, [])
        yield lambda done, total=None: bars[label][1].append(done)

    monkeypatch.setattr("agentcache._cli_replay.progress_bar", recording)
    engine = FakeEngine("llama.cpp")
    real_replay = replay_pkg.replay
    monkeypatch.setattr(
        replay_pkg, "replay", lambda r, c, **kw: real_replay(r, c, transport=httpx.MockTransport(engine), **kw)
    )
    result = invoke("plan", K01, "--l1-tokens", "4k", "--json")
    assert result.exit_code == 0 and json.loads(result.stdout)["requests"] == 3
    configs = len(json.loads(result.stdout)["configs"])
    result = invoke("replay", K01, "--endpoint", "http://fake", "--concurrency", "1", "--json")
    assert result.exit_code == 0 and json.loads(result.stdout)["completed"] == 3
    assert bars["planning"] == (3, [1, 2, 3, *range(4, 4 + configs)])
    assert bars["replaying"] == (3, [1, 2, 3])
