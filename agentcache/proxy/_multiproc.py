"""One ``/metrics`` for ``agentcache proxy --workers N``: prometheus_client's multiprocess mode.

The supervisor creates a private directory (mode 0700) before it starts the workers and names it in
``PROMETHEUS_MULTIPROC_DIR`` (:func:`shared_metrics_dir`); each spawned worker inherits the variable, so its
prometheus_client writes every value to files there, one set per pid. A worker's ``/metrics`` then collects all
the workers' files (:func:`collect_workers`): counters and histograms summed over the workers (a dead worker's
counts stay in: they happened), gauges by their ``multiprocess_mode`` (``livesum``: only running workers).

A worker that dies leaves its gauge files behind. uvicorn's supervisor gives no hook when it restarts one, so
each collection first drops the live-gauge files of pids no longer running (prometheus_client's
:func:`~prometheus_client.multiprocess.mark_process_dead`): the restarted worker's gauges count once. One worker
(the default) uses none of this: no variable, no directory, its own registry as before.
"""

from __future__ import annotations

import os
import re
import shutil
import tempfile
from collections.abc import Iterator
from contextlib import contextmanager

from prometheus_client import CollectorRegistry, generate_latest
from prometheus_client.multiprocess import MultiProcessCollector, mark_process_dead

__all__ = ["MULTIPROC_ENV", "collect_workers", "shared_metrics_dir", "worker_metrics_dir"]

#: prometheus_client's variable: set in a process before it imports prometheus_client, values go to files there.
MULTIPROC_ENV = "PROMETHEUS_MULTIPROC_DIR"

_LIVE_GAUGE_FILE = re.compile(r"gauge_live[a-z]+_(\d+)\.db")


@contextmanager
def shared_metrics_dir() -> Iterator[str]:
    """A new private directory (0700) named in :data:`MULTIPROC_ENV` while the block runs (the workers started
    inside inherit it); afterwards the variable is restored and the directory removed. Yields its path."""
    path = tempfile.mkdtemp(prefix="agentcache-metrics-")  # mkdtemp: mode 0700, a fresh name
    previous = os.environ.get(MULTIPROC_ENV)
    os.environ[MULTIPROC_ENV] = path
    try:
        yield path
    finally:
        if previous is None:
            os.environ.pop(MULTIPROC_ENV, None)
        else:
            os.environ[MULTIPROC_ENV] = previous
        shutil.rmtree(path, ignore_errors=True)


def worker_metrics_dir(workers: int) -> str | None:
    """The shared metrics directory of a worker of a ``workers``-process proxy, or None for one process (which
    keeps its own registry even when the variable happens to be set)."""
    return os.environ.get(MULTIPROC_ENV) if workers > 1 else None


def collect_workers(path: str) -> bytes:
    """Every worker's metrics written under ``path``, merged, in the text exposition format (live gauges of dead
    pids dropped first; see the module docstring)."""
    _forget_dead(path)
    registry = CollectorRegistry()
    MultiProcessCollector(registry, path=path)  # type: ignore[no-untyped-call]
    return generate_latest(registry)


def _forget_dead(path: str) -> None:
    """Remove the live-gauge files of pids that no longer run (a zombie not yet reaped still counts as running)."""
    pids = {int(m.group(1)) for name in os.listdir(path) if (m := _LIVE_GAUGE_FILE.fullmatch(name))}
    for pid in pids:
        if not _running(pid):
            mark_process_dead(pid, path)  # type: ignore[no-untyped-call]


def _running(pid: int) -> bool:
    try:
        os.kill(pid, 0)
    except ProcessLookupError:
        return False
    except PermissionError:  # another user's process: the pid was reused, our worker is gone
        return False
    return True
