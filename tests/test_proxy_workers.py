"""``agentcache proxy --workers N`` (issue 26): several processes on one port, sessions shared through Redis.

A real proxy with two workers in front of a real upstream: one session's turns, each on a new connection (so the
kernel spreads them over the workers), are numbered as one session's; a stream in flight when SIGTERM comes is
finished, then the proxy says ``proxy.stopped`` and exits 0. Without Redis, more than one worker is refused.
``/metrics`` is every worker's (prometheus_client's multiprocess mode); one worker keeps its own registry.
"""

from __future__ import annotations

import json
import os
import shutil
import signal
import socket
import stat
import subprocess
import sys
import time
import urllib.request
from concurrent.futures import ThreadPoolExecutor
from pathlib import Path
from typing import Any

import pytest
from prometheus_client import CollectorRegistry
from prometheus_client.multiprocess import MultiProcessCollector
from prometheus_client.parser import text_string_to_metric_families
from prometheus_client.samples import Sample
from starlette.applications import Starlette
from starlette.requests import Request
from starlette.responses import JSONResponse
from starlette.routing import Route

from agentcache._exceptions import ConfigError
from agentcache.proxy import load_proxy_config
from agentcache.proxy._app import create_app
from agentcache.proxy._config import ProxyConfig
from agentcache.proxy._multiproc import MULTIPROC_ENV, shared_metrics_dir, worker_metrics_dir
from tests.test_proxy_redis import redis_url  # noqa: F401  # the module's redis-server fixture
from tests.test_proxy_stop import CHUNKS, _slow_upstream, signal_mid_stream
from tests.test_proxy_support import ServerThread


def test_the_server_runs_on_httptools_and_uvloop() -> None:
    """The proxy extra's ``uvicorn[standard]`` brings uvicorn's C parser and loop; benchmarks/proxy_layers.py measured
    its pure-Python parser (h11) adding ~0.3 ms a request."""
    from uvicorn.protocols.http.httptools_impl import HttpToolsProtocol
    from uvloop import Loop

    from agentcache.proxy._config import ProxyConfig
    from agentcache.proxy._server import uvicorn_config

    config = uvicorn_config(_upstream(), ProxyConfig(port=0))
    config.load()
    assert issubclass(config.http_protocol_class, HttpToolsProtocol)
    factory = config.get_loop_factory()
    assert factory is not None
    loop = factory()
    try:
        assert isinstance(loop, Loop)
    finally:
        loop.close()


def test_more_than_one_worker_shares_a_redis(monkeypatch: pytest.MonkeyPatch) -> None:
    """Several workers share the configured Redis, else a private one; without redis-server the proxy says so."""
    from agentcache.proxy._workers import with_store

    assert load_proxy_config().workers == 1
    given = load_proxy_config(workers=2, redis_url="redis://127.0.0.1:1")
    with with_store(given) as config:
        assert config is given
    monkeypatch.setattr(shutil, "which", lambda name: None)
    with pytest.raises(ConfigError, match="install redis-server"), with_store(load_proxy_config(workers=2)):
        pass


def _upstream() -> Starlette:
    """The slow stream of tests/test_proxy_stop.py, plus ``/v1/messages`` answering every request at once."""

    async def messages(request: Request) -> JSONResponse:
        usage = {"input_tokens": 5, "output_tokens": 1}
        return JSONResponse({"type": "message", "role": "assistant", "content": [], "usage": usage})

    return Starlette(routes=[*_slow_upstream().routes, Route("/v1/messages", messages, methods=["POST"])])


def _post(port: int, session: str) -> dict[str, str]:
    body = json.dumps({"model": "claude-opus-4-8", "max_tokens": 5, "messages": [{"role": "user", "content": "hi"}]})
    req = urllib.request.Request(
        f"http://127.0.0.1:{port}/v1/messages",
        data=body.encode(),
        headers={"content-type": "application/json", "x-api-key": "sk-test", "x-agentcache-session": session},
    )
    with urllib.request.urlopen(req, timeout=30) as r:  # a new connection each time
        r.read()
        return dict(r.headers)


def _events(text: str) -> list[dict[str, Any]]:
    return [json.loads(line) for line in text.splitlines() if line.startswith("{")]


