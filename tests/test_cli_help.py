"""The command line as a newcomer meets it (issue 15): switches that read as switches, one spelling per engine
with the choices in the help, one-line setting errors, log defaults that match the help, install hints."""

from __future__ import annotations

import json
import re
import socket
import subprocess
import sys
from collections.abc import Iterator
from pathlib import Path
from typing import Any

import pytest
import typer
from typer.testing import CliRunner, Result

from agentcache import ConfigError, _install
from agentcache import _cli as cli
from agentcache._config import Settings, load_settings
from agentcache._log import get_logger
from agentcache._log_output import reset_logging
from agentcache.model import _rules
from agentcache.model._types import Engine, parse_engine
from agentcache.proxy._config import ProxyConfig, load_proxy_config
from agentcache.serve import ServeOptions

ROOT = Path(__file__).resolve().parent.parent
K01 = ROOT / "tests" / "cases" / "k01-tools-reordered.json"
ANSI = re.compile(r"\x1b\[[0-9;]*m")
runner = CliRunner()


def invoke(*args: str | Path, env: dict[str, str] | None = None) -> Result:
    return runner.invoke(cli.app, [str(a) for a in args], env=env, catch_exceptions=False)


@pytest.fixture(autouse=True)
def _fresh_logging() -> Iterator[None]:
    reset_logging()
    yield
    reset_logging()


def _help(*command: str) -> str:
    result = runner.invoke(cli.app, [*command, "--help"], env={"COLUMNS": "200", "NO_COLOR": "1"})
    assert result.exit_code == 0, result.output
    return ANSI.sub("", result.stdout)


def _commands() -> list[tuple[str, ...]]:
    group = typer.main.get_command(cli.app)
    assert isinstance(group, typer.core.TyperGroup)
    return [(), *((name,) for name in group.commands)]


def _flags(command: tuple[str, ...]) -> list[str]:
    """The long names of every boolean flag of ``command`` (root: ``()``), ``--help`` included."""
    group = typer.main.get_command(cli.app)
    cmd = group.commands[command[0]] if command else group  # type: ignore[attr-defined]
    ctx = cmd.make_context(command[0] if command else "agentcache", ["--help"], resilient_parsing=True)
    names = [o for p in cmd.get_params(ctx) if getattr(p, "is_flag", False) for o in [*p.opts, *p.secondary_opts]]
    return [n for n in names if n.startswith("--")]


# --- item 1: switches ------------------------------------------------------------------------------


def test_every_commands_help_shows_switches_without_a_value() -> None:
    commands = _commands()
    assert {c[0] for c in commands if c} >= {"audit", "proxy", "serve", "replay"}
    for command in commands:
        text = _help(*command)
        assert "<bool>" not in text, (command, text)
        flags = _flags(command)
        assert "--help" in flags
        for flag in flags:
            # the flag's row: its names, then the help text; never a value type such as <bool> or BOOLEAN
            row = next(ln for ln in text.splitlines() if re.search(rf"{re.escape(flag)}(\s|$)", ln))
            after = row.split(flag, 1)[1]
            assert not re.match(r"\s*(<|[A-Z]{4,}\b)", after), (command, flag, row)
    assert "--json" in _flags(("audit",)) and "--no-proxy" in _flags(("serve",))


def test_a_value_given_to_a_switch_is_explained() -> None:
    result = invoke("audit", "--json", "true", K01)
    assert result.exit_code == 2
    assert "agentcache: error: true: no such file; switches take no value (write --json, not --json true)" in (
        result.stderr
    )
    assert json.loads(result.stdout)["totals"]  # the real file is still audited


# --- item 2: engine names and setting errors --------------------------------------------------------


@pytest.mark.parametrize(("alias", "canonical"), [("llama", "llama.cpp"), ("LLaMA.cpp", "llama.cpp"),
                                                  ("llamacpp", "llama.cpp"), ("llama-cpp", "llama.cpp"),
                                                  ("llama_cpp", "llama.cpp"), (" sglang ", "sglang")])  # fmt: skip
def test_engine_aliases_everywhere(alias: str, canonical: str, monkeypatch: pytest.MonkeyPatch) -> None:
    assert parse_engine(alias).value == canonical
    assert ServeOptions("m", engine=alias).resolved_engine == canonical
    assert load_proxy_config(engine=alias).engine == canonical
    assert load_settings(target=alias).target == canonical
    monkeypatch.setenv("AGENTCACHE_PROXY_ENGINE", alias)
    assert load_proxy_config().engine == canonical
    monkeypatch.setenv("AGENTCACHE_TARGET", alias)
    assert Settings().target == canonical


