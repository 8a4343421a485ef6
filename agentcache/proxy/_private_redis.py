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
        proc = subprocess.Popen(
            argv, stdin=subprocess.DEVNULL, stdout=subprocess.DEVNULL, stderr=subprocess.PIPE,
            preexec_fn=_die_with_parent if sys.platform == "linux" else None,
        )  # fmt: skip
        try:
            _wait_ready(proc, sock)
            log.info("proxy.private_redis", pid=proc.pid, socket=str(sock))
            yield f"unix://{sock}"
        finally:
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
