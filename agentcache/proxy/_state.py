"""The proxy's process-wide state: config, the one pooled upstream client, the session manager (the same
:class:`~agentcache.Sessions` core every door drives, over the in-memory or Redis store), the target each
request's session plans for, metrics, the live report, the background work (idle sweeps, keep-warm) and the
``--record`` writer.

:meth:`ProxyState.startup` creates the ``httpx.AsyncClient`` (and connects the store); :meth:`shutdown` closes
them. The starlette lifespan calls both; tests may use ``async with state.running():``.
"""

from __future__ import annotations

import asyncio
import contextlib
from collections.abc import AsyncIterator, Awaitable, Callable
from typing import Any, TypeVar

import httpx
from starlette.requests import Request
from starlette.responses import Response

from .._config import Settings, get_settings
from .._log import get_logger
from ..model._parsememo import ParseMemo
from ..model._types import Api, Engine, parse_engine
from ..model._usage import CacheUsage
from ..session import MemoryStore, Session, Sessions, SGLangSink, StoreUnavailable
from ..session._store import TOMBSTONE_BYTES
from ..targets import EngineTarget, Target, aprobe, resolve_target
from ._budget import PARSE_MEMO_BYTES_PER_CHAR, Budget, memo_bytes
from ._config import ProxyConfig
from ._engine_arm import EngineArm
from ._errors import Style, error_response, failure_reason, upstream_failure
from ._keepwarm import KeepWarmer
from ._live import LiveReport
from ._metrics import ProxyMetrics, model_label
from ._multiproc import worker_metrics_dir
from ._record import Recorder
from ._trace import tracing_sink
from ._transport import CLOSES_AFTER_STREAM, ClosesAfterStream, UpstreamClient
from ._upstream import make_transport

__all__ = ["ProxyState"]

log = get_logger("agentcache.proxy")
T = TypeVar("T")


