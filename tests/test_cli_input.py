"""Odd input on the command line (issue 12, kind 10): a record agentcache cannot read costs that record only,
as one line naming the file and the record, exit 2; ``proxy --config`` with a binary file is one line too; and
``replay`` exits 1 when any replayed request failed."""

from __future__ import annotations

import copy
import json
import subprocess
import sys
from pathlib import Path
from typing import Any

import httpx
import pytest

from agentcache import replay as replay_pkg
from tests.test_cli import K01, error_lines, invoke
from tests.test_replay import FakeEngine

CASE = json.loads(K01.read_text())


def _line(session: str, body: dict[str, Any]) -> str:
    return json.dumps({"session": session, "api": CASE["api"], "body": body})


def _odd_log(tmp_path: Path) -> Path:
    """Six records: 0, 4 and 5 fine; 1 holds a lone surrogate, 2 a tool whose ``name`` is an object, 3 is
    nested 5,000 deep."""
    good = [r["body"] for r in CASE["requests"]]
    surrogate = copy.deepcopy(good[1])
    surrogate["messages"][0]["content"] = "a\ud800b"  # json.dumps writes it as the escape \ud800
    tool = copy.deepcopy(good[1])
    tool["tools"][0]["name"] = {"x": 1}
    deep = '{"session": "s", "api": "anthropic.messages", "body": ' + "[" * 5000 + "]" * 5000 + "}"
    lines = [
        _line("s", good[0]),
        _line("s", surrogate),
        _line("s", tool),
        deep,
        _line("s", good[1]),
        _line("s", good[2]),
    ]
    assert "\\ud800" in lines[1]
    path = tmp_path / "odd.jsonl"
    path.write_text("\n".join(lines) + "\n")
    return path


def test_odd_records_cost_one_summary_line_and_the_rest_is_audited(tmp_path: Path) -> None:
    """Three odd records: one warning line for the file (the first named), exit 0; ``--verbose`` lists all three
    with their record numbers."""
    path = _odd_log(tmp_path)
    result = invoke("audit", path, "--json")
    assert result.exit_code == 0
    lines = error_lines(result)
    assert lines == [lines[0]] and lines[0].startswith(f"agentcache: warning: {path}: 3 of 6 records skipped (line 2:")
    assert "lone surrogate (\\ud800)" in lines[0]
    verbose = error_lines(invoke("audit", path, "--json", "--verbose"))[1:]
    assert [ln.split("line ")[1].split(":")[0] for ln in verbose] == ["2", "3", "4"]
    assert "TypeError" in verbose[1]  # agentcache could not read a tool named by an object
    assert "nested too deeply" in verbose[2]
    doc = json.loads(result.stdout)
    assert doc["totals"]["as_sent"]["requests"] == 3  # records 0, 4 and 5
    assert sum(m["requests"] for m in doc["models"]) == 3  # a rejected record names no model either
    assert "Traceback" not in result.stderr


def test_odd_records_through_the_installed_command(tmp_path: Path) -> None:
    """The same file through the console entry point (a real process): no traceback, one warning line, exit 0."""
    path = _odd_log(tmp_path)
    done = subprocess.run(
        [sys.executable, "-m", "agentcache", "audit", str(path), "--json"], capture_output=True, text=True, timeout=120
    )
    assert done.returncode == 0
    assert "Traceback" not in done.stderr
    assert len([ln for ln in done.stderr.splitlines() if ln.startswith("agentcache: warning: ")]) == 1
    assert json.loads(done.stdout)["totals"]["as_sent"]["requests"] == 3


def test_a_deep_whole_json_file_is_one_line(tmp_path: Path) -> None:
    path = tmp_path / "deep.json"
    path.write_text("[" * 5000 + "]" * 5000)
    result = invoke("audit", path)
    assert result.exit_code == 2
    lines = error_lines(result)
    assert len(lines) == 1 and str(path) in lines[0] and "nested too deeply" in lines[0]