def test_engine_choices_in_help_and_one_line_errors(tmp_path: Path) -> None:
    assert "[none|sglang|llama.cpp|vllm|other]" in _help("proxy")
    assert "[auto|sglang|llama.cpp]" in _help("serve")
    assert "[auto|sglang|llama.cpp|other]" in _help("replay")
    model = tmp_path / "m.gguf"
    model.write_bytes(b"GGUF")
    for args in (["proxy", "--engine", "bogus"], ["serve", str(model), "--engine", "vllm", "--dry-run"]):
        result = invoke(*args)
        assert result.exit_code == 2
        lines = result.stderr.strip().splitlines()
        assert len(lines) == 1 and lines[0].startswith("agentcache: error: --engine "), result.stderr
        assert "aliases: llama, llamacpp, llama-cpp, llama_cpp" in lines[0]
    dry = invoke("serve", str(model), "--engine", "llama", "--dry-run", "--no-proxy")
    assert dry.exit_code == 0 and "llama-server" in dry.stdout


def _one_error(result: Result) -> str:
    assert result.exit_code == 2, result.output
    lines = result.stderr.strip().splitlines()
    assert len(lines) == 1 and lines[0].startswith("agentcache: error: "), result.stderr
    assert "pydantic" not in lines[0] and "validation error" not in lines[0] and "[type=" not in lines[0]
    return lines[0]


def test_setting_errors_are_one_line_naming_the_source(tmp_path: Path) -> None:
    line = _one_error(invoke("proxy", "--upstream", "ftp://x", "--engine", "llama.cpp"))
    assert "invalid setting upstream='ftp://x' (--upstream)" in line and "http(s) URL" in line
    line = _one_error(invoke("proxy", env={"AGENTCACHE_PROXY_PORT": "eighty"}))
    assert "invalid setting port='eighty' (AGENTCACHE_PROXY_PORT)" in line and "valid integer" in line
    config = tmp_path / "agentcache.toml"
    config.write_text('ttl_policy = "2h"\n[proxy]\nport = "abc"\n')
    line = _one_error(invoke("proxy", "--config", config))
    assert f"(ttl_policy in {config})" in line and "'auto', '5m' or '1h'" in line
    config.write_text('[proxy]\nport = "abc"\n')
    line = _one_error(invoke("proxy", "--config", config))
    assert f"invalid setting port='abc' (port in [proxy] of {config})" in line
    line = _one_error(invoke("proxy", env={"AGENTCACHE_TARGET": "gemini"}))
    assert "invalid setting target='gemini' (AGENTCACHE_TARGET)" in line and "auto, anthropic, openai" in line


def test_library_settings_raise_config_error(monkeypatch: pytest.MonkeyPatch) -> None:
    with pytest.raises(ConfigError, match=r"^invalid setting ttl_policy='9' \(AGENTCACHE_TTL_POLICY or argument"):
        Settings(ttl_policy="9")
    with pytest.raises(ValueError, match="invalid setting upstream='ftp://x'"):  # still a ValueError
        ProxyConfig(upstream="ftp://x")
    monkeypatch.setenv("AGENTCACHE_OPENAI_RPM_PER_KEY", "-1")
    with pytest.raises(ConfigError) as caught:
        Settings()
    assert "openai_rpm_per_key='-1'" in str(caught.value) and "errors.pydantic.dev" not in str(caught.value)


def test_port_in_use_is_one_line_before_start(monkeypatch: pytest.MonkeyPatch) -> None:
    started: list[Any] = []
    monkeypatch.setattr("agentcache.proxy.serve", lambda *a: started.append(a))
    with socket.socket() as busy:
        busy.bind(("127.0.0.1", 0))
        busy.listen()
        port = busy.getsockname()[1]
        line = _one_error(invoke("proxy", "--port", str(port)))
    assert f"port {port} on 127.0.0.1 is already in use" in line and "--port" in line
    assert started == []


# --- item 3: proxy log defaults ---------------------------------------------------------------------


def _proxy_logs(monkeypatch: pytest.MonkeyPatch, *root_args: str) -> list[str]:
    """stderr of ``agentcache [root_args] proxy`` with a stand-in server that logs one info and one debug line."""

    def fake_serve(config: Any, settings: Any = None) -> None:
        get_logger("agentcache.proxy").info("proxy.start", port=config.port)
        get_logger("agentcache.proxy").debug("proxy.detail")

    monkeypatch.setattr("agentcache.proxy.serve", fake_serve)
    monkeypatch.delenv("AGENTCACHE_LOG_FORMAT", raising=False)
    monkeypatch.delenv("AGENTCACHE_LOG_LEVEL", raising=False)
    result = invoke(*root_args, "proxy", "--port", "0")
    assert result.exit_code == 0, result.output
    return [ln for ln in result.stderr.splitlines() if ln.strip()]


def _is_json(line: str) -> bool:
    try:
        return isinstance(json.loads(line), dict)
    except ValueError:
        return False


