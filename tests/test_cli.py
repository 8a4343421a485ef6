"""The ``agentcache`` command line: ``audit`` on real recorded data, bad input, output formats, logging."""

from __future__ import annotations

import io
import json
import subprocess
import sys
from collections.abc import Iterator
from pathlib import Path
from typing import Any

import pytest
from rich.console import Console
from typer.testing import CliRunner, Result

from agentcache import ArmMetrics, AuditReport, BreakRecord, ConfigError, SessionReport, audit
from agentcache import _audit as audit_module
from agentcache import _cli as cli
from agentcache._cli_progress import progress_bar
from agentcache._log import get_logger
from agentcache._log_output import configure_logging, reset_logging
from agentcache.analysis._render import render_report
from agentcache.loaders import load
from agentcache.model import _rules

ROOT = Path(__file__).resolve().parent.parent
TAU = ROOT / "data" / "tau-bench" / "gpt-4o-airline.json"
K01 = ROOT / "tests" / "cases" / "k01-tools-reordered.json"

runner = CliRunner()


def invoke(*args: str | Path, env: dict[str, str] | None = None) -> Result:
    """Run the CLI in-process (exceptions are not swallowed, so a traceback fails the test)."""
    return runner.invoke(cli.app, [str(a) for a in args], env=env, catch_exceptions=False)


def error_lines(result: Result) -> list[str]:
    """stderr lines, without the once-per-run ``model.unknown`` warnings (tested on their own)."""
    return [ln for ln in result.stderr.splitlines() if ln.strip() and "model.unknown" not in ln]


@pytest.fixture(autouse=True)
def _fresh_logging() -> Iterator[None]:
    reset_logging()
    yield
    reset_logging()


@pytest.fixture(scope="module")
def tau_json() -> dict[str, Any]:
    _rules._warned.clear()  # named once per process: an earlier module may have named gpt-4o already
    result = runner.invoke(cli.app, ["audit", str(TAU), "--provider", "anthropic", "--json"], catch_exceptions=False)
    assert result.exit_code == 0, result.stderr
    # tau-bench's gpt-4o under Anthropic rules: named once, priced as the default model
    lines = result.stderr.splitlines()
    assert len(lines) == 1 and "model.unknown" in lines[0] and "model=gpt-4o" in lines[0], result.stderr
    assert "priced_as=claude-opus-4-8" in lines[0]
    doc: dict[str, Any] = json.loads(result.stdout)
    return doc


def k01_jsonl(tmp_path: Path, bad: dict[int, Any]) -> Path:
    """The k01 case as a JSONL log (one line per request), with line ``i`` replaced by ``bad[i]``."""
    case = json.loads(K01.read_text())
    api = case["api"]
    lines = [json.dumps({"session": "s", "api": api, "at": r["at"], "body": r["body"]}) for r in case["requests"]]
    lines += [json.dumps({"session": "t", "api": api, "at": 100.0, "body": case["requests"][0]["body"]})]
    for i, obj in bad.items():
        lines[i] = json.dumps(obj)
    path = tmp_path / "log.jsonl"
    path.write_text("\n".join(lines) + "\n")
    return path


# --- real data --------------------------------------------------------------------------------------


def test_tau_bench_json(tau_json: dict[str, Any]) -> None:
    assert set(tau_json) == {
        "provider",
        "model",
        "totals",
        "sessions",
        "breaks",
        "misses",
        "models",
        "provider_diagnostics",
    }
    assert tau_json["provider"] == "anthropic"
    # tau-bench recorded gpt-4o: under Anthropic rules it is unknown, priced as the documented default
    assert tau_json["models"] == [
        {"provider": "anthropic", "model": "gpt-4o", "known": False, "priced_as": "claude-opus-4-8", "requests": 2454}
    ]
    assert tau_json["provider_diagnostics"] == {"compared": 0, "agree": 0, "agreement": None, "misses": []}
    assert len(tau_json["sessions"]) == 200
    totals = tau_json["totals"]
    assert set(totals) == {"as_sent", "agentcache", "ideal"}
    assert totals["as_sent"]["requests"] == 2454
    assert totals["as_sent"]["hit_rate"] < 0.01
    assert totals["ideal"]["hit_rate"] > 0.9
    assert any(m["arm"] == "as_sent" and m["cause"] == "markers.missing" for m in tau_json["misses"])


