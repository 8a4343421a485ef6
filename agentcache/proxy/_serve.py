"""Run the proxy under uvicorn (``agentcache proxy``)."""

from __future__ import annotations

import os

from .._config import Settings, get_settings
from .._log import get_logger
from ._app import create_app
from ._config import ProxyConfig, is_loopback, unknown_env

__all__ = ["serve"]

log = get_logger("agentcache.proxy")


def serve(config: ProxyConfig, settings: Settings | None = None) -> None:
    """Serve the proxy on ``config.host:config.port`` until interrupted (uvicorn; its access log is off:
    the proxy writes one structured line per request itself)."""
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
    app = create_app(config, settings=settings)
    server_config = uvicorn.Config(
        app,
        host=config.host,
        port=config.port,
        log_config=None,
        access_log=False,
        lifespan="on",
        timeout_graceful_shutdown=10,
        server_header=False,  # the upstream's own server header is relayed; one is enough
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
        settings=settings.model_dump(),
    )
    try:
        uvicorn.Server(server_config).run(sockets=[sock])
    except KeyboardInterrupt:  # uvicorn raises the interrupt again once it has shut down (as uvicorn.run does)
        pass
    finally:
        sock.close()
    log.info("proxy.stopped", host=config.host, port=port)
