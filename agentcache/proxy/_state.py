"""The proxy's process-wide state: config, the one pooled upstream client, the session store, metrics, the
live report, and the background work (idle sweeps, SGLang ``/close_session`` posts).

:meth:`ProxyState.startup` creates the ``httpx.AsyncClient`` (and connects the store); :meth:`shutdown` closes
them. The starlette lifespan calls both; tests may use ``async with state.running():``.
"""

from __future__ import annotations

import asyncio
import contextlib
import time
from collections.abc import AsyncIterator, Awaitable
from typing import Any, TypeVar

import httpx
from starlette.requests import Request
from starlette.responses import Response

from .._config import Settings, get_settings
from .._log import get_logger
from ..model._fields import LifecycleEvent
from ..model._usage import CacheUsage
from ..session._lifecycle import Sink, emit
from ..session._pipeline import SessionPipeline
from ..session._sinks import SGLangSink
from ._config import ProxyConfig
from ._errors import Style, error_response, upstream_failure
from ._keepwarm import KeepWarmer
from ._live import LiveReport
from ._metrics import ProxyMetrics, model_label
from ._sessions import LiveSession, ScopeRegistry
from ._store import MemoryStore, SessionStore, StoreUnavailable
from ._transport import ShardedTransport, UpstreamClient, env_proxy

__all__ = ["ProxyState"]

log = get_logger("agentcache.proxy")
T = TypeVar("T")


