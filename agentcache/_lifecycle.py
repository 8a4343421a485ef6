"""Session lifecycle signals: the four fields, turn reports, events, and where events go.

Every wrapped request yields a :class:`TurnReport` keyed by the four fields of design.md:
``prefix_identity`` (:class:`PrefixIdentity`), ``reuse_boundary`` (:class:`ReuseBoundary`),
``session_signal`` (:class:`SessionSignal`) and ``storage_tier`` (:class:`StorageTier`). Sessions emit
a :class:`LifecycleEvent` for each of ``open``, ``turn``, ``retry``, ``fork`` and ``close``:

* to structlog, logger ``agentcache.session``, event ``session.<name>`` at info level, with the four
  fields as dicts. Only ids, hashes and counts are logged: never prompt text or credentials;
* to every registered sink: a plain callable ``sink(event)``, :class:`SGLangSink` or
  :class:`PrometheusSink`. A sink may also have ``annotate(body, signal, base_url) -> body``, called
  on each outgoing wire body (the SGLang sink adds ``session_id`` there). A failing sink is logged
  and skipped: sinks never break a request (fail open).

Retry versus new generation (the contract):

* **retry** (same ``generation``, ``attempt`` + 1): the same turn is sent again after a transient
  error (timeout, 5xx, 429, a stream cut mid-way). The session's committed history is untouched, so
  the retried request is diagnosed against the last request that succeeded. The wrappers record this
  automatically whenever the SDK raises; agentcache never retries by itself.
* **new generation** (``session.restart()``, ``generation`` + 1): the logical session starts over
  from scratch (a subagent relaunched, a conversation reset or re-seeded). The old incarnation is
  closed (``close``, reason ``restart``) and a fresh one opened (``open``, reason ``restart``) with the
  same ``session_id`` and lineage; responses that arrive late for the old generation never change the
  new one's state.
"""

from __future__ import annotations

import importlib
import threading
from collections import OrderedDict
from collections.abc import Callable, Mapping
from concurrent.futures import Future, ThreadPoolExecutor, wait
from dataclasses import asdict, dataclass, field
from typing import Any, Literal, Protocol
from urllib.parse import urlsplit

import structlog

from ._canonical import CanonicalRequest
from ._diagnose import static_end
from ._exceptions import ConfigError
from ._usage import CacheUsage

__all__ = [
    "EVENTS",
    "LifecycleEvent",
    "PrefixIdentity",
    "PrometheusSink",
    "ReuseBoundary",
    "SGLangSink",
    "SessionSignal",
    "Sink",
    "StorageTier",
    "TurnReport",
]

log = structlog.get_logger("agentcache.session")

EventName = Literal["open", "turn", "retry", "fork", "close"]
EVENTS: tuple[EventName, ...] = ("open", "turn", "retry", "fork", "close")


@dataclass(frozen=True, slots=True)
class PrefixIdentity:
    """Which prefix a request has, as radix-tree path names (blake2b-128 chain hashes, hex).

    ``static``: the chain hash through the last options/tools/system block (the prefix family that
    sessions of one agent share; None when the request has none). ``head``: the chain hash of the
    whole request. ``blocks``/``tokens``: its length in canonical blocks and estimated tokens.
    """

    static: str | None
    head: str | None
    blocks: int
    tokens: int

    @classmethod
    def of(cls, req: CanonicalRequest) -> PrefixIdentity:
        """The identity of canonical request ``req``."""
        end = static_end(req)
        return cls(
            req.chain[end - 1].hex() if end else None,
            req.chain[-1].hex() if req.chain else None,
            len(req.blocks),
            req.tokens,
        )