def test_tau_bench_table() -> None:
    result = invoke("audit", TAU, "--provider", "anthropic")
    assert result.exit_code == 0, result.stderr
    out = result.stdout
    for word in ("as_sent", "agentcache", "ideal", "markers.missing", "200 sessions", "2,454 requests"):
        assert word in out
    assert "Top 10 sessions" in out


def test_case_tools_reordered_json() -> None:
    result = invoke("audit", K01, "--json")
    assert result.exit_code == 0, result.stderr
    doc = json.loads(result.stdout)
    assert doc["provider"] == "anthropic"  # inferred from the anthropic.messages records
    assert any(b["cause"] == "tools.reordered" and b["first_divergent"] == "tools[11]" for b in doc["breaks"])


def test_explicit_format_and_version() -> None:
    assert invoke("audit", K01, "--format", "case", "--json").exit_code == 0
    result = invoke("--version")
    assert result.exit_code == 0 and result.stdout.startswith("agentcache ")


def test_python_dash_m_prints_exactly_the_json_document() -> None:
    proc = subprocess.run(
        [sys.executable, "-m", "agentcache", "audit", str(K01), "--json"],
        capture_output=True,
        text=True,
        cwd=ROOT,
        timeout=120,
        check=False,
    )
    assert proc.returncode == 0, proc.stderr
    expected = audit(load(K01).records).to_dict()
    assert proc.stdout == json.dumps(expected, indent=2) + "\n"


# --- bad input --------------------------------------------------------------------------------------


def test_missing_file_is_reported_and_the_good_file_still_audited(tmp_path: Path) -> None:
    missing = tmp_path / "nope.json"
    result = invoke("audit", missing, K01, "--json")
    assert result.exit_code == 2
    lines = error_lines(result)
    assert len(lines) == 1
    assert lines[0].startswith("agentcache: error: ") and str(missing) in lines[0]
    doc = json.loads(result.stdout)
    assert doc["totals"]["as_sent"]["requests"] == 3
    assert any(b["cause"] == "tools.reordered" for b in doc["breaks"])


def test_missing_file_table_output_still_printed(tmp_path: Path) -> None:
    result = invoke("audit", tmp_path / "nope.json", K01)
    assert result.exit_code == 2
    assert "tools.reordered" in result.stdout


def test_unknown_format_file(tmp_path: Path) -> None:
    odd = tmp_path / "odd.json"
    odd.write_text('{"hello": "world"}')
    result = invoke("audit", odd, "--json")
    assert result.exit_code == 2
    lines = error_lines(result)
    assert len(lines) == 1 and str(odd) in lines[0]
    assert result.stdout == ""  # nothing could be loaded: no report


def test_jsonl_with_one_malformed_record(tmp_path: Path) -> None:
    """A bad record costs that record: one warning line for its file, the rest audited, exit 0 (issue 21 item 6:
    exit 2 only when nothing could be read)."""
    path = k01_jsonl(tmp_path, {2: {"session": "s", "api": "anthropic.messages", "body": "oops"}})
    result = invoke("audit", path, "--json")
    assert result.exit_code == 0
    lines = error_lines(result)
    assert len(lines) == 1
    assert lines[0].startswith(f"agentcache: warning: {path}: 1 of 4 records skipped (line 3:")
    assert "body" in lines[0] and lines[0].endswith("; --verbose lists them")
    doc = json.loads(result.stdout)
    assert doc["totals"]["as_sent"]["requests"] == 3