def test_proxy_config_binary_file_is_one_line(tmp_path: Path) -> None:
    path = tmp_path / "agentcache.toml"
    path.write_bytes(bytes(range(256)))
    result = invoke("proxy", "--config", path)
    assert result.exit_code == 2
    lines = error_lines(result)
    assert len(lines) == 1 and f"cannot read config {path}: not a TOML text file" in lines[0]
    assert "codec" not in lines[0]


@pytest.mark.parametrize(("fail_on", "code"), [(None, 0), (2, 1)])
def test_replay_exits_1_when_any_request_failed(
    monkeypatch: pytest.MonkeyPatch, tmp_path: Path, fail_on: int | None, code: int
) -> None:
    engine = FakeEngine("llama.cpp", fail_on=fail_on)
    real = replay_pkg.replay

    def through_fake(records: Any, config: Any, **kw: Any) -> Any:
        return real(records, config, transport=httpx.MockTransport(engine), **kw)

    monkeypatch.setattr(replay_pkg, "replay", through_fake)
    result = invoke("replay", K01, "--endpoint", "http://fake", "--concurrency", "1", "--json")
    doc = json.loads(result.stdout)
    assert len(engine.requests) == 3
    assert doc["errors"] == (0 if fail_on is None else 1) and doc["completed"] == 3 - doc["errors"]
    assert result.exit_code == code


# ---- issue 24, item 8: input judged before it is read whole, each record bounded, --tools checked ----------------


def test_a_device_or_a_huge_file_is_judged_before_it_is_read(tmp_path: Path) -> None:
    huge = tmp_path / "results.json"
    with huge.open("wb") as f:  # a 1 GiB JSON document (sparse: no disk, and never read)
        f.write(b"[")
        f.truncate(1 << 30)
    result = invoke("audit", huge, "/dev/zero", "--json")
    assert result.exit_code == 2
    lines = [ln for ln in error_lines(result) if ln.startswith("agentcache: error: ")]
    assert f"agentcache: error: {huge}: larger than 256 MiB: too large to read as one JSON document" in lines[0]
    assert lines[1] == "agentcache: error: /dev/zero: unknown format: zero is neither JSON nor JSONL"


def test_a_line_over_the_record_bound_costs_itself_and_not_its_memory(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    import tracemalloc

    from agentcache.loaders import _agentlog, load

    monkeypatch.setattr(_agentlog, "MAX_LINE_BYTES", 1 << 20)
    good = [_line("s", r["body"]) for r in CASE["requests"]]
    path = tmp_path / "big.jsonl"
    with path.open("w") as f:
        f.write(good[0] + "\n")
        f.write('{"session": "s", "api": "anthropic.messages", "body": "' + "x" * (48 << 20) + '"}\n')
        f.write(good[1] + "\n")
    tracemalloc.start()
    try:
        loaded = load(path)
        peak = tracemalloc.get_traced_memory()[1]
    finally:
        tracemalloc.stop()
    assert len(loaded.records) == 2 and [e.record for e in loaded.errors] == [1]
    assert loaded.errors[0].reason == "line longer than 1 MiB: not read"
    assert peak < 16 << 20  # the 48 MiB line was never held (the format sniff reads at most 4 MiB of it)
    result = invoke("audit", path, "--json")
    assert result.exit_code == 0 and json.loads(result.stdout)["totals"]["as_sent"]["requests"] == 2


def test_tools_that_cannot_serve_are_reported_whatever_the_input(tmp_path: Path) -> None:
    log = tmp_path / "a.jsonl"
    log.write_text(_line("s", CASE["requests"][0]["body"]) + "\n")
    broken = tmp_path / "tools.json"
    broken.write_text("{not json")
    result = invoke("audit", log, "--tools", broken, "--json")
    assert result.exit_code == 2
    assert error_lines(result) == [f"agentcache: error: --tools: {broken}: invalid JSON: Expecting property name "
                                   "enclosed in double quotes: line 1 column 2 (char 1)"]  # fmt: skip
    broken.write_text('[{"type": "function", "function": {"name": "f"}}]')
    result = invoke("audit", log, "--tools", broken, "--json")
    assert result.exit_code == 0
    assert error_lines(result) == [
        f"agentcache: warning: --tools {broken}: only tau-bench results read tool schemas; no input was one"
    ]