def test_two_workers_share_sessions_and_drain_on_sigterm(redis_url: str) -> None:  # noqa: F811
    with ServerThread(_upstream()) as upstream:
        argv = [sys.executable, "-m", "agentcache", "--log-format", "json", "proxy", "--port", "0", "--workers", "2"]
        proc = subprocess.Popen(
            [*argv, "--upstream", upstream.url, "--redis-url", redis_url], stderr=subprocess.PIPE, text=True
        )
        try:
            assert proc.stderr is not None
            start = json.loads(proc.stderr.readline())
            assert start["event"] == "proxy.start" and start["workers"] == 2
            port = start["port"]
            for _ in range(6):
                _post(port, "shared-1")
            received, rest, code = signal_mid_stream(proc, port, signal.SIGTERM)
        finally:
            proc.kill()
    assert code == 0, rest
    assert [line for line in received if line.startswith(b"data: ")] == [
        f"data: chunk {i}\n".encode() for i in range(CHUNKS)
    ]
    events = _events(rest)
    turns = sorted(
        e["session_signal"]["turn"]
        for e in events
        if e["event"] == "proxy.request" and (e.get("session_signal") or {}).get("session_id") == "shared-1"
    )
    assert turns == list(range(6)), rest  # one session, whichever worker served each turn
    assert events[-1]["event"] == "proxy.stopped", rest
    assert "Traceback" not in rest


def test_workers_exit_when_their_supervisor_is_killed(redis_url: str) -> None:  # noqa: F811
    """SIGKILL leaves the supervisor no chance to stop its workers: each notices and drains itself, freeing the port."""
    argv = [sys.executable, "-m", "agentcache", "--log-format", "json", "proxy", "--port", "0", "--workers", "2"]
    proc = subprocess.Popen(
        [*argv, "--upstream", "http://127.0.0.1:9", "--redis-url", redis_url], stderr=subprocess.PIPE, text=True
    )
    try:
        assert proc.stderr is not None
        port = json.loads(proc.stderr.readline())["port"]
        deadline = time.monotonic() + 60
        while not _listening(port):  # the workers serve
            assert time.monotonic() < deadline, "the workers never listened"
            time.sleep(0.2)
    finally:
        proc.kill()
        proc.wait(timeout=30)
    deadline = time.monotonic() + 30
    while _accepting(port):
        assert time.monotonic() < deadline, "orphaned workers still serve the port"
        time.sleep(0.2)


def _listening(port: int) -> bool:
    try:
        return bool(_post_health(port))
    except OSError:
        return False


def _accepting(port: int) -> bool:
    try:
        with socket.create_connection(("127.0.0.1", port), timeout=1):
            return True
    except OSError:
        return False


def _post_health(port: int) -> bytes:
    with urllib.request.urlopen(f"http://127.0.0.1:{port}/agentcache/v1/health", timeout=5) as r:
        return bytes(r.read())


def _start(tmp_path: Path, argv: list[str]) -> tuple[subprocess.Popen[bytes], int]:
    """``agentcache proxy`` with ``argv``, its temporary files (``TMPDIR``) under ``tmp_path`` and its log in a file
    (a pipe nobody reads would fill and block it); returns the process and the port it serves."""
    log = tmp_path / "proxy.log"
    env = {**os.environ, "TMPDIR": str(tmp_path)}
    env.pop(MULTIPROC_ENV, None)
    cmd = [sys.executable, "-m", "agentcache", "--log-format", "json", "proxy", "--port", "0", *argv]
    with log.open("wb") as out:
        proc = subprocess.Popen(cmd, stderr=out, env=env)
    deadline = time.monotonic() + 60
    while not (lines := log.read_text().splitlines()):
        assert time.monotonic() < deadline and proc.poll() is None, "the proxy never started"
        time.sleep(0.1)
    return proc, json.loads(lines[0])["port"]


def _scrape(port: int) -> dict[str, list[Sample]]:
    with urllib.request.urlopen(f"http://127.0.0.1:{port}/metrics", timeout=10) as r:
        text = r.read().decode()
    return {f.name: f.samples for f in text_string_to_metric_families(text)}


def _total(samples: list[Sample], name: str, **labels: str) -> float:
    return sum(s.value for s in samples if s.name == name and labels.items() <= s.labels.items())


def _per_worker(shared: Path, kind: str, name: str, **labels: str) -> dict[int, float]:
    """``name`` (its series with ``labels``) summed per worker pid, read from each worker's own ``{kind}_{pid}.db``
    in the shared directory."""
    values: dict[int, float] = {}
    for db in shared.glob(f"{kind}_*.db"):
        alone = shared.parent / f"one-{db.name}"
        alone.mkdir()
        shutil.copy(db, alone / db.name)
        registry = CollectorRegistry()
        MultiProcessCollector(registry, path=str(alone))
        samples = [s for m in registry.collect() for s in m.samples]
        values[int(db.stem.rsplit("_", 1)[1])] = _total(samples, name, **labels)
        shutil.rmtree(alone)
    return values


