"""Process management of ``agentcache serve`` with a stub engine (``tests/fixtures/stub_engine.py``): a crash on
start, an engine that never becomes healthy, a crash mid-run, SIGTERM / Ctrl-C, and a child that ignores SIGTERM.

The CLI runs as a real subprocess (``python -m agentcache serve x.gguf --engine llama.cpp``) with
``AGENTCACHE_LLAMA_SERVER`` pointing at a wrapper around the stub, so the whole path is the product's own.
"""

from __future__ import annotations

import os
import signal
import socket
import subprocess
import sys
import time
from collections.abc import Iterator
from pathlib import Path

import pytest
from rich.console import Console

from agentcache.serve import ProcessSpec, ReadyCheck, ServePlan, Supervisor
from agentcache.serve._supervisor import is_ready
from tests import needs

STUB = Path(__file__).resolve().parent / "fixtures" / "stub_engine.py"
ROOT = Path(__file__).resolve().parent.parent


def free_port() -> int:
    with socket.socket() as sock:
        sock.bind(("127.0.0.1", 0))
        port: int = sock.getsockname()[1]
        return port


def alive(pid: int) -> bool:
    try:
        os.kill(pid, 0)
    except ProcessLookupError:
        return False
    return True


@pytest.fixture
def stub_env(tmp_path: Path) -> dict[str, str]:
    wrapper = tmp_path / "llama-server"
    wrapper.write_text(f'#!/bin/sh\nexec "{sys.executable}" "{STUB}" "$@"\n')
    wrapper.chmod(0o755)
    (tmp_path / "m.gguf").write_bytes(b"GGUF")
    env = {**os.environ, "AGENTCACHE_LLAMA_SERVER": str(wrapper), "STUB_ENGINE_RECORD": str(tmp_path / "record")}
    env["PYTHONPATH"] = str(ROOT) + os.pathsep + env.get("PYTHONPATH", "")
    return env


def serve(tmp_path: Path, env: dict[str, str], mode: str, port: int, *extra: str) -> subprocess.Popen[str]:
    argv = [sys.executable, "-m", "agentcache", "serve", str(tmp_path / "m.gguf"), "--engine", "llama.cpp",
            "--no-proxy", "--port", str(port), "--log-dir", str(tmp_path / "logs"), *extra]  # fmt: skip
    return subprocess.Popen(argv, env={**env, "STUB_ENGINE_MODE": mode}, stdout=subprocess.PIPE,
                            stderr=subprocess.PIPE, text=True)  # fmt: skip


def finish(proc: subprocess.Popen[str], timeout: float = 60) -> tuple[int, str]:
    try:
        _, err = proc.communicate(timeout=timeout)
    except subprocess.TimeoutExpired:
        proc.kill()
        _, err = proc.communicate()
        pytest.fail(f"serve did not exit in {timeout}s:\n{err}")
    return proc.returncode, err


def wait_ready(port: int, proc: subprocess.Popen[str], timeout: float = 60) -> None:
    deadline = time.monotonic() + timeout
    while time.monotonic() < deadline:
        if proc.poll() is not None:
            pytest.fail(f"serve exited early with {proc.returncode}: {proc.communicate()[1]}")
        if is_ready(ReadyCheck("http", "127.0.0.1", port)):
            return
        time.sleep(0.1)
    pytest.fail("stub engine never became ready")


def recorded(tmp_path: Path) -> list[str]:
    path = tmp_path / "record"
    return path.read_text().splitlines() if path.exists() else []


def test_crash_on_start_stops_with_its_exit_code_and_log(tmp_path: Path, stub_env: dict[str, str]) -> None:
    code, err = finish(serve(tmp_path, {**stub_env, "STUB_ENGINE_EXIT": "7"}, "crash-on-start", free_port()))
    assert code == 7, err
    assert "engine-0 exited with code 7 while starting" in err
    assert "fatal: cannot load model (simulated)" in err  # the child's last log lines


def test_never_healthy_times_out(tmp_path: Path, stub_env: dict[str, str]) -> None:
    code, err = finish(serve(tmp_path, stub_env, "never-healthy", free_port(), "--ready-timeout", "2"))
    assert code == 1, err
    assert "engine-0 not ready after 2s" in err
    pid = int(recorded(tmp_path)[0].split()[0])
    assert f"term {pid}" in recorded(tmp_path) and not alive(pid)


def test_crash_mid_run_stops_with_its_exit_code(tmp_path: Path, stub_env: dict[str, str]) -> None:
    env = {**stub_env, "STUB_ENGINE_SECONDS": "2", "STUB_ENGINE_EXIT": "139"}
    code, err = finish(serve(tmp_path, env, "crash-after", free_port()))
    assert code == 139, err
    assert "agentcache serve: ready" in err and err.index("ready") < err.index("exited with code 139")
    assert "segmentation fault (simulated)" in err