@dataclass(frozen=True, slots=True)
class ReuseBoundary:
    """How deep the request can be served from cache.

    ``matched_blocks``/``matched_tokens``: the prefix shared with what this session last sent (the
    reuse agentcache expects; tokens are tiktoken estimates). ``reported_tokens``: what the upstream
    reported reading, in its own tokens (None before the response, or when not reported).
    ``cause``/``where``/``tokens_lost``: the break of the client's request against its previous one
    (a name from :mod:`agentcache._causes`, the first divergent unit, the tokens to process again);
    None/None/0 for an append-only turn.
    """

    matched_blocks: int
    matched_tokens: int
    reported_tokens: int | None = None
    cause: str | None = None
    where: str | None = None
    tokens_lost: int = 0


@dataclass(frozen=True, slots=True)
class SessionSignal:
    """Who sent it. ``generation``: incarnation of ``session_id`` (0 first); ``attempt``: failed
    tries of the current turn so far (0 on the first try); ``parent``: the forking session, for a
    subagent; ``lineage``: the root session id, shared by a whole subagent tree; ``turn``: turns
    committed in this generation before this one."""

    session_id: str
    generation: int
    attempt: int
    parent: str | None
    lineage: str
    turn: int = 0


@dataclass(frozen=True, slots=True)
class StorageTier:
    """Where the reused prefix lives and for how long. ``kind``: ``provider`` or ``engine``.
    ``ttl``: provider retention of the entries written/refreshed (Anthropic ``5m``/``1h`` as planned;
    OpenAI ``in_memory``, ``24h`` or the requested ``prompt_cache_options`` TTL); None for an engine.
    ``tiers``: the engine tiers the read tokens came from (SGLang ``device``/``host``/``storage``)."""

    kind: str
    ttl: str | None = None
    tiers: Mapping[str, int] = field(default_factory=dict)


@dataclass(frozen=True, slots=True)
class TurnReport:
    """One wrapped request: the four fields, normalised ``usage`` (None when the response carried
    none), its input-side ``cost_usd`` (None when unknown), the causes agentcache ``repairs``-ed, the
    block paths given a cache marker (``markers``), ``api``/``model``, and ``duration_s`` from send to
    the end of the response (or stream)."""

    api: str
    model: str
    prefix_identity: PrefixIdentity
    reuse_boundary: ReuseBoundary
    session_signal: SessionSignal
    storage_tier: StorageTier
    usage: CacheUsage | None = None
    cost_usd: float | None = None
    repairs: tuple[str, ...] = ()
    markers: tuple[str, ...] = ()
    duration_s: float | None = None

    def to_dict(self) -> dict[str, Any]:
        """JSON-ready dict (no prompt text)."""
        out = asdict(self)
        out["usage"] = self.usage.to_dict() if self.usage is not None else None
        out["storage_tier"]["tiers"] = dict(self.storage_tier.tiers)
        out["repairs"], out["markers"] = list(self.repairs), list(self.markers)
        return out


@dataclass(frozen=True, slots=True)
class LifecycleEvent:
    """One lifecycle signal. ``event``: one of :data:`EVENTS`; ``at``: wall-clock seconds.
    ``reason``: why (``open``: ``new``/``restart``/``resumed``; ``close``: ``closed``/``idle``/
    ``evicted``/``restart``/``shutdown``; ``retry``: the exception class name). ``report``: the turn
    report (``turn`` events). The four fields are None where they do not apply (no request yet)."""

    event: EventName
    session_signal: SessionSignal
    at: float
    reason: str | None = None
    prefix_identity: PrefixIdentity | None = None
    reuse_boundary: ReuseBoundary | None = None
    storage_tier: StorageTier | None = None
    report: TurnReport | None = None

    def log_fields(self) -> dict[str, Any]:
        """The structlog key/values: the four fields (flat dicts), reason, usage and cost for turns."""
        out: dict[str, Any] = {"reason": self.reason}
        for name in ("prefix_identity", "reuse_boundary", "session_signal", "storage_tier"):
            out[name] = _flat(getattr(self, name))
        if self.report is not None:
            out["usage"] = self.report.usage.to_dict() if self.report.usage is not None else None
            out["cost_usd"] = self.report.cost_usd
            out["repairs"] = list(self.report.repairs)
        return out