def test_two_workers_answer_one_metrics(redis_url: str, tmp_path: Path) -> None:  # noqa: F811
    """Requests spread over both workers; every scrape, whichever worker serves it, reports all of them. A worker
    killed and restarted leaves no live sessions behind; the shared directory (0700) is gone once the proxy is."""
    with ServerThread(_upstream()) as upstream:
        proc, port = _start(tmp_path, ["--workers", "2", "--upstream", upstream.url, "--redis-url", redis_url])
        try:
            (shared,) = tmp_path.glob("agentcache-metrics-*")
            assert stat.S_IMODE(shared.stat().st_mode) == 0o700
            sent = 0
            with ThreadPoolExecutor(8) as pool:
                while len(served := _per_worker(shared, "counter", "agentcache_proxy_requests_total")) < 2 or not all(
                    served.values()
                ):
                    assert sent < 200, f"one worker served everything: {served}"
                    list(pool.map(lambda i: _post(port, f"spread-{i}"), range(sent, sent + 8)))
                    sent += 8
            expected = _settled(port, sent)
            for _ in range(10):  # each on a new connection: either worker
                assert _counts(_scrape(port)) == expected
            turns = _per_worker(shared, "counter", "agentcache_session_events_total", event="turn")
            assert expected[1] == sum(turns.values()) and expected[3] == 5 * expected[1]
            if not _total(_scrape(port).get("agentcache_proxy_fail_open", []), "agentcache_proxy_fail_open_total"):
                assert expected == [sent, sent, sent, 5.0 * sent, sent]  # Redis kept up: every request a turn
            _says_which_worker(port)
            _kill_one_worker(port, shared)
        finally:
            proc.terminate()
            proc.wait(timeout=60)
    assert not shared.exists()


def _says_which_worker(port: int) -> None:
    """Each worker keeps its own live report, so its page and report say which worker drew them (a fresh user saw
    the page flip between two views with no hint why)."""
    base = f"http://127.0.0.1:{port}/agentcache"
    pids = set()
    for _ in range(6):
        with urllib.request.urlopen(f"{base}/v1/report", timeout=30) as response:
            doc = json.loads(response.read())
            pid = response.headers["x-agentcache-worker"]
        assert (doc["worker"]["pid"], doc["worker"]["workers"]) == (int(pid), 2)
        with urllib.request.urlopen(f"{base}/", timeout=30) as response:
            page, page_pid = response.read().decode(), response.headers["x-agentcache-worker"]
        assert f"pid {page_pid}, one of 2: this page shows the sessions this worker served" in page
        pids |= {int(pid), int(page_pid)}
    assert pids and all(pid != os.getpid() for pid in pids)


def _settled(port: int, sent: int) -> list[float]:
    """The counts once every request is counted and two scrapes a second apart agree (the turn-level counts
    follow the responses, off their path; a loaded machine may time Redis out, and those requests fail open,
    relayed with no turn)."""
    deadline = time.monotonic() + 30
    previous: list[float] = []
    while (counts := _counts(_scrape(port))) != previous or counts[0] != sent:
        assert time.monotonic() < deadline, f"the scrapes never settled on {sent} requests: {counts}"
        previous = counts
        time.sleep(1)
    return counts


def _counts(metrics: dict[str, list[Sample]]) -> list[float]:
    """Requests, turns, sessions opened, prompt tokens of turns and live sessions in one scrape."""
    events = metrics["agentcache_session_events"]
    return [
        _total(metrics["agentcache_proxy_requests"], "agentcache_proxy_requests_total"),
        _total(events, "agentcache_session_events_total", event="turn"),
        _total(events, "agentcache_session_events_total", event="open"),
        _total(metrics["agentcache_prompt_tokens"], "agentcache_prompt_tokens_total", source="turn"),
        _total(metrics["agentcache_proxy_live_sessions"], "agentcache_proxy_live_sessions"),
    ]