@pytest.mark.parametrize("sig", [signal.SIGTERM, signal.SIGINT])
def test_signal_stops_every_child(tmp_path: Path, stub_env: dict[str, str], sig: signal.Signals) -> None:
    port = free_port()
    proc = serve(tmp_path, stub_env, "ok", port, "--sessions", "3")
    wait_ready(port, proc)
    pid = int(recorded(tmp_path)[0].split()[0])
    assert "--parallel 3" in recorded(tmp_path)[0]
    proc.send_signal(sig)
    code, err = finish(proc)
    assert code == 0, err
    assert f"term {pid}" in recorded(tmp_path)
    assert not alive(pid) and not is_ready(ReadyCheck("tcp", "127.0.0.1", port))
    assert (tmp_path / "logs" / "engine-0.log").read_text().startswith("stub engine: mode ok")


def _spec(name: str, port: int, mode: str, stage: int, tmp_path: Path, **env: str) -> ProcessSpec:
    argv = (sys.executable, str(STUB), "--port", str(port))
    full_env = {"STUB_ENGINE_MODE": mode, "STUB_ENGINE_RECORD": str(tmp_path / "record"), **env}
    return ProcessSpec(name, "engine", argv, full_env, ReadyCheck("http", "127.0.0.1", port), stage)


@pytest.fixture
def quiet() -> Iterator[Console]:
    yield Console(stderr=True, force_terminal=False, width=200)


def test_a_crashing_child_stops_the_others(tmp_path: Path, quiet: Console) -> None:
    p1, p2 = free_port(), free_port()
    plan = ServePlan(
        "llama.cpp",
        (
            _spec("engine-0", p1, "ok", 1, tmp_path),
            _spec("proxy", p2, "crash-after", 2, tmp_path, STUB_ENGINE_EXIT="5"),
        ),
        f"http://127.0.0.1:{p2}",
        f"http://127.0.0.1:{p1}",
    )
    ready: list[str] = []
    supervisor = Supervisor(plan, tmp_path / "logs", console=quiet, poll=0.05)
    code = supervisor.run(on_ready=lambda p: ready.append(p.endpoint))
    assert code == 5 and ready == [plan.endpoint]
    assert supervisor.failure is not None and supervisor.failure.name == "proxy"
    engine_pid = supervisor.children[0].process.pid
    assert f"term {engine_pid}" in recorded(tmp_path) and not alive(engine_pid)


def test_a_child_ignoring_sigterm_is_killed(tmp_path: Path, quiet: Console) -> None:
    port = free_port()
    plan = ServePlan("llama.cpp", (_spec("engine-0", port, "ignore-term", 1, tmp_path),), "", "")
    supervisor = Supervisor(plan, tmp_path / "logs", console=quiet, poll=0.05, stop_timeout=1.0)
    supervisor.run(on_ready=lambda p: supervisor.request_stop())
    child = supervisor.children[0].process
    assert child.returncode == -signal.SIGKILL
    assert f"term {child.pid}" in recorded(tmp_path)


def test_a_missing_binary_is_exit_127(tmp_path: Path, quiet: Console) -> None:
    spec = ProcessSpec("router", "router", ("/nonexistent/smg", "--port", "1"), ready=ReadyCheck("tcp", "127.0.0.1", 1))
    supervisor = Supervisor(ServePlan("sglang", (spec,), "", ""), tmp_path / "logs", console=quiet)
    assert supervisor.run() == 127
    assert supervisor.failure is not None and "could not start" in supervisor.failure.reason


def test_the_proxy_runs_as_a_child_in_front_of_the_engine(tmp_path: Path, stub_env: dict[str, str]) -> None:
    from agentcache.serve._preflight import proxy_available

    if not proxy_available():
        pytest.skip(needs.extra("proxy"))
    port = free_port()
    proc = serve(tmp_path, stub_env, "ok", port, "--proxy")
    try:
        wait_ready(port, proc, timeout=120)  # GET /health on the proxy, passed through to the engine
        time.sleep(1.0)  # let the supervisor's own check see it too
    finally:
        proc.send_signal(signal.SIGTERM)
    code, err = finish(proc)
    assert code == 0, err
    engine_line = recorded(tmp_path)[0]
    assert f"--port {port + 1}" in engine_line  # the engine moved behind the proxy
    assert "proxy ready after" in err and "agentcache serve: ready" in err
    assert (tmp_path / "logs" / "proxy.log").exists()