class ProxyState:
    """See the module docstring. ``transport``: an httpx transport for the upstream client (tests);
    ``store``: a session store (default: :class:`MemoryStore`, or Redis when ``config.redis_url`` is set)."""

    def __init__(
        self,
        config: ProxyConfig,
        *,
        settings: Settings | None = None,
        transport: httpx.AsyncBaseTransport | None = None,
        store: SessionStore | None = None,
    ) -> None:
        self.config = config
        self.settings = settings or get_settings()
        self.metrics = ProxyMetrics()
        self.report = LiveReport(self.metrics, config.simulate, config.report_max_sessions, config.report_max_records)
        self.scopes = ScopeRegistry()
        self.sinks: tuple[Sink, ...] = (self.metrics.sink,)
        self._transport = transport
        self._client: UpstreamClient | None = None
        self.store: SessionStore = store if store is not None else self._default_store()
        self._sweeper: asyncio.Task[None] | None = None
        self._background: set[asyncio.Task[Any]] = set()
        self.keep_warm = KeepWarmer(lambda: self.client, self._keep_warm_sent)

    def _default_store(self) -> SessionStore:
        if self.config.redis_url:
            from ._redis import RedisStore

            return RedisStore.from_url(self.config.redis_url, self.pipeline, self.config)
        return MemoryStore(
            self.pipeline,
            self.config.max_sessions,
            self.config.max_tombstones,
            self.config.index_checkpoints,
            self.config.min_inner_match,
            max_bytes=self.config.max_state_mb * 1024 * 1024,
        )

    def pipeline(self, tenant: str, provider: str, sid: str, lineage: str) -> SessionPipeline:
        """A new session's pipeline, sharing its tenant's cache scope on ``provider``."""
        return SessionPipeline(
            provider, scope=self.scopes.get(tenant, provider), settings=self.settings, session=sid, lineage=lineage
        )

    # ---- lifecycle of the process ---------------------------------------------------------------

    @property
    def client(self) -> UpstreamClient:
        """The pooled upstream client (created by :meth:`startup`)."""
        if self._client is None:
            raise RuntimeError("the proxy is not started")
        return self._client

    async def startup(self) -> None:
        """Create the pooled upstream client and start the idle sweeper."""
        c = self.config
        limits = httpx.Limits(max_connections=c.max_connections, max_keepalive_connections=c.max_keepalive)
        trust_env = not c.upstream_is_loopback  # no env proxy or cert settings for a local engine
        proxy = env_proxy(c.upstream_url) if trust_env else None
        transport = self._transport or ShardedTransport(c.upstream_pools, limits, proxy=proxy, trust_env=trust_env)
        timeout = httpx.Timeout(
            connect=c.connect_timeout, read=c.read_timeout, write=c.write_timeout, pool=c.pool_timeout
        )
        self._client = UpstreamClient(transport, timeout)
        self.metrics.live_sessions.set_function(lambda: float(self.store.live()))
        self._sweeper = asyncio.create_task(self._sweep_loop())

    async def shutdown(self) -> None:
        """Stop the sweeper, close what this process alone holds, wait for pending posts, release clients."""
        if self._sweeper is not None:
            self._sweeper.cancel()
            with contextlib.suppress(asyncio.CancelledError):
                await self._sweeper
            self._sweeper = None
        await self.keep_warm.aclose()
        if isinstance(self.store, MemoryStore):
            for sess in await self.store.sweep(time.time(), -1.0):
                await self.closed(sess, "shutdown")
        if self._background:
            await asyncio.wait(set(self._background), timeout=5.0)
        await self.store.aclose()
        if self._client is not None:
            await self._client.aclose()
            self._client = None

    @contextlib.asynccontextmanager
    async def running(self) -> AsyncIterator[ProxyState]:
        """``startup`` … ``shutdown`` as a context manager."""
        await self.startup()
        try:
            yield self
        finally:
            await self.shutdown()

    async def _sweep_loop(self) -> None:
        while True:
            await asyncio.sleep(self.config.sweep_interval)
            await self.sweep()

    async def sweep(self) -> list[LiveSession]:
        """Close sessions idle longer than ``idle_timeout`` (reason ``idle``)."""
        try:
            idle = await self.store_call("sweep", self.store.sweep(time.time(), self.config.idle_timeout))
        except Exception as exc:
            self.fail_open("sweep", exc)
            return []
        for sess in idle:
            await self.closed(sess, "idle")
        return idle

    # ---- the upstream --------------------------------------------------------------------------

    def url(self, request: Request) -> str:
        """The upstream URL for ``request``: upstream base + the raw path and query, as sent."""
        raw = request.scope.get("raw_path") or request.url.path.encode()
        url = self.config.upstream_url + raw.decode("latin-1")
        query = request.scope.get("query_string") or b""
        return url + "?" + query.decode("latin-1") if query else url

    async def send(self, req: httpx.Request, route: str, style: Style) -> httpx.Response | Response:
        """Send ``req`` (streaming); an upstream failure before any response becomes a 502/504 error response
        in ``style``."""
        try:
            return await self.client.send(req)
        except httpx.HTTPError as exc:
            status, message, kind = upstream_failure(exc)
            self.metrics.upstream_errors.labels(route, kind).inc()
            log.warning("proxy.upstream_error", route=route, error=type(exc).__name__, status=status)
            return error_response(style, status, message)

    # ---- sessions ------------------------------------------------------------------------------

    async def store_call(self, op: str, call: Awaitable[T]) -> T:
        """Await a store operation; a failure is counted and re-raised as :class:`StoreUnavailable`."""
        try:
            return await call
        except StoreUnavailable:
            self.metrics.store_errors.labels(op).inc()
            raise
        except Exception as exc:
            self.metrics.store_errors.labels(op).inc()
            raise StoreUnavailable(f"{op}: {type(exc).__name__}: {exc}") from exc

    async def close(self, tenant: str, sid: str, reason: str) -> LiveSession | None:
        """Close ``tenant``'s session ``sid`` (None when it is not live)."""
        sess = await self.store_call("close", self.store.close(tenant, sid, time.time(), reason))
        if sess is not None:
            await self.closed(sess, reason)
        return sess

    async def closed(self, sess: LiveSession, reason: str) -> None:
        """Announce a closed session: the ``close`` event, and ``/close_session`` on SGLang. Its pending
        keep-warm requests are dropped."""
        self.keep_warm.cancel(f"{sess.tenant}/{sess.sid}")
        emit(LifecycleEvent("close", sess.signal(), time.time(), reason), self.sinks)
        if self.config.engine == "sglang" and self._client is not None:
            task = asyncio.create_task(self._close_sglang(SGLangSink.sglang_id(sess.signal())))
            self._background.add(task)
            task.add_done_callback(self._background.discard)

    async def _close_sglang(self, sid: str) -> None:
        try:
            response = await self.client.post(self.config.upstream_url + "/close_session", json={"session_id": sid})
            if response.status_code >= 400:
                log.warning("sglang.close_session_failed", session_id=sid, status=response.status_code)
        except Exception as exc:  # fail open: the engine evicts the session's references eventually
            log.warning("sglang.close_session_failed", session_id=sid, error=type(exc).__name__)

    # ---- accounting ----------------------------------------------------------------------------

    def fail_open(self, stage: str, exc: BaseException) -> None:
        """Count and log one of agentcache's own failures (the request goes on unchanged)."""
        self.metrics.fail_open.labels(stage).inc()
        log.warning("proxy.fail_open", stage=stage, error=type(exc).__name__, detail=str(exc)[:500])

    def count_request(self, route: str, provider: str, model: str, status: str) -> None:
        """One relayed request."""
        self.metrics.requests.labels(route, provider, model_label(provider, model), status).inc()

    def _keep_warm_sent(self, outcome: str, usage: CacheUsage | None, model: str) -> None:
        self.metrics.keep_warm.labels(outcome).inc()
        if usage is not None:
            self.count_usage("anthropic", model, usage)

    def count_usage(self, provider: str, model: str, usage: CacheUsage) -> None:
        """Reported token counts."""
        label = model_label(provider, model)
        for kind, value in (
            ("prompt", usage.prompt_tokens),
            ("cache_read", usage.cache_read_tokens),
            ("cache_write", usage.cache_write_tokens),
            ("uncached", usage.uncached_tokens),
        ):
            self.metrics.tokens.labels(provider, label, kind).inc(value)
