"""A private ``redis-server`` for ``agentcache proxy --workers N`` without ``--redis-url``: the workers share
sessions through it, as replicas share a Redis of their own (:mod:`agentcache.proxy._workers`).

It listens on a Unix socket in a private directory (mode 0700; no TCP port), keeps nothing on disk (``save ''``,
no append-only file) and lives as long as the proxy: stopped when the proxy stops, and asked by the kernel to
stop (``PR_SET_PDEATHSIG``, Linux) should the proxy be killed without a chance to. Sessions then live exactly as
long as the one-process memory store keeps them.
"""

from __future__ import annotations

import contextlib
import ctypes
import shutil
import signal
import subprocess
import sys
import tempfile
import threading
import time
from collections.abc import Iterator
from pathlib import Path

from .._exceptions import ConfigError
from .._log import get_logger

__all__ = ["REDIS_SERVER", "private_redis"]

log = get_logger("agentcache.proxy")

#: The server binary looked up on ``PATH`` (Debian/Ubuntu: ``apt-get install redis-server``).
REDIS_SERVER = "redis-server"
#: Seconds to wait for the server's socket to answer before giving up.
START_TIMEOUT_S = 10.0


@contextlib.contextmanager
def private_redis(binary: str | None = None) -> Iterator[str]:
    """Run a private ``redis-server`` (``binary``, default :data:`REDIS_SERVER` on ``PATH``) for the duration of
    the block; yields its URL (``unix:///…/redis.sock``). Raises ConfigError when there is no such binary or it does
    not start within :data:`START_TIMEOUT_S` seconds (its own error line included)."""
    exe = binary or shutil.which(REDIS_SERVER)
    if exe is None:
        raise ConfigError(
            "more than one worker shares sessions through Redis: give --redis-url, or install redis-server "
            "(apt-get install redis-server) for a private one, or keep --workers 1"
        )
    with tempfile.TemporaryDirectory(prefix="agentcache-redis-") as tmp:
        sock = Path(tmp) / "redis.sock"
        argv = [exe, "--port", "0", "--unixsocket", str(sock), "--unixsocketperm", "700", "--save", "",
                "--appendonly", "no", "--daemonize", "no", "--loglevel", "warning"]  # fmt: skip
        server = _Server(argv, sock)
        try:
            server.start()
            yield f"unix://{sock}"
        finally:
            server.stop()


class _Server:
    """The private server's process, restarted on the same socket when it exits before :meth:`stop` (its sessions
    are then gone: the workers' requests start new ones, as after a proxy restart), each exit and restart logged."""

    def __init__(self, argv: list[str], sock: Path) -> None:
        self.argv, self.sock = argv, sock
        self.proc: subprocess.Popen[bytes] | None = None
        self.stopping = threading.Event()
        self.watch = threading.Thread(target=self._watch, name="agentcache-private-redis", daemon=True)

    def start(self) -> None:
        """Start the server and its watcher. Raises ConfigError when it does not start."""
        self._spawn()
        assert self.proc is not None
        log.info("proxy.private_redis", pid=self.proc.pid, socket=str(self.sock))
        self.watch.start()

    def _spawn(self) -> None:
        self.proc = subprocess.Popen(
            self.argv, stdin=subprocess.DEVNULL, stdout=subprocess.DEVNULL, stderr=subprocess.PIPE,
            preexec_fn=_die_with_parent if sys.platform == "linux" else None,
        )  # fmt: skip
        _wait_ready(self.proc, self.sock)

    def _watch(self) -> None:
        while not self.stopping.is_set():
            assert self.proc is not None
            code = self.proc.wait()  # also reaps it: no zombie
            if self.stopping.is_set():
                return
            log.warning(
                "proxy.private_redis_exited", pid=self.proc.pid, code=code, action="restarting; sessions restart"
            )
            try:
                self.sock.unlink(missing_ok=True)
                self._spawn()
            except (ConfigError, OSError) as exc:
                log.error("proxy.private_redis_failed", error=str(exc), action="requests are forwarded unchanged")
                return
            log.warning("proxy.private_redis_restarted", pid=self.proc.pid, socket=str(self.sock))

    def stop(self) -> None:
        """Stop the server (and its watcher) for good."""
        self.stopping.set()
        proc = self.proc
        if proc is None:
            return
        proc.terminate()
        try:
            proc.wait(timeout=10)
        except subprocess.TimeoutExpired:
            proc.kill()
            proc.wait()


def _wait_ready(proc: subprocess.Popen[bytes], sock: Path) -> None:
    """Until the server answers PING on ``sock``. Raises ConfigError if it exits or stays silent."""
    deadline = time.monotonic() + START_TIMEOUT_S
    while time.monotonic() < deadline:
        if proc.poll() is not None:
            err = (proc.stderr.read() if proc.stderr else b"").decode(errors="replace").strip().splitlines()
            raise ConfigError(f"the private redis-server exited ({proc.returncode}): {err[-1] if err else ''}")
        if sock.exists() and _pings(sock):
            return
        time.sleep(0.05)
    proc.kill()
    raise ConfigError(f"the private redis-server did not answer within {START_TIMEOUT_S:.0f} s")


def _pings(sock: Path) -> bool:
    import socket

    try:
        with socket.socket(socket.AF_UNIX) as s:
            s.settimeout(1.0)
            s.connect(str(sock))
            s.sendall(b"PING\r\n")
            return s.recv(16).startswith(b"+PONG")
    except OSError:
        return False


def _die_with_parent() -> None:  # pragma: no cover  (runs in the child, between fork and exec)
    """Ask the kernel to send this (child) process SIGTERM when its parent dies (Linux ``prctl``)."""
    with contextlib.suppress(OSError, AttributeError):
        ctypes.CDLL(None, use_errno=True).prctl(1, signal.SIGTERM)  # 1: PR_SET_PDEATHSIG
