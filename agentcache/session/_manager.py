"""The state and helpers of the session manager (:class:`~agentcache.Sessions` builds on it): configuration,
lookups, the cache scopes and lineages, the pipeline factory, store calls that fail as
:class:`~agentcache.session.StoreUnavailable`, and the lifecycle operations that need no request (forks,
restarts, closes, idle sweeps). The rules are the ones of :mod:`agentcache.session._sessions`.
"""

from __future__ import annotations

import threading
import time
from collections import OrderedDict
from collections.abc import Iterable
from typing import TYPE_CHECKING, Any, cast

from .._config import Settings, get_settings
from .._exceptions import ConfigError
from .._log import get_logger
from ..model._fields import LifecycleEvent
from ..model._totals import UsageTotals
from ..model._types import TargetKind
from ..targets import Target, target_named
from ._coalesce import Coalescer, Hold, Ticket
from ._identity import LOCAL_TENANT
from ._lifecycle import Sink, emit
from ._lineage import LINEAGE_BYTES, SIBLING_BLOCKS, SIBLING_HASH_BYTES, Lineage
from ._pipeline import ScopeMemory, SessionPipeline
from ._session import Session
from ._sinks import otel_sink
from ._store import AsyncSessionStore, MemoryStore, Opened, SessionStore, StoreUnavailable, Tombstone

if TYPE_CHECKING:
    from ._sessions import Sessions

__all__ = ["DEFAULT_IDLE_TIMEOUT", "SIBLING_BLOCKS", "Lineage", "Manager", "SessionClosedError"]

log = get_logger("agentcache.session")

DEFAULT_IDLE_TIMEOUT = 3600.0
DEFAULT_MAX_LINEAGES = 4096
DEFAULT_MAX_SCOPES = 1024


class SessionClosedError(ConfigError):
    """A subagent forked from a session that was closed (the caller's mistake)."""


DEFAULT_MAX_SCOPE_BYTES = 64 * 1024 * 1024