def test_malformed_body_found_by_the_audit(tmp_path: Path) -> None:
    """A record the loader accepts but the adapter rejects (no messages): reported, the rest audited."""
    path = k01_jsonl(tmp_path, {1: {"session": "s", "api": "anthropic.messages", "body": {"model": "x"}}})
    result = invoke("audit", path, "--json")
    assert result.exit_code == 0
    lines = error_lines(result)
    assert len(lines) == 1 and f"{path}: 1 of 4 records skipped (line 2:" in lines[0] and "messages" in lines[0]
    assert json.loads(result.stdout)["totals"]["as_sent"]["requests"] == 3


def test_record_errors_are_printed_in_record_order(tmp_path: Path) -> None:
    """The audit finds record 1's problem after loading found records 2 and 3's: one summary line for the file
    names the first; ``--verbose`` lists 1, 2, 3."""
    path = k01_jsonl(
        tmp_path,
        {
            1: {"session": "s", "api": "anthropic.messages", "body": {"model": "x"}},
            2: {"session": "s", "api": "anthropic.messages", "body": "oops"},
            3: {"session": "", "api": "anthropic.messages", "body": {}},
        },
    )
    result = invoke("audit", path, "--json")
    assert result.exit_code == 0
    lines = error_lines(result)
    assert len(lines) == 1 and f"{path}: 3 of 4 records skipped (line 2:" in lines[0]
    verbose = error_lines(invoke("audit", path, "--json", "--verbose"))
    assert verbose[0].endswith(")") and len(verbose) == 4
    assert [line.split("line ")[1].split(":")[0] for line in verbose[1:]] == ["2", "3", "4"]


def test_internal_failure_still_raises(monkeypatch: pytest.MonkeyPatch) -> None:
    """A failure no single record reproduces is agentcache's own bug: it is not disguised as bad input."""

    def broken(records: Any, **kw: Any) -> AuditReport:
        records = list(records)
        if len(records) > 1:
            raise RuntimeError("bug")
        return audit(records, **kw)

    monkeypatch.setattr(audit_module, "audit", broken)
    with pytest.raises(RuntimeError, match="bug"):
        invoke("audit", K01, "--json")


@pytest.mark.parametrize(
    "args",
    [
        ["--provider", "gemini"],
        ["--format", "yaml"],
    ],
)
def test_invalid_option_values(args: list[str]) -> None:
    # Choices are checked by typer itself: a usage error (exit 2) naming the bad value, no report.
    result = invoke("audit", K01, *args, "--json")
    assert result.exit_code == 2
    assert args[1] in result.stderr
    assert result.stdout == ""


def test_unknown_model_is_an_error() -> None:
    result = invoke("audit", K01, "--model", "no-such-model", "--json")
    assert result.exit_code == 2
    assert "unknown anthropic model 'no-such-model'" in result.stderr
    assert result.stdout == ""


def test_empty_file_among_good_ones(tmp_path: Path) -> None:
    empty = tmp_path / "empty.jsonl"
    empty.write_text("")
    result = invoke("audit", empty, K01, "--json")
    assert result.exit_code == 2
    assert json.loads(result.stdout)["totals"]["as_sent"]["requests"] == 3
    assert any(str(empty) in line for line in error_lines(result))


def test_invalid_log_level() -> None:
    result = invoke("--log-level", "loud", "audit", K01)
    assert result.exit_code == 2
    expected = "agentcache: error: invalid log level 'loud'; expected one of debug, info, warning, error, critical"
    assert error_lines(result) == [expected]


def test_only_bad_inputs(tmp_path: Path) -> None:
    empty = tmp_path / "empty.jsonl"
    empty.write_text("\n")
    result = invoke("audit", tmp_path / "a.json", tmp_path / "b.json", "--json")
    assert result.exit_code == 2 and len(error_lines(result)) == 2 and result.stdout == ""
    result = invoke("audit", empty, "--json")
    assert result.exit_code == 2 and "no records" in result.stderr and result.stdout == ""