class ProxyState:
    """See the module docstring. ``transport``: an httpx transport for the upstream client (tests); ``store``: a
    session store (default: in memory with the config's limits, or Redis when ``config.redis_url`` is set)."""

    def __init__(
        self,
        config: ProxyConfig,
        *,
        settings: Settings | None = None,
        transport: httpx.AsyncBaseTransport | None = None,
        store: Any = None,
    ) -> None:
        self.config = config
        self.settings = settings or get_settings()
        self.metrics = ProxyMetrics(multiprocess_dir=worker_metrics_dir(config.workers))
        #: ``max_state_mb`` shared out among the structures below (:mod:`agentcache.proxy._budget`).
        self.budget = budget = Budget.of_mb(config.max_state_mb)
        self.report = LiveReport(
            self.metrics,
            config.simulate,
            config.report_max_sessions,
            config.report_max_records,
            max_bytes=budget.share("report"),
        )
        # Recent bodies' parses guide the next turn's (model/_parsememo).
        self.parse_memo = ParseMemo(budget=budget.share("parse_memo") // PARSE_MEMO_BYTES_PER_CHAR)
        self._transport = transport
        self._client: UpstreamClient | None = None
        self.declared: Target | None = None
        self.detected: Engine | None = None
        self._targets: dict[Api, Target] = {}
        sinks: list[Any] = [self.metrics.sink]
        if config.engine != "none":
            self.declared = resolve_target(Api.OPENAI_CHAT, declared=parse_engine(config.engine).value)
        if config.engine == "sglang":
            sinks.append(SGLangSink(config.upstream_url, post=self._post))
        self.sessions = Sessions(
            settings=self.settings,
            sinks=sinks,
            store=store if store is not None else self._default_store(),
            idle_timeout=config.idle_timeout,
            max_open=config.max_sessions,
            max_tombstones=config.max_tombstones,
            max_scope_bytes=budget.share("scopes"),
        )
        self._sweeper: asyncio.Task[None] | None = None
        self._background: set[asyncio.Task[Any]] = set()
        self.keep_warm = KeepWarmer(lambda: self.client, self._keep_warm_sent)
        #: ``--record``'s writer (:mod:`agentcache.proxy._record`), or None.
        self.recorder = Recorder.from_config(config, self.metrics.record_lines)

    @property
    def store(self) -> Any:
        """The session store (:class:`~agentcache.session.MemoryStore` or :class:`~agentcache.session.RedisStore`)."""
        return self.sessions.store

    def _default_store(self) -> Any:
        c = self.config
        limits = {
            "max_open": c.max_sessions,
            "max_bytes": self.budget.share("sessions"),
            "min_inner_match": c.min_inner_match,
        }
        if c.redis_url:
            from ..session._redis import RedisStore

            ttl = max(c.idle_timeout * 4, 3600.0)
            return RedisStore.from_url(
                c.redis_url, timeout=c.redis_timeout, prefix=c.redis_prefix, session_ttl=ttl, **limits
            )
        tombstones = max(1, min(c.max_tombstones, self.budget.share("tombstones") // TOMBSTONE_BYTES))
        return MemoryStore(max_tombstones=tombstones, **limits)

    def state_parts(self) -> dict[str, Callable[[], int]]:
        """Each part of the memory budget (:mod:`agentcache.proxy._budget`) → its estimated bytes now."""
        store = self.store
        parts: dict[str, Callable[[], int]] = {
            "report": self.report.estimated_bytes,
            "scopes": self.sessions.scope_bytes,
            "parse_memo": self.parse_memo.estimated_bytes,
            "memos": memo_bytes,
        }
        if isinstance(store, MemoryStore):
            parts["sessions"] = lambda: store.session_bytes
            parts["tombstones"] = lambda: store.tombstone_bytes
        else:
            parts["sessions"] = lambda: int(store.local_bytes)
        return parts

    def target_for(self, api: Api) -> Target:
        """The target a new session whose first request speaks ``api`` plans for: the ``target`` setting, else
        ``--engine``, else the engine the upstream answered as at start-up, else the API's provider."""
        target = self._targets.get(api)
        if target is None:
            target = resolve_target(api, setting=self.settings.target, declared=self.declared, detected=self.detected)
            self._targets[api] = target
        return target

    async def detect(self) -> None:
        """Ask a URL upstream whether it is a local engine (once, at start-up; a provider is never asked)."""
        c = self.config
        if c.upstream_kind != "url" or self.declared is not None or not self.settings.detect_engines:
            return
        # ``connection: close``: the answer leaves no idle connection in the pool.
        info = await aprobe(lambda url: self.client.get(url, headers=[(b"connection", b"close")]), c.upstream_url)
        self.detected = info.engine
        self._targets.clear()
        if info.engine is not None:
            log.info("proxy.engine_detected", engine=info.engine.value, upstream=c.upstream_url)

    # ---- lifecycle of the process ---------------------------------------------------------------

    @property
    def client(self) -> UpstreamClient:
        """The pooled upstream client (created by :meth:`startup`)."""
        if self._client is None:
            raise RuntimeError("the proxy is not started")
        return self._client

    async def startup(self) -> None:
        """Create the pooled upstream client, recognise a local engine, start the idle sweeper."""
        c = self.config
        transport = self._transport or make_transport(
            c, on_stale=lambda action: self.metrics.stale_connections.labels(action).inc()
        )
        timeout = httpx.Timeout(
            connect=c.connect_timeout, read=c.read_timeout, write=c.write_timeout, pool=c.pool_timeout
        )
        self._client = UpstreamClient(transport, timeout)
        self.metrics.measure(self.metrics.live_sessions, lambda: float(self.store.live()))
        self.budget.bound_memos()  # the process's memos: this proxy's process, this proxy's budget
        for part, measure in self.state_parts().items():
            self.metrics.measure(self.metrics.state_bytes.labels(part), lambda m=measure: float(m()))  # type: ignore[misc]
            self.metrics.state_budget.labels(part).set(self.budget.share(part))
        await self.detect()
        engine = self.declared.engine if isinstance(self.declared, EngineTarget) else self.detected
        if isinstance(transport, ClosesAfterStream) and engine in CLOSES_AFTER_STREAM:
            transport.closes_after_stream = True
        if engine == Engine.LLAMA_CPP and c.upstream_kind == "url":  # the live report's engine arm
            arm_client = httpx.AsyncClient(
                base_url=c.upstream_url, timeout=30.0, trust_env=False, transport=self._transport
            )
            self.report.engine = EngineArm(c.upstream_url, client=arm_client)
        self._sweeper = asyncio.create_task(self._sweep_loop())
        if self.recorder is not None:
            self.recorder.start()

    async def shutdown(self) -> None:
        """Stop the sweeper, close what this process alone holds, wait for pending posts, release clients."""
        if self._sweeper is not None:
            self._sweeper.cancel()
            with contextlib.suppress(asyncio.CancelledError):
                await self._sweeper
            self._sweeper = None
        await self.keep_warm.aclose()
        if self.sessions.memory:
            self.sessions.close_all("shutdown")
        for sink in self.sessions.sinks:
            if isinstance(sink, SGLangSink):
                await sink.aflush(5.0)
        if (tracer := tracing_sink(self.sessions.sinks)) is not None:  # the spans still pending (setting otel)
            await asyncio.to_thread(tracer.shutdown)
        if self._background:
            await asyncio.wait(set(self._background), timeout=5.0)
        if self.recorder is not None:  # after the last response: its line is queued
            await asyncio.to_thread(self.recorder.close)
        if self.report.engine is not None:
            await self.report.engine.aclose()
        if hasattr(self.store, "aclose"):
            await self.store.aclose()
        if self._client is not None:
            await self._client.aclose()
            self._client = None

    @contextlib.asynccontextmanager
    async def running(self) -> AsyncIterator[ProxyState]:
        """``startup`` … ``shutdown`` as a context manager; a session store that does not answer at startup is one
        warning then (requests still fail open), not news at the first request."""
        await self.startup()
        if not await self.store_ok():
            log.warning("store.unreachable", note="requests go upstream as sent (fail open) until it answers")
        try:
            yield self
        finally:
            await self.shutdown()

    async def _sweep_loop(self) -> None:
        while True:
            await asyncio.sleep(self.config.sweep_interval)
            await self.sweep()

    async def sweep(self) -> list[Session]:
        """Close sessions idle longer than ``idle_timeout`` (reason ``idle``)."""
        try:
            idle = await self.store_call(self.sessions.asweep())
        except Exception as exc:
            self.fail_open("sweep", exc)
            return []
        for sess in idle:
            self.keep_warm.cancel(f"{sess.tenant}/{sess.session_id}")
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
            log.warning(
                "proxy.upstream_error",
                route=route,
                status=status,
                upstream=f"{req.url.scheme}://{req.url.netloc.decode('ascii', 'replace')}",
                reason=failure_reason(exc),
                error=type(exc).__name__,
            )
            return error_response(style, status, message)

    async def _post(self, path: str, doc: dict[str, Any]) -> int:
        """POST ``doc`` to the upstream's ``path`` (SGLang ``/close_session``); the status code."""
        response = await self.client.post(self.config.upstream_url + path, json=doc)
        return response.status_code

    # ---- sessions ------------------------------------------------------------------------------

    async def store_call(self, call: Awaitable[T]) -> T:
        """Await a session-core call; a store failure (:class:`StoreUnavailable`, naming its operation) is counted
        in ``agentcache_proxy_store_errors_total{op}`` and re-raised."""
        try:
            return await call
        except StoreUnavailable as exc:
            self.metrics.store_errors.labels(exc.op).inc()
            raise

    async def close(self, tenant: str, sid: str, reason: str) -> Session | None:
        """Close ``tenant``'s session ``sid`` (None when it is not live); its pending keep-warm is dropped."""
        self.keep_warm.cancel(f"{tenant}/{sid}")
        return await self.store_call(self.sessions.aclose(sid, tenant=tenant, reason=reason))

    async def store_ok(self) -> bool:
        """Whether the session store answers now (the in-memory one always does)."""
        ping = getattr(self.store, "ping", None)
        return True if ping is None else bool(await ping())

    # ---- accounting ----------------------------------------------------------------------------

    def fail_open(self, stage: str, exc: BaseException) -> None:
        """Count and log one of agentcache's own failures (the request goes on unchanged)."""
        self.metrics.fail_open.labels(stage).inc()
        log.warning("proxy.fail_open", stage=stage, error=type(exc).__name__, detail=str(exc)[:500])

    def count_request(self, route: str, provider: str, model: str, status: str) -> None:
        """One request, relayed or answered by agentcache itself."""
        self.metrics.requests.labels(route, provider, model_label(provider, model), status).inc()

    def own_error(self, route: str, provider: str, style: Style, status: int, message: str) -> Response:
        """An error agentcache answers itself (400 unreadable body, 413 over the limit, 404/405 in its own
        namespace...), in the caller's ``style``, counted in ``agentcache_proxy_requests_total{status}``. A refusal
        (4xx) is logged here, once, with its reason (``proxy.refused``); a 500 is agentcache's own failure, logged
        by :meth:`fail_open`."""
        self.count_request(route, provider, "", str(status))
        if status < 500:
            log.info("proxy.refused", route=route, status=status, reason=message[:300])
        return error_response(style, status, message)

    def response_failed(self, stage: str, exc: BaseException) -> None:
        """A response of the upstream's that agentcache could not relay as built: ``response_header`` (a header
        of ours was no valid field and was left out) or ``response_start`` (the server refused the response
        start: the answer is lost). Neither is expected, so each is counted and logged, never silent."""
        self.fail_open(stage, exc)
        if stage == "response_start":
            log.error("proxy.response_lost", error=type(exc).__name__, detail=str(exc)[:500])

    def _keep_warm_sent(self, outcome: str, usage: CacheUsage | None, model: str) -> None:
        self.metrics.keep_warm.labels(outcome).inc()
        if usage is not None:  # no turn, but the upstream processed the prompt: counted as source keep_warm
            self.count_usage("anthropic", model, usage, "keep_warm")

    def count_usage(self, provider: str, model: str, usage: CacheUsage, source: str) -> None:
        """Reported token counts of a request that is no committed turn (``source``: ``uncommitted``,
        ``untracked`` or ``keep_warm``); a committed turn's are counted from its ``turn`` event by
        :attr:`metrics.sink <agentcache.proxy._metrics.ProxyMetrics.sink>`, like in every other door."""
        self.metrics.sink.count_tokens(provider, model, usage, source)
