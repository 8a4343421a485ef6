"""``agentcache serve`` pre-flight for the proxy in front (its ``proxy`` extra), and how a child's end is worded."""

from __future__ import annotations

import importlib.util
import re
import signal
from pathlib import Path
from typing import Any

import pytest
from typer.testing import CliRunner

from agentcache import _cli as cli
from agentcache.serve import EXIT_PREFLIGHT, Failure, Machine, ServeOptions, Toolchain, _preflight, build_plan, check
from agentcache.serve._supervisor import exit_reason


def never_busy(host: str, port: int) -> bool:
    return False


def test_proxy_missing_lists_the_extras_modules(monkeypatch: pytest.MonkeyPatch) -> None:
    assert _preflight.proxy_missing() == ()  # the dev environment has the extra
    real = importlib.util.find_spec

    def without(name: str, *args: Any) -> Any:
        return None if name in ("starlette", "prometheus_client") else real(name, *args)

    monkeypatch.setattr(importlib.util, "find_spec", without)
    assert _preflight.proxy_missing() == ("starlette", "prometheus_client")
    assert not _preflight.proxy_available()


def test_missing_proxy_extra_is_a_preflight_problem(tmp_path: Path) -> None:
    model = tmp_path / "m.gguf"
    model.write_bytes(b"GGUF")
    machine = Machine(llama_server="/opt/llama-server", proxy=False, proxy_missing=("starlette", "uvicorn"))
    options = ServeOptions(str(model))
    problems = check(options, build_plan(options, Toolchain(llama_server="/opt/llama-server", proxy=False)),
                     machine, never_busy)  # fmt: skip
    assert len(problems) == 1
    assert problems[0].what.endswith("needs the 'proxy' extra: starlette, uvicorn not installed")
    assert re.match(r"pip install (-e '.+\[proxy\]'|'agentcache\[proxy\]')", problems[0].fix)
    assert "--no-proxy" in problems[0].fix
    no_proxy = ServeOptions(str(model), proxy=False)
    plan = build_plan(no_proxy, Toolchain(llama_server="/opt/llama-server", proxy=False))
    assert check(no_proxy, plan, machine, never_busy) == []


def _no_extra(monkeypatch: pytest.MonkeyPatch) -> None:
    monkeypatch.setattr(_preflight, "proxy_missing", lambda: ("uvicorn",))
    monkeypatch.setattr(_preflight, "find_llama_server", lambda: Path("/opt/llama-server"))
    monkeypatch.setattr(_preflight, "port_in_use", lambda host, port: False)

    def refuse(*args: Any, **kwargs: Any) -> None:
        raise AssertionError("a process was started")

    monkeypatch.setattr("agentcache.serve.Supervisor", refuse)


def test_serve_stops_before_starting_anything_without_the_extra(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    _no_extra(monkeypatch)
    model = tmp_path / "m.gguf"
    model.write_bytes(b"GGUF")
    result = CliRunner().invoke(cli.app, ["serve", str(model)], catch_exceptions=False)
    assert result.exit_code == EXIT_PREFLIGHT
    assert "agentcache: error: the agentcache proxy in front (--proxy, the default) needs the 'proxy' extra: " \
        "uvicorn not installed" in result.stderr  # fmt: skip
    assert "fix: pip install" in result.stderr


def test_dry_run_warns_about_the_missing_extra(tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> None:
    _no_extra(monkeypatch)
    model = tmp_path / "m.gguf"
    model.write_bytes(b"GGUF")
    result = CliRunner().invoke(cli.app, ["serve", str(model), "--dry-run"], catch_exceptions=False)
    assert result.exit_code == 0
    warning = next(ln for ln in result.stderr.splitlines() if ln.startswith("# warning:"))
    assert "'proxy' extra: uvicorn not installed" in warning and "--no-proxy" in warning
    assert "llama-server" in result.stdout


def test_exit_reason_wording() -> None:
    assert exit_reason(-signal.SIGKILL) == "was killed by signal 9 (SIGKILL)"
    assert exit_reason(-signal.SIGTERM, "while starting") == "was killed by signal 15 (SIGTERM) while starting"
    assert exit_reason(3) == "exited with code 3"
    assert exit_reason(-200) == "was killed by signal 200"
    failure = Failure("engine-0", exit_reason(-9), 137, Path("/tmp/engine-0.log"), "")
    assert str(failure) == "engine-0 was killed by signal 9 (SIGKILL); last lines of /tmp/engine-0.log: (empty)"
