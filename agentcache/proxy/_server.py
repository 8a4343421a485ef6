"""The HTTP server under the proxy (uvicorn), with its timeouts set deliberately.

* **Keep-alive** (``server_keepalive``): an idle client connection stays open longer than common clients keep it
  pooled (:data:`~agentcache.proxy._config.DEFAULT_SERVER_KEEPALIVE`), so the client always closes first. A server
  that closes at the very moment the client's pool still counts the connection as reusable (uvicorn's default 5 s
  against httpx's 5 s) loses the request the client writes into the closing connection.
* **Headers** (``header_timeout``): once a request's first byte arrived (or a connection opened), its line and
  headers must be complete within this many seconds, else the connection is closed (uvicorn has no such limit).
* **Bodies** (``body_timeout``): enforced by :class:`~agentcache.proxy._boundary.Cycle` (408).
* **Headers of its own**: none. A relayed response carries the upstream's ``server`` and ``date``, one of each; the
  proxy's own answers get a ``date`` from :class:`~agentcache.proxy._boundary.Cycle`.
* **A stream the upstream cut** is broken for the client by an exception out of the app (HTTP has no other way to
  tell it); the proxy has already counted and logged it (``proxy.request``, ``outcome=upstream_error``), so the
  server's traceback for it is dropped (:class:`QuietStreamCuts`).
"""

from __future__ import annotations

import asyncio
import logging
from typing import Any

import uvicorn
from uvicorn.protocols.http.auto import AutoHTTPProtocol

from ._config import DEFAULT_HEADER_TIMEOUT, ProxyConfig
from ._forward import UpstreamStreamError

__all__ = ["HeaderDeadline", "ProxyServerConfig", "QuietStreamCuts", "quiet_stream_cuts", "uvicorn_config"]


class HeaderDeadline(AutoHTTPProtocol):  # type: ignore[misc,valid-type]
    """uvicorn's HTTP/1.1 protocol (httptools, else h11) with a deadline on each request's line and headers:
    ``header_timeout`` seconds from a new connection, or from the first byte of a request on an idle one, until its
    headers are complete. A connection still waiting at the deadline is closed; one serving a request never is.
    ``header_timeout``: the server config's (:class:`ProxyServerConfig`), else
    :data:`~agentcache.proxy._config.DEFAULT_HEADER_TIMEOUT`."""

    def connection_made(self, transport: Any) -> None:
        """See the class docstring."""
        self._header_timer: asyncio.TimerHandle | None = None
        self.header_timeout: float = getattr(self.config, "header_timeout", DEFAULT_HEADER_TIMEOUT)
        super().connection_made(transport)
        self._arm()

    def data_received(self, data: bytes) -> None:
        """See the class docstring."""
        waiting = self._between_requests()
        cycle = self.cycle
        if waiting:
            self._arm()
        super().data_received(data)
        if self.cycle is not cycle:  # the headers completed: a request is being served
            self._disarm()

    def connection_lost(self, exc: Exception | None) -> None:
        """See the class docstring."""
        self._disarm()
        super().connection_lost(exc)

    def _between_requests(self) -> bool:
        return self.cycle is None or bool(self.cycle.response_complete)

    def _arm(self) -> None:
        if self._header_timer is None:
            self._header_timer = asyncio.get_running_loop().call_later(self.header_timeout, self._expired)

    def _disarm(self) -> None:
        if self._header_timer is not None:
            self._header_timer.cancel()
            self._header_timer = None

    def _expired(self) -> None:
        self._header_timer = None
        if self._between_requests() and not self.transport.is_closing():
            self.transport.close()


class QuietStreamCuts(logging.Filter):
    """Drops the server's log record of a :class:`~agentcache.proxy._forward.UpstreamStreamError` (see the module
    docstring); every other record passes."""

    def filter(self, record: logging.LogRecord) -> bool:
        """See the class docstring."""
        exc = record.exc_info[1] if record.exc_info else None
        if isinstance(exc, BaseExceptionGroup):
            cuts, rest = exc.split(UpstreamStreamError)
            return cuts is None or rest is not None
        return not isinstance(exc, UpstreamStreamError)


class ProxyServerConfig(uvicorn.Config):
    """uvicorn's config plus the proxy's ``header_timeout`` (seconds, read by :class:`HeaderDeadline`). Module-level
    classes only, so uvicorn can hand it whole (pickled) to each worker process."""

    def __init__(self, app: Any, *, header_timeout: float = DEFAULT_HEADER_TIMEOUT, **options: Any) -> None:
        super().__init__(app, **options)
        self.header_timeout = header_timeout


_QUIET = QuietStreamCuts()


def quiet_stream_cuts() -> None:
    """Add :class:`QuietStreamCuts` to this process's ``uvicorn.error`` logger (once; each worker process too)."""
    logger = logging.getLogger("uvicorn.error")
    if _QUIET not in logger.filters:
        logger.addFilter(_QUIET)


def uvicorn_config(app: Any, config: ProxyConfig, *, port: int | None = None, **extra: Any) -> ProxyServerConfig:
    """The uvicorn config serving ``app`` on ``config.host`` and ``port`` (default ``config.port``) with the proxy's
    timeouts (the module docstring); ``extra``: more uvicorn options. Adds :class:`QuietStreamCuts` to the
    ``uvicorn.error`` logger (:func:`quiet_stream_cuts`)."""
    quiet_stream_cuts()
    return ProxyServerConfig(
        app,
        header_timeout=config.header_timeout,
        host=config.host,
        port=config.port if port is None else port,
        http=HeaderDeadline,
        timeout_keep_alive=config.server_keepalive,
        server_header=False,
        date_header=False,
        **extra,
    )