class Manager:
    """The session manager's state and the operations that need no request (see the module docstring).

    ``provider``: the target every session plans for, as declared by the door (``anthropic``, ``openai``,
    ``engine``, an engine name, or a :class:`~agentcache.targets.Target`); None lets each session take it from
    its first request. ``model``: rules and prices as this model. ``settings``: default the process settings.
    ``sinks``: lifecycle event sinks. ``store``: default a :class:`MemoryStore` with the limits given here.
    ``idle_timeout``: seconds (None: never). ``clock``: wall-clock seconds (tests pass a fake). ``max_scope_bytes``:
    estimated bytes of the cache scopes' memory and the lineages together (:meth:`scope_bytes`), least recently used
    forgotten first.
    """

    def __init__(
        self,
        *,
        provider: str | Target | None = None,
        model: str | None = None,
        settings: Settings | None = None,
        sinks: Iterable[Sink] = (),
        store: SessionStore | AsyncSessionStore | None = None,
        idle_timeout: float | None = DEFAULT_IDLE_TIMEOUT,
        max_open: int = 10_000,
        max_tombstones: int = 8192,
        max_lineages: int = DEFAULT_MAX_LINEAGES,
        max_bytes: int = 256 * 1024 * 1024,
        max_scope_bytes: int = DEFAULT_MAX_SCOPE_BYTES,
        clock: Any = time.time,
    ) -> None:
        if min(max_open, max_tombstones, max_lineages, max_bytes) < 1:
            raise ConfigError("session limits must be positive")
        self.provider = target_named(provider, model=model) if provider is not None else None
        self.model, self.idle_timeout, self.clock = model, idle_timeout, clock
        self.settings = settings or get_settings()
        self.store: Any = (
            store
            if store is not None
            else MemoryStore(max_open=max_open, max_tombstones=max_tombstones, max_bytes=max_bytes)
        )
        self.memory = isinstance(self.store, MemoryStore)
        if hasattr(self.store, "bind"):
            self.store.bind(self)
        self.max_lineages, self.max_scope_bytes = max_lineages, max_scope_bytes
        self._lineage_bytes = 0
        #: Registered lifecycle sinks; append or remove at any time.
        self.sinks: list[Sink] = list(sinks)
        if self.settings.otel:
            self.sinks.append(otel_sink())
        self._lock = threading.RLock()
        self._lineages: OrderedDict[str, Lineage] = OrderedDict()
        self._scopes: OrderedDict[tuple[str, TargetKind], ScopeMemory] = OrderedDict()
        self._seq = 0
        #: Holds sibling requests until the one writing their shared prefix answers (setting ``coalesce``).
        self.coalescer = Coalescer(
            enabled=self.settings.coalesce, timeout=self.settings.coalesce_timeout, on_hold=self._coalesced
        )

    def claim(self, turn: Any) -> Ticket | None:
        """The coalescing ticket of a prepared ``turn`` (a :class:`~agentcache.session.Turn`): None when it is not
        coalesced (setting off, a local engine, nothing cacheable, no event loop). Never raises."""
        target = turn.session.target
        if target is None:
            return None
        engine = target.kind == TargetKind.ENGINE
        provider = "anthropic" if target.kind == TargetKind.ANTHROPIC else "openai"
        return self.coalescer.claim(turn.session.tenant, turn.prepared.planned, provider=provider, engine=engine)

    def _coalesced(self, hold: Hold) -> None:
        """Hand a :class:`Hold` to every sink that counts them (``coalesced``, as :class:`PrometheusSink`)."""
        for sink in self.sinks:
            fn = getattr(sink, "coalesced", None)
            if callable(fn):
                fn(hold)

    # ---- lookups -----------------------------------------------------------------------------

    def __len__(self) -> int:
        return int(self.store.live())

    def __bool__(self) -> bool:  # an empty manager is still a manager (``x if sessions else None``)
        return True

    def get(self, session_id: str, *, tenant: str = LOCAL_TENANT) -> Session | None:
        """The live session ``session_id`` of ``tenant``, or None."""
        with self._lock:
            return self._sync_store().get(tenant, session_id)

    def tombstone(self, session_id: str, *, tenant: str = LOCAL_TENANT) -> Tombstone | None:
        """The tombstone of closed id ``session_id``, or None (open, unknown, or forgotten)."""
        with self._lock:
            return self._sync_store().tombstone(tenant, session_id)

    def accepts(self, session_id: str, generation: int, *, tenant: str = LOCAL_TENANT) -> bool:
        """True when a response for ``(session_id, generation)`` may still change state."""
        sess = self.get(session_id, tenant=tenant)
        return sess is not None and sess.generation == generation

    def totals(self, session_id: str, *, tenant: str = LOCAL_TENANT) -> UsageTotals | None:
        """Usage totals of a live or tombstoned session id."""
        sess = self.get(session_id, tenant=tenant)
        if sess is not None:
            return sess.totals
        tomb = self.tombstone(session_id, tenant=tenant)
        return tomb.totals if tomb is not None else None

    def lineage_totals(self, lineage: str) -> UsageTotals | None:
        """Usage totals over every session of ``lineage`` (a root session id and its subagents)."""
        with self._lock:
            state = self._lineages.get(lineage)
            return state.totals if state is not None else None

    def scope(self, tenant: str, kind: TargetKind) -> ScopeMemory:
        """The cache-scope memory shared by ``tenant``'s sessions on targets of ``kind`` (bounded LRU)."""
        with self._lock:
            key = (tenant, kind)
            scope = self._scopes.pop(key, None)
            if scope is None:
                scope = ScopeMemory()
                scope.keys.rpm_per_key = self.settings.openai_rpm_per_key
                scope.keys.max_families = self.settings.openai_key_families
            self._scopes[key] = scope
            while len(self._scopes) > DEFAULT_MAX_SCOPES:
                self._scopes.popitem(last=False)
            return scope

    def scope_bytes(self) -> int:
        """Estimated bytes of the cache scopes' memory (key planners, first tool sets) and the lineages."""
        with self._lock:
            return self._lineage_bytes + sum(scope.estimated_bytes() for scope in self._scopes.values())

    def _bound_scopes(self) -> None:
        """Forget least recently used lineages, scopes, tool sets and key families until :meth:`scope_bytes` is
        within ``max_scope_bytes`` (lineages keep at most a quarter; a forgotten scope starts over)."""
        while self.scope_bytes() > self.max_scope_bytes:
            if self._lineages and (self._lineage_bytes > self.max_scope_bytes // 4 or not self._scopes):
                self._forget_lineage()
            elif len(self._scopes) > 1:
                self._scopes.popitem(last=False)
            elif not next(iter(self._scopes.values())).forget_oldest():
                if not self._lineages:
                    return
                self._forget_lineage()

    def pipeline_for(self, sess: Session, snapshot: dict[str, Any] | None) -> SessionPipeline:
        """A pipeline for ``sess`` (rebuilt from ``snapshot`` when given), in its tenant's cache scope."""
        assert sess.target is not None
        scope = self.scope(sess.tenant, sess.target.kind)
        if snapshot is not None:
            return SessionPipeline.from_snapshot(
                snapshot,
                sess.target,
                scope=scope,
                settings=self.settings,
                session=sess.session_id,
                lineage=sess.lineage,
            )
        return SessionPipeline(
            sess.target, scope=scope, settings=self.settings, session=sess.session_id, lineage=sess.lineage
        )

    def _sync_store(self) -> SessionStore:
        if not self.memory and not isinstance(self.store, MemoryStore):
            raise ConfigError(f"{type(self.store).__name__} is asynchronous: use the a-prefixed methods")
        return self.store  # type: ignore[no-any-return]

    def _call(self, op: str, fn: Any, *args: Any, **kwargs: Any) -> Any:
        """A store operation; any failure becomes :class:`StoreUnavailable` naming ``op``."""
        try:
            return fn(*args, **kwargs)
        except StoreUnavailable:
            raise
        except Exception as exc:
            raise StoreUnavailable(f"{op}: {type(exc).__name__}: {exc}", op=op) from exc

    async def _acall(self, op: str, fn: Any, *args: Any, **kwargs: Any) -> Any:
        """:meth:`_call` for an asynchronous store."""
        try:
            return await fn(*args, **kwargs)
        except StoreUnavailable:
            raise
        except Exception as exc:
            raise StoreUnavailable(f"{op}: {type(exc).__name__}: {exc}", op=op) from exc

    def _lineage(self, lineage: str) -> Lineage:
        state = self._lineages.pop(lineage, None)
        if state is None:
            state = Lineage()
            self._lineage_bytes += LINEAGE_BYTES
        self._lineages[lineage] = state
        while len(self._lineages) > self.max_lineages:
            self._forget_lineage()
        return state

    def _forget_lineage(self) -> None:
        _, old = self._lineages.popitem(last=False)
        self._lineage_bytes -= LINEAGE_BYTES + SIBLING_HASH_BYTES * len(old.sibling or ())

    def _set_sibling(self, state: Lineage, chain: tuple[bytes, ...]) -> None:
        """``state``'s latest subagent's first prefix is ``chain`` (counted in :meth:`scope_bytes`)."""
        self._lineage_bytes += SIBLING_HASH_BYTES * (len(chain) - len(state.sibling or ()))
        state.sibling = chain

    def _emit(self, events: list[LifecycleEvent]) -> None:
        sinks = tuple(self.sinks)
        for event in events:
            emit(event, sinks)

    def _opened(self, opened: Opened, now: float, events: list[LifecycleEvent]) -> Session:
        events.extend(old.event("close", now, "evicted") for old in opened.evicted)
        if opened.reason is not None:
            events.append(opened.session.event("open", now, opened.reason))
        return opened.session

    def _factory(self, target: Target | None, model: str | None, explicit: bool) -> Any:
        def create(
            tenant: str, sid: str, parent: str | None, lineage: str, generation: int, snap: dict[str, Any] | None
        ) -> Session:
            known = target_named(snap["target"], model=model) if snap is not None and snap.get("target") else target
            if self.settings.target != "auto":  # the explicit setting beats whatever the door declared
                known = target_named(self.settings.target, model=model)
            return Session(
                cast("Sessions", self),  # a Manager is always the base of the Sessions driving it
                tenant,
                sid,
                parent,
                lineage,
                generation,
                target=known,
                model=model,
                explicit=explicit,
                snapshot=snap,
            )

        return create

    # ---- opening -----------------------------------------------------------------------------

    def fork(self, parent: Session, name: str, model: str | None) -> Session:
        """See :meth:`Session.fork`."""
        events: list[LifecycleEvent] = []
        with self._lock:
            if parent.closed:
                raise SessionClosedError(f"session {parent.session_id} is closed")
            store, now = self._sync_store(), self.clock()
            self._sweep(now, events)
            n = parent._forks.get(name, 0)
            while True:
                n += 1
                sid = f"{parent.session_id}/{name}" if n == 1 else f"{parent.session_id}/{name}-{n}"
                if store.get(parent.tenant, sid) is None and store.tombstone(parent.tenant, sid) is None:
                    break
            if len(parent._forks) < 256 or name in parent._forks:
                parent._forks[name] = n
            opened = store.open(
                parent.tenant,
                sid,
                parent=parent.session_id,
                explicit=True,
                now=now,
                create=self._factory(parent.target, model or parent.model, True),
                reuse=None,
            )
            events.extend(old.event("close", now, "evicted") for old in opened.evicted)
            child = opened.session
            store.get(parent.tenant, parent.session_id)
            parent.last_active = max(parent.last_active, now)  # the parent is active
            events.append(child.event("fork", now, name, parent))
        self._emit(events)
        return child

    def restart(self, sess: Session) -> None:
        """See :meth:`Session.restart`."""
        events: list[LifecycleEvent] = []
        with self._lock:
            store, now = self._sync_store(), self.clock()
            if not sess.closed:
                store.close(sess.tenant, sess.session_id, reason="restart", now=now)
                events.append(sess.event("close", now, "restart"))
            opened = store.open(
                sess.tenant,
                sess.session_id,
                parent=sess.parent,
                explicit=True,
                now=now,
                create=self._factory(None, None, True),
                reuse=sess,
            )
            self._opened(opened, now, events)
        self._emit(events)

    def close(self, session_id: str, *, tenant: str = LOCAL_TENANT, reason: str = "closed") -> Session | None:
        """Close ``tenant``'s live session ``session_id`` (``close`` event); None when it is not live."""
        events: list[LifecycleEvent] = []
        with self._lock:
            now = self.clock()
            sess = self._sync_store().close(tenant, session_id, reason=reason, now=now)
            if sess is not None:
                events.append(sess.event("close", now, reason))
        self._emit(events)
        return sess

    async def aclose(self, session_id: str, *, tenant: str = LOCAL_TENANT, reason: str = "closed") -> Session | None:
        """:meth:`close` for async code (required with an asynchronous store)."""
        if self.memory:
            return self.close(session_id, tenant=tenant, reason=reason)
        now = self.clock()
        sess = await self._acall("close", self.store.close, tenant, session_id, reason=reason, now=now)
        if sess is not None:
            self._emit([sess.event("close", now, reason)])
        return sess  # type: ignore[no-any-return]

    def _sweep(self, now: float, events: list[LifecycleEvent]) -> None:
        if self.idle_timeout is None or not isinstance(self.store, MemoryStore):
            return
        events.extend(s.event("close", now, "idle") for s in self.store.sweep(now, self.idle_timeout))

    def sweep(self, now: float | None = None) -> int:
        """Close sessions idle longer than ``idle_timeout``; returns how many were closed."""
        events: list[LifecycleEvent] = []
        with self._lock:
            self._sweep(self.clock() if now is None else now, events)
        self._emit(events)
        return len(events)

    async def asweep(self, now: float | None = None) -> list[Session]:
        """:meth:`sweep` for async code; returns the sessions closed."""
        now = self.clock() if now is None else now
        if self.idle_timeout is None:
            return []
        if self.memory:
            with self._lock:
                closed = self.store.sweep(now, self.idle_timeout)
        else:
            closed = await self._acall("sweep", self.store.sweep, now, self.idle_timeout)
        self._emit([s.event("close", now, "idle") for s in closed])
        return list(closed)

    def close_all(self, reason: str = "shutdown") -> None:
        """Close every live session (in-memory store)."""
        events: list[LifecycleEvent] = []
        with self._lock:
            now = self.clock()
            store = self._sync_store()
            for sess in list(self.store.sessions()):
                if store.close(sess.tenant, sess.session_id, reason=reason, now=now) is not None:
                    events.append(sess.event("close", now, reason))
        self._emit(events)