def _flat(value: Any) -> dict[str, Any] | None:
    """A field record as a plain dict (shallow; mappings copied): cheaper than ``asdict`` per event."""
    if value is None:
        return None
    out = {k: getattr(value, k) for k in value.__dataclass_fields__}
    return {k: dict(v) if isinstance(v, Mapping) else v for k, v in out.items()}


class Sink(Protocol):
    """Receives lifecycle events; a plain function ``(LifecycleEvent) -> None`` qualifies."""

    def __call__(self, event: LifecycleEvent, /) -> None: ...


def emit(event: LifecycleEvent, sinks: list[Sink] | tuple[Sink, ...]) -> None:
    """Log ``event`` and hand it to each sink; a sink that raises is logged and skipped."""
    log.info(f"session.{event.event}", **event.log_fields())
    for sink in sinks:
        try:
            sink(event)
        except Exception as exc:  # fail open: a sink never breaks the request path
            log.warning("session.sink_failed", sink=type(sink).__name__, error=type(exc).__name__, detail=str(exc))


def annotate(
    body: dict[str, Any], signal: SessionSignal, base_url: str | None, sinks: tuple[Sink, ...]
) -> dict[str, Any]:
    """``body`` after every sink's optional ``annotate`` hook; a failing hook is logged and skipped."""
    for sink in sinks:
        hook: Callable[[dict[str, Any], SessionSignal, str | None], dict[str, Any]] | None = getattr(
            sink, "annotate", None
        )
        if hook is None:
            continue
        try:
            body = hook(body, signal, base_url)
        except Exception as exc:
            log.warning("session.sink_failed", sink=type(sink).__name__, error=type(exc).__name__, detail=str(exc))
    return body


def _optional(module: str, user: str) -> Any:
    """Import an optional dependency of a sink; ConfigError with the install hint when it is missing."""
    try:
        return importlib.import_module(module)
    except ImportError:
        raise ConfigError(f"{user} needs {module}: pip install 'agentcache[sinks]'") from None


def _origin(url: str | None) -> str | None:
    """``scheme://host:port`` of ``url`` (default ports filled in), or None."""
    if not url:
        return None
    parts = urlsplit(str(url))
    if not parts.hostname:
        return None
    port = parts.port or (443 if parts.scheme == "https" else 80)
    return f"{parts.scheme}://{parts.hostname.lower()}:{port}"