def test_proxy_logs_console_at_info_by_default(monkeypatch: pytest.MonkeyPatch) -> None:
    lines = _proxy_logs(monkeypatch)
    assert len(lines) == 1 and "proxy.start" in lines[0] and "info" in lines[0] and not _is_json(lines[0])
    root_help = _help()
    assert "console (default" in root_help and "info for proxy and serve" in root_help


@pytest.mark.parametrize(
    ("args", "events", "as_json"),
    [
        (("--log-format", "console"), ["proxy.start"], False),  # the format alone keeps the info level
        (("--log-format", "json"), ["proxy.start"], True),
        (("--log-level", "debug"), ["proxy.start", "proxy.detail"], False),  # the level alone keeps console
        (("--log-level", "warning"), [], False),
        (("--log-format", "json", "--log-level", "debug"), ["proxy.start", "proxy.detail"], True),
    ],
)
def test_log_format_and_level_are_independent(
    monkeypatch: pytest.MonkeyPatch, args: tuple[str, ...], events: list[str], as_json: bool
) -> None:
    lines = _proxy_logs(monkeypatch, *args)
    assert [next(e for e in ("proxy.start", "proxy.detail") if e in ln) for ln in lines] == events
    assert all(_is_json(ln) == as_json for ln in lines)
    if as_json:
        assert [json.loads(ln)["event"] for ln in lines] == events


def test_analyses_stay_quiet_at_info() -> None:
    result = invoke("audit", K01, "--json")
    assert result.exit_code == 0 and "audit.done" not in result.stderr
    result = invoke("--log-format", "json", "audit", K01, "--json")
    assert "audit.done" not in result.stderr  # the format alone does not lower audit's warning level


# --- item 4: install hints --------------------------------------------------------------------------


def test_install_hint_for_a_clone_pypi_or_unknown(monkeypatch: pytest.MonkeyPatch) -> None:
    assert _install.install_hint("proxy") == f"pip install -e '{ROOT}[proxy]'"  # this checkout is editable
    monkeypatch.setattr(_install, "_editable_source", lambda: "")
    assert _install.install_hint("proxy") == "pip install 'agentcache[proxy]'"
    monkeypatch.setattr(_install, "_editable_source", lambda: None)
    assert _install.install_hint("sdk") == "pip install 'agentcache[sdk]' (from a clone: pip install -e '.[sdk]')"


@pytest.mark.parametrize(("example", "sdk"), [("anthropic_agent.py", "anthropic"), ("openai_agent.py", "openai"),
                                              ("llamacpp_agent.py", "openai")])  # fmt: skip
def test_examples_name_a_missing_sdk(tmp_path: Path, example: str, sdk: str) -> None:
    blocked = tmp_path / sdk
    blocked.mkdir()
    (blocked / "__init__.py").write_text("raise ImportError('not installed (test)')\n")
    done = subprocess.run(
        [sys.executable, str(ROOT / "examples" / example)],
        env={"PYTHONPATH": str(tmp_path), "PATH": "/usr/bin:/bin"},
        capture_output=True, text=True, timeout=60, check=False,
    )  # fmt: skip
    assert done.returncode == 1
    assert done.stderr.strip() == (
        f"{example}: this example needs the {sdk} SDK: pip install 'agentcache[sdk]' "
        "(from a clone: pip install -e '.[sdk]')"
    )


def test_engine_enum_values_are_the_canonical_spellings() -> None:
    assert [e.value for e in Engine] == ["sglang", "llama.cpp", "vllm", "other"]


# --- leftovers: usage errors, the unknown model --------------------------------------------------


@pytest.mark.parametrize(
    ("args", "first"),
    [
        (["audit", K01, "--provider", "gemini"], "Invalid value for '--provider': 'gemini' is not one of"),
        (["proxy", "--bogus"], "No such option: --bogus"),
        (["nonsense"], "No such command 'nonsense'."),
        (["audit", "--since", "yesterday"], "Invalid value for '--since': 'yesterday': expected a date"),
    ],
)
def test_usage_errors_start_with_one_error_line(args: list[str | Path], first: str) -> None:
    result = invoke(*args)
    assert result.exit_code == 2
    lines = result.stderr.splitlines()
    assert lines[0].startswith(f"agentcache: error: {first}"), result.stderr
    assert lines[1].startswith("Try 'agentcache") and lines[1].endswith(" --help' for help.")
    assert len(lines) == 2 and result.stdout == ""


def test_unknown_model_is_named_once_in_the_table() -> None:
    tau = ROOT / "data" / "tau-bench" / "gpt-4o-airline.json"
    _rules._warned.clear()  # the model.unknown warning is once per process: start and end with a fresh memo
    try:
        result = invoke("audit", tau, "--provider", "anthropic")
    finally:
        _rules._warned.clear()
    assert result.exit_code == 0
    assert "model.unknown" not in result.stderr
    assert result.stdout.count("gpt-4o (") == 1 and "unknown anthropic model gpt-4o" in result.stdout