def _kill_one_worker(port: int, shared: Path) -> None:
    """SIGKILL one worker; once the supervisor has started its successor, ``/metrics`` counts the survivor's live
    sessions only (the dead one's gauge file is dropped, not added to the new worker's)."""
    live = _per_worker(shared, "gauge_livesum", "agentcache_proxy_live_sessions")
    victim, survivor = sorted(live)
    assert live[victim] > 0 and live[survivor] > 0, live
    os.kill(victim, signal.SIGKILL)
    deadline = time.monotonic() + 60
    while len(pids := _per_worker(shared, "gauge_livesum", "agentcache_proxy_live_sessions")) < 2 + 1:
        assert time.monotonic() < deadline, f"no worker restarted: {pids}"
        time.sleep(0.2)
    for _ in range(10):
        value = _total(_scrape(port)["agentcache_proxy_live_sessions"], "agentcache_proxy_live_sessions")
        assert value == live[survivor]


def test_one_worker_keeps_its_own_metrics(tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> None:
    """One worker creates no shared directory and renders its own registry, even with the variable set."""
    proc, port = _start(tmp_path, ["--upstream", "http://127.0.0.1:9"])
    try:
        assert "agentcache_proxy_requests" in _scrape(port)
        assert not list(tmp_path.glob("agentcache-metrics-*")) and not list(tmp_path.rglob("*.db"))
    finally:
        proc.terminate()
        proc.wait(timeout=60)
    monkeypatch.setenv(MULTIPROC_ENV, str(tmp_path))
    assert worker_metrics_dir(1) is None and worker_metrics_dir(2) == str(tmp_path)
    assert create_app(ProxyConfig()).state.proxy.metrics.multiprocess_dir is None


def test_the_shared_directory_is_private_and_removed(monkeypatch: pytest.MonkeyPatch) -> None:
    monkeypatch.setenv(MULTIPROC_ENV, "/elsewhere")
    with shared_metrics_dir() as path:
        assert os.environ[MULTIPROC_ENV] == path and stat.S_IMODE(os.stat(path).st_mode) == 0o700
    assert not os.path.exists(path) and os.environ[MULTIPROC_ENV] == "/elsewhere"


def test_redis_url_without_the_redis_client_is_one_error_line() -> None:
    """Without the ``redis`` extra, ``--redis-url`` is one line naming the extra, before anything starts (a fresh
    user saw a traceback per worker and exit code 0)."""
    code = "import sys; sys.modules['redis'] = None; from agentcache._cli import app; app()"
    argv = ["proxy", "--port", "0", "--workers", "2", "--redis-url", "redis://127.0.0.1:1", "--upstream", "http://x"]
    done = subprocess.run([sys.executable, "-c", code, *argv], capture_output=True, text=True, timeout=60)
    lines = [line for line in done.stderr.splitlines() if line.strip()]
    assert done.returncode == 2, done.stderr
    assert len(lines) == 1 and "--redis-url needs the redis client" in lines[0] and "[redis]" in lines[0], lines


def test_a_worker_that_cannot_start_stops_the_proxy_with_an_error(tmp_path: Path) -> None:
    """A worker that fails before serving (here its Redis client cannot be imported) stops the supervisor, which
    exits with an error, not as from a clean stop (no ``proxy.stopped``)."""
    broken = tmp_path / "site" / "redis"
    broken.mkdir(parents=True)
    (broken / "__init__.py").write_text("raise ImportError('this redis client is broken')\n")
    env = {**os.environ, "PYTHONPATH": os.pathsep.join([str(tmp_path / "site"), os.environ.get("PYTHONPATH", "")])}
    env.pop(MULTIPROC_ENV, None)
    argv = [sys.executable, "-m", "agentcache", "--log-format", "json", "proxy", "--port", "0", "--workers", "2"]
    argv += ["--redis-url", "redis://127.0.0.1:1", "--upstream", "http://127.0.0.1:9"]
    done = subprocess.run(argv, capture_output=True, text=True, timeout=120, env=env)
    assert done.returncode == 2, done.stderr[-2000:]
    last = done.stderr.strip().splitlines()[-1]
    assert "failed to start" in last and "the proxy stopped" in last, last
    assert "proxy.stopped" not in done.stderr


def test_worker_counts(monkeypatch: pytest.MonkeyPatch, tmp_path: Path) -> None:
    """``workers``: a count, or ``auto`` for the cores this process may run on, from the flag, the environment or
    the config file alike; anything else is refused."""
    cores = len(os.sched_getaffinity(0))
    assert load_proxy_config(workers="auto").workers == cores and load_proxy_config(workers="3").workers == 3
    monkeypatch.setenv("AGENTCACHE_PROXY_WORKERS", "auto")
    assert load_proxy_config().workers == cores
    monkeypatch.delenv("AGENTCACHE_PROXY_WORKERS")
    (tmp_path / "a.toml").write_text('[proxy]\nworkers = "auto"\n')
    assert load_proxy_config(tmp_path / "a.toml").workers == cores
    for bad in ("0", "-2", "x", 0):
        with pytest.raises(ConfigError, match="workers"):
            load_proxy_config(workers=bad)


def _alive(pid: int) -> bool:
    try:
        os.kill(pid, 0)
    except ProcessLookupError:
        return False
    state = Path(f"/proc/{pid}/stat").read_text().rpartition(")")[2].split()[0]
    return state != "Z"


def _private_proxy(upstream: str) -> tuple[subprocess.Popen[str], dict[str, Any], dict[str, Any]]:
    """``agentcache proxy --workers 2`` without --redis-url in front of ``upstream``: the process, its
    ``proxy.private_redis`` line and its ``proxy.start`` line."""
    argv = [sys.executable, "-m", "agentcache", "--log-format", "json", "proxy", "--port", "0", "--workers", "2"]
    proc = subprocess.Popen([*argv, "--upstream", upstream], stderr=subprocess.PIPE, text=True)
    assert proc.stderr is not None
    return proc, json.loads(proc.stderr.readline()), json.loads(proc.stderr.readline())


@pytest.mark.skipif(shutil.which("redis-server") is None, reason="needs redis-server (apt-get install redis-server)")
@pytest.mark.parametrize("stop", [signal.SIGTERM, signal.SIGKILL])
def test_workers_without_a_redis_url_share_a_private_redis(stop: signal.Signals) -> None:
    """More than one worker and no --redis-url: the proxy runs a private redis-server (a Unix socket in a 0700
    directory), the workers share one session through it, and it stops with the proxy, even one killed outright."""
    with ServerThread(_upstream()) as upstream:
        proc, private, start = _private_proxy(upstream.url)
        try:
            assert proc.stderr is not None
            assert private["event"] == "proxy.private_redis" and start["store"] == "redis" and start["workers"] == 2
            sock = Path(private["socket"])
            assert stat.S_IMODE(sock.parent.stat().st_mode) == 0o700 and _alive(private["pid"])
            for _ in range(4):
                _post(start["port"], "private-1")
            proc.send_signal(stop)
            proc.wait(timeout=30)
            rest = proc.stderr.read()  # the workers' lines too, once they have drained and exited
        finally:
            proc.kill()
    turns = sorted(
        e["session_signal"]["turn"]
        for e in _events(rest)
        if e["event"] == "proxy.request" and (e.get("session_signal") or {}).get("session_id") == "private-1"
    )
    assert turns == [0, 1, 2, 3], rest  # one session, whichever worker served each turn
    deadline = time.monotonic() + 10
    while _alive(private["pid"]):
        assert time.monotonic() < deadline, "the private redis-server outlived the proxy"
        time.sleep(0.1)
    if stop == signal.SIGTERM:
        assert not sock.parent.exists()


@pytest.mark.skipif(shutil.which("redis-server") is None, reason="needs redis-server (apt-get install redis-server)")
def test_a_private_redis_that_dies_is_restarted() -> None:
    """The private redis-server killed under the proxy: it is started again on the same socket (its exit and the
    restart logged, no zombie left), and the workers' sessions go on in it (a session started over)."""
    with ServerThread(_upstream()) as upstream:
        proc, private, start = _private_proxy(upstream.url)
        try:
            assert proc.stderr is not None
            _post(start["port"], "restart-1")
            os.kill(private["pid"], signal.SIGKILL)
            seen: list[dict[str, Any]] = []
            while not seen or seen[-1]["event"] != "proxy.private_redis_restarted":
                line = proc.stderr.readline()  # the workers' lines come in between
                assert line, "the proxy stopped"
                seen += [e for e in _events(line) if e["event"].startswith("proxy.private_redis")]
            lines = seen
            assert [e["event"] for e in lines] == ["proxy.private_redis_exited", "proxy.private_redis_restarted"]
            assert lines[1]["socket"] == private["socket"] and _alive(lines[1]["pid"])
            assert not _alive(private["pid"])  # reaped
            time.sleep(1.5)  # the store's breaker (retry_after) lets the next call through
            _post(start["port"], "restart-1")
            proc.send_signal(signal.SIGTERM)
            proc.wait(timeout=30)
            rest = proc.stderr.read()
        finally:
            proc.kill()
    turns = [
        e
        for e in _events(rest)
        if e["event"] == "proxy.request" and (e.get("session_signal") or {}).get("session_id") == "restart-1"
    ]
    assert len(turns) >= 1 and all(e.get("status") == 200 for e in turns), rest
    assert not _alive(lines[1]["pid"])