class SGLangSink:
    """Session-aware caching on SGLang (0.5.23, ``--enable-session-radix-cache``).

    ``annotate`` adds a stable top-level ``session_id`` to every request bound for this server (its
    ``scheme://host:port`` equals ``base_url``'s); one id per generation (``<session_id>`` for
    generation 0, ``<session_id>:g<n>`` after), since SGLang tombstones a closed id. On ``close`` it
    sends ``POST {base_url}/close_session {"session_id"}`` for every id it annotated, so SGLang
    releases the session's references. Posts run on one background thread with ``timeout``
    seconds each; errors are logged and dropped (fail open). ``flush()`` waits for pending posts;
    ``shutdown()`` flushes and stops the thread. ``transport``: an httpx transport (tests).
    ``max_tracked``: ids remembered for closing (oldest dropped first).
    """

    def __init__(
        self, base_url: str, *, timeout: float = 2.0, transport: Any = None, max_tracked: int = 65_536
    ) -> None:
        httpx = _optional("httpx", "SGLangSink")
        root = str(base_url).rstrip("/")
        if root.endswith("/v1"):
            root = root[:-3]
        self.base_url = root
        self._origin = _origin(root)
        self._client = httpx.Client(base_url=root, timeout=timeout, transport=transport, trust_env=False)
        self._pool = ThreadPoolExecutor(max_workers=1, thread_name_prefix="agentcache-sglang")
        self._lock = threading.Lock()
        self._tracked: OrderedDict[str, None] = OrderedDict()
        self._pending: set[Future[None]] = set()
        self.max_tracked = max_tracked

    @staticmethod
    def sglang_id(signal: SessionSignal) -> str:
        """The ``session_id`` sent to SGLang for this generation of the session."""
        return signal.session_id if signal.generation == 0 else f"{signal.session_id}:g{signal.generation}"

    def annotate(self, body: dict[str, Any], signal: SessionSignal, base_url: str | None) -> dict[str, Any]:
        """``body`` with ``session_id`` when it is bound for this server (a new dict), else ``body``."""
        if base_url is None or _origin(base_url) != self._origin:
            return body
        sid = self.sglang_id(signal)
        with self._lock:
            self._tracked[sid] = None
            self._tracked.move_to_end(sid)
            while len(self._tracked) > self.max_tracked:
                self._tracked.popitem(last=False)
        return {**body, "session_id": sid}

    def __call__(self, event: LifecycleEvent) -> None:
        """On ``close``: post ``/close_session`` for the generation, if it was annotated."""
        if event.event != "close":
            return
        sid = self.sglang_id(event.session_signal)
        with self._lock:
            if self._tracked.pop(sid, False) is False:
                return
            future = self._pool.submit(self._post_close, sid)
            self._pending.add(future)
        future.add_done_callback(self._done)

    def _done(self, future: Future[None]) -> None:
        with self._lock:
            self._pending.discard(future)

    def _post_close(self, sid: str) -> None:
        try:
            response = self._client.post("/close_session", json={"session_id": sid})
            if response.status_code >= 400:
                log.warning("sglang.close_session_failed", session_id=sid, status=response.status_code)
        except Exception as exc:  # fail open: the engine just keeps the references until eviction
            log.warning("sglang.close_session_failed", session_id=sid, error=type(exc).__name__, detail=str(exc))

    def flush(self, timeout: float | None = None) -> None:
        """Wait up to ``timeout`` seconds for pending ``/close_session`` posts."""
        with self._lock:
            pending = set(self._pending)
        wait(pending, timeout=timeout)

    def shutdown(self) -> None:
        """Flush, stop the worker thread and close the HTTP client."""
        self._pool.shutdown(wait=True)
        self._client.close()


class PrometheusSink:
    """Prometheus counters: ``<namespace>_session_events_total{event}`` per lifecycle event, and
    ``<namespace>_prompt_tokens_total{kind}`` (``cache_read``, ``cache_write``, ``uncached``) from
    turn usage. ``registry``: a ``prometheus_client.CollectorRegistry`` (default: the global one;
    registering the same names twice in one registry raises ``ValueError``)."""

    def __init__(self, registry: Any = None, namespace: str = "agentcache") -> None:
        prometheus = _optional("prometheus_client", "PrometheusSink")
        reg = registry if registry is not None else prometheus.REGISTRY
        counter = prometheus.Counter
        self.events = counter(
            "session_events", "agentcache session lifecycle events", ["event"], namespace=namespace, registry=reg
        )
        self.tokens = counter(
            "prompt_tokens",
            "Prompt tokens of wrapped requests by cache outcome",
            ["kind"],
            namespace=namespace,
            registry=reg,
        )
        for name in EVENTS:  # export every series from the start, at 0
            self.events.labels(event=name)

    def __call__(self, event: LifecycleEvent) -> None:
        """Count ``event`` (and its usage, for turns)."""
        self.events.labels(event=event.event).inc()
        usage = event.report.usage if event.report is not None else None
        if usage is not None:
            self.tokens.labels(kind="cache_read").inc(usage.cache_read_tokens)
            self.tokens.labels(kind="cache_write").inc(usage.cache_write_tokens)
            self.tokens.labels(kind="uncached").inc(usage.uncached_tokens)