# --- logging ----------------------------------------------------------------------------------------


def test_json_logs_go_to_stderr_only() -> None:
    env = {"AGENTCACHE_LOG_FORMAT": "json", "AGENTCACHE_LOG_LEVEL": "info"}
    result = invoke("audit", K01, "--json", env=env)
    assert result.exit_code == 0
    json.loads(result.stdout)
    events = [json.loads(ln) for ln in error_lines(result)]
    assert {"load.done", "audit.done"} <= {e["event"] for e in events}
    assert all(e["level"] == "info" and "timestamp" in e for e in events)


def test_configure_logging_is_idempotent(capsys: pytest.CaptureFixture[str]) -> None:
    configure_logging("json", "error")
    configure_logging("json", "error")
    log = get_logger("agentcache.test")
    log.warning("hidden")
    log.error("shown", n=1)
    out, err = capsys.readouterr()
    assert out == ""
    assert [json.loads(ln)["event"] for ln in err.splitlines()] == ["shown"]
    with pytest.raises(ConfigError):
        configure_logging("xml")


# --- rendering --------------------------------------------------------------------------------------


def test_render_lists_at_most_20_breaks() -> None:
    breaks = [BreakRecord("s", i, f"messages[{i}]", "messages.edited", 1000 + i, False) for i in range(25)]
    breaks.append(BreakRecord("s", 30, "tools[2]", "tools.reordered", 5, True))
    sess = SessionReport("s", 26)
    totals = {a: ArmMetrics() for a in ("as_sent", "agentcache", "ideal")}
    report = AuditReport("openai", "gpt-4o", totals, [sess], breaks, [])
    buf = io.StringIO()
    render_report(report, Console(file=buf, width=200))
    out = buf.getvalue()
    assert "6 more breaks not shown" in out
    assert "1,024" in out  # the largest break, with a thousands separator
    assert "messages.edited" in out and "tools.reordered" in out
    assert "No cache misses beyond the prefix breaks above." in out
    fixes = out[out.index("What to do") :].splitlines()[1:3]  # most tokens lost first
    assert [line.strip() for line in fixes] == [
        "messages.edited: send history exactly as it was sent",
        "tools.reordered: build the tool list in a fixed order (agentcache repairs it)",
    ]


def test_progress_only_on_a_terminal(monkeypatch: pytest.MonkeyPatch) -> None:
    with progress_bar(5000, "auditing") as progress:
        assert progress is None  # stderr is captured, not a terminal
    monkeypatch.setattr(sys.stderr, "isatty", lambda: True, raising=False)
    with progress_bar(100, "auditing") as progress:
        assert progress is None  # too few records
    with progress_bar(300, "auditing") as progress:
        assert progress is not None
        progress(150)


def test_audit_of_empty_agent_log_folders_says_so(tmp_path: Path) -> None:
    """``agentcache audit`` with no PATH, on a machine where Claude Code's folder exists but holds no session yet:
    it names the folder it found, and says that it holds no calls yet (and what to do), in one line, exit 2."""
    (tmp_path / ".claude" / "projects").mkdir(parents=True)
    env = {"HOME": str(tmp_path), "XDG_DATA_HOME": str(tmp_path / "data"), "CLAUDE_CONFIG_DIR": "", "CODEX_HOME": ""}
    done = runner.invoke(cli.app, ["audit"], env=env)
    assert done.exit_code == 2
    assert f"found Claude Code logs in {tmp_path / '.claude' / 'projects'}" in done.stderr
    errors = [line for line in done.stderr.splitlines() if line.startswith("agentcache: error:")]
    assert errors == [
        f"agentcache: error: the agents' log folders hold no calls yet ({tmp_path / '.claude' / 'projects'}): run "
        "your agent first, pass a PATH, or try `agentcache audit --sample` for a look"
    ]
