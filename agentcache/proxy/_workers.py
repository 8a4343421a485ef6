"""``agentcache proxy --workers N``: N server processes on one port, under uvicorn's own supervisor.

The parent binds the port, then uvicorn's :class:`~uvicorn.supervisors.Multiprocess` starts N worker processes
(``spawn``) that accept on the same socket; the kernel spreads connections among them. The supervisor restarts a
worker that dies, and on SIGTERM or SIGINT sends each worker SIGTERM: every worker stops accepting and drains its
in-flight requests (:data:`~agentcache.proxy._serve.DRAIN_TIMEOUT_S`), as one process does.

What is shared between workers and what is not:

* **Sessions**: through Redis only (``--redis-url``, or a private ``redis-server`` :func:`with_store` runs when
  none is given, :mod:`~agentcache.proxy._private_redis`). A client connection stays on one worker, but the next
  connection, or another agent of the same session, may land on any: with per-process memory stores each worker
  would see part of a session, diagnose false breaks and repair against history it never saw.
* **Metrics**: ``/metrics`` answers with every worker's values, whichever worker serves the scrape
  (prometheus_client's multiprocess mode: the supervisor's private directory in ``PROMETHEUS_MULTIPROC_DIR``,
  removed at exit; :mod:`~agentcache.proxy._multiproc`). Counters and histograms are summed, gauges summed over
  the running workers; the live sessions and state bytes of another worker are at most
  :data:`PARENT_CHECK_S` old (each worker sets them on that timer, the scraped one at the scrape).
* **Per process**, as with several replicas behind a load balancer: ``/agentcache/v1/report`` (each answer is the
  live report of the worker that served it; it is not merged), the coalescer (siblings held only within one
  worker), keep-warm timers, the parse memo and ``max_state_mb`` (a budget per worker).

The default is one worker: it needs no Redis, no metrics directory, and keeps the live report whole; it is also the
most requests per CPU-second (a shared store costs each turn its round trips and snapshot: ``benchmarks/README.md``).
Several workers (``--workers auto``: the cores available) pay off when the proxy is CPU-bound (the pipeline's
per-turn work is pure Python, one core per process).
"""

from __future__ import annotations

import asyncio
import contextlib
import os
import signal
from collections.abc import Iterator
from socket import socket
from typing import Any

from starlette.types import Receive, Scope, Send

from .._config import Settings
from .._log import get_logger
from ._config import ProxyConfig, cores_available
from ._multiproc import shared_metrics_dir
from ._server import ProxyServerConfig

__all__ = ["PARENT_CHECK_S", "WorkerApp", "WorkersFailed", "run_workers", "with_store"]

log = get_logger("agentcache.proxy")

#: Seconds between a worker's checks that its supervisor still runs (one killed with SIGKILL cannot stop its
#: workers: each then drains and exits by itself instead of serving the port on its own), and between its updates
#: of its measured gauges in the shared metrics (:meth:`~agentcache.proxy._metrics.ProxyMetrics.refresh`).
PARENT_CHECK_S = 1.0


class WorkersFailed(RuntimeError):
    """A worker process failed before it served (its app, the session store or the socket is broken, so every
    restart would fail the same way): uvicorn's supervisor stopped the others and returned. Raised by
    :func:`run_workers` so the command exits with an error, not as from a clean stop."""


class WorkerApp:
    """The proxy's ASGI app as a worker process builds it: at its first call (the lifespan's startup) it installs the
    parent's ``settings``, logging (``(renderer, level)``, or None) and quiet stream cuts
    (:func:`~agentcache.proxy._server.quiet_stream_cuts`) in the worker, then creates the app
    (:func:`~agentcache.proxy._app.create_app`). Holds only picklable values until then, so uvicorn can send it
    to each worker."""

    def __init__(self, config: ProxyConfig, settings: Settings, logging: tuple[str, str] | None) -> None:
        self.config = config
        self.settings = settings
        self.logging = logging
        self.parent = os.getpid()  # the supervisor's: built there, called in the workers
        self._app: Any = None
        self._watch: asyncio.Task[None] | None = None

    async def __call__(self, scope: Scope, receive: Receive, send: Send) -> None:
        """Serve ``scope`` with this worker's app (see the class docstring)."""
        if self._app is None:
            self._app = self._build()
            self._watch = asyncio.get_running_loop().create_task(self._watch_parent())
        await self._app(scope, receive, send)

    async def _watch_parent(self) -> None:
        """SIGTERM to this worker (a graceful drain, as the supervisor would ask) once its supervisor is gone;
        meanwhile, this worker's measured gauges set in the shared metrics every :data:`PARENT_CHECK_S`."""
        while os.getppid() == self.parent:
            await asyncio.sleep(PARENT_CHECK_S)
            try:
                self._app.state.proxy.metrics.refresh()
            except Exception as exc:  # a gauge left stale must not end the watch
                log.warning("proxy.metrics_refresh_failed", error=repr(exc))
        log.warning("proxy.worker_orphaned", pid=os.getpid(), parent=self.parent, action="draining, then exiting")
        os.kill(os.getpid(), signal.SIGTERM)

    def _build(self) -> Any:
        from .._config import use_settings
        from .._log_output import configure_logging
        from ._app import create_app
        from ._server import quiet_stream_cuts

        quiet_stream_cuts()
        if self.logging is not None:
            configure_logging(*self.logging)
        return create_app(self.config, settings=use_settings(self.settings))

    def __getstate__(self) -> dict[str, Any]:
        """Picklable state: the app itself is built in the worker."""
        return {**self.__dict__, "_app": None, "_watch": None}


def run_workers(server_config: ProxyServerConfig, sock: socket) -> None:
    """Serve ``server_config`` (its ``workers`` processes, its app a :class:`WorkerApp`) on the bound, listening
    ``sock`` until SIGINT or SIGTERM, then return once every worker has drained and exited. The workers share
    one metrics directory, removed at the end (:func:`~agentcache.proxy._multiproc.shared_metrics_dir`).

    Raises:
        WorkersFailed: a worker failed before it served, and the supervisor stopped.
    """
    from uvicorn.config import STARTUP_FAILURE
    from uvicorn.supervisors import Multiprocess

    with shared_metrics_dir():  # before the workers start: each inherits the variable
        supervisor = Multiprocess(server_config, sockets=[sock])
        supervisor.run()
    failed = [process.pid for process in supervisor.processes if process.exitcode == STARTUP_FAILURE]
    if failed:
        raise WorkersFailed(f"worker process {failed[0]} failed to start (its error is above); the proxy stopped")


@contextlib.contextmanager
def with_store(config: ProxyConfig) -> Iterator[ProxyConfig]:
    """``config`` for the duration of the block, with a private ``redis-server`` as its Redis when it runs more than
    one worker without one (:func:`~agentcache.proxy._private_redis.private_redis`, stopped after). Raises
    ConfigError when it cannot run one."""
    cores = cores_available()
    if config.workers > cores:  # each worker is a whole process: more than the cores only adds memory
        log.warning("proxy.workers_exceed_cores", workers=config.workers, cores=cores, hint="--workers auto")
    if config.workers == 1 or config.redis_url:
        yield config
        return
    from ._private_redis import private_redis

    with private_redis() as url:
        yield ProxyConfig.model_validate({**config.model_dump(), "redis_url": url})
