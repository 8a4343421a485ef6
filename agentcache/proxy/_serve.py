"""Run the proxy under uvicorn (``agentcache proxy``): one process, or ``workers`` processes on one port
(:mod:`agentcache.proxy._workers`).

SIGTERM (what systemd, Docker and Kubernetes send) ends the proxy as Ctrl-C does: uvicorn stops accepting, lets
in-flight requests and streams finish for at most :data:`DRAIN_TIMEOUT_S` seconds, then the proxy logs
``proxy.stopped`` and returns (exit code 0).
"""

from __future__ import annotations

import os
import signal
from collections.abc import Iterator
from contextlib import contextmanager
from types import FrameType
from typing import Any

from .._config import Settings, get_settings
from .._log import get_logger
from ._app import create_app
from ._config import ProxyConfig, is_loopback, unknown_env
from ._server import uvicorn_config
from ._workers import WorkerApp, run_workers, with_store

__all__ = ["serve"]

log = get_logger("agentcache.proxy")

#: Seconds in-flight requests (streams included) may take to finish once a stop is asked; then they are cut.
DRAIN_TIMEOUT_S = 10


class _Terminated(BaseException):
    """SIGTERM outside uvicorn's own handling (before it starts, or re-raised by it once it has stopped)."""


def serve(config: ProxyConfig, settings: Settings | None = None) -> None:
    """Serve the proxy on ``config.host:config.port`` until interrupted (uvicorn with the proxy's timeouts,
    :mod:`agentcache.proxy._server`; its access log is off: the proxy writes one structured line per request
    itself). More than one worker without ``redis_url`` share a private ``redis-server``
    (:func:`~agentcache.proxy._workers.with_store`). Raises ConfigError when it cannot run one, WorkersFailed when
    a worker fails before it serves."""
    with with_store(config) as config:
        _serve(config, settings)


def _serve(config: ProxyConfig, settings: Settings | None) -> None:
    import uvicorn

    if not is_loopback(config.host) and not config.admin_token:
        log.warning("proxy.admin_disabled", host=config.host, reason="bound beyond loopback without an admin token")
    for name in unknown_env(os.environ):
        log.warning("proxy.unknown_env", name=name, hint="not a proxy option; pipeline settings are AGENTCACHE_<NAME>")
    if config.engine != "none" and config.upstream_kind != "url":
        # a local engine declared, but requests go to a cloud provider: almost surely a missing --upstream
        log.warning(
            "proxy.engine_without_upstream",
            engine=config.engine,
            upstream=config.upstream_url,
            hint="give the engine's URL: --upstream http://127.0.0.1:8080",
        )
    settings = settings or get_settings()
    app: Any = create_app(config, settings=settings) if config.workers == 1 else _worker_app(config, settings)
    server_config = uvicorn_config(
        app,
        config,
        workers=config.workers,
        log_config=None,
        access_log=False,
        lifespan="on",
        timeout_graceful_shutdown=DRAIN_TIMEOUT_S,
    )
    # Bound and listening here, so the start line names the port (the OS's for --port 0) and a client that reads it
    # and connects at once is queued until uvicorn accepts, not refused.
    sock = server_config.bind_socket()
    sock.listen(server_config.backlog)
    port = sock.getsockname()[1]
    log.info(
        "proxy.start",
        host=config.host,
        port=port,
        upstream=config.upstream_url,
        engine=config.engine,
        store="redis" if config.redis_url else "memory",
        workers=config.workers,
        live_page=_live_page_url(config.host, port),
        settings=settings.model_dump(),
        changed=settings.model_dump(exclude_defaults=True),  # what the console line shows of the settings
    )
    try:
        with _sigterm_raises():
            if config.workers > 1:
                run_workers(server_config, sock)
            else:
                uvicorn.Server(server_config).run(sockets=[sock])
    except (KeyboardInterrupt, _Terminated):  # uvicorn re-raises the signal once it has shut down gracefully
        pass
    finally:
        sock.close()
    log.info("proxy.stopped", host=config.host, port=port)


def _worker_app(config: ProxyConfig, settings: Settings) -> WorkerApp:
    """The app each worker process builds for itself, with this process's settings and logging."""
    from .._log_output import configured_logging

    return WorkerApp(config, settings, configured_logging())


def _live_page_url(host: str, port: int) -> str:
    """The live page's address as a browser on this machine opens it (a wildcard bind is reached on loopback)."""
    if host in ("", "0.0.0.0", "::"):
        host = "127.0.0.1"
    return f"http://{f'[{host}]' if ':' in host else host}:{port}/agentcache/"


@contextmanager
def _sigterm_raises() -> Iterator[None]:
    """While in the block, SIGTERM raises :class:`_Terminated` as SIGINT raises KeyboardInterrupt. uvicorn handles
    both signals while it serves (graceful shutdown), then restores these handlers and raises the signal again;
    under the default SIGTERM handler that killed the process (exit 143, no ``proxy.stopped``)."""

    def terminated(signum: int, frame: FrameType | None) -> None:
        raise _Terminated

    try:
        previous = signal.signal(signal.SIGTERM, terminated)
    except ValueError:  # not the main thread: signals are not ours to handle
        yield
        return
    try:
        yield
    finally:
        signal.signal(signal.SIGTERM, previous)
