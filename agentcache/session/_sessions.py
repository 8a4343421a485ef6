"""The session manager every door drives: :class:`Sessions` (one per process, or per proxy app).

One set of rules, identical in ``wrap()``, the proxy, ``audit`` and ``replay``:

* **identity**: a request's session is found per :class:`~agentcache.session.Identity` (explicit id > client
  declaration > ``prompt_cache_key`` > the prefix index > a new id), within its tenant;
* **target**: decided at a session's first request (:func:`agentcache.targets.resolve_target`) and kept;
* **close**: a closed session accepts no late response; a request that comes for its id later starts the next
  generation (``open``, reason ``resumed`` after an idle close or an eviction, ``restart`` after an explicit
  close or a restart), so nothing is ever refused;
* **idle**: sessions idle longer than ``idle_timeout`` seconds are closed (reason ``idle``); with the in-memory
  store every request sweeps (cheap: the least recently active is checked first); the proxy also sweeps on a
  timer;
* **late responses**: a commit counts only while its turn is current (same generation, nothing committed
  since); :meth:`accepts` tells whether a ``(session_id, generation)`` may still change state.

Stores: :class:`~agentcache.session.MemoryStore` (default; thread-safe through this manager's lock) or an
asynchronous store such as :class:`~agentcache.session.RedisStore` (then use the ``a``-prefixed methods).
Events (``open``, ``turn``, ``retry``, ``fork``, ``close``) go to the ``agentcache.session`` logger and to every
sink, outside the lock. Usage totals per session and per lineage are this process's.
"""

from __future__ import annotations

import threading
import time
import uuid
from collections import OrderedDict
from collections.abc import Iterable
from dataclasses import dataclass, field
from typing import Any

from .._config import Settings, get_settings
from .._exceptions import ConfigError
from .._log import get_logger
from ..model._fields import LifecycleEvent, TurnReport
from ..model._rawjson import RawBody
from ..model._totals import UsageTotals
from ..model._types import Api, TargetKind
from ..model._usage import CacheUsage
from ..targets import Target, resolve_target, target_named
from ._identity import LOCAL_TENANT, Identity, checkpoints_of, new_session_id
from ._lifecycle import Sink, annotate, emit
from ._pipeline import ScopeMemory, SessionPipeline
from ._session import UNSET, Session
from ._store import AsyncSessionStore, MemoryStore, Opened, SessionStore, StoreUnavailable, Tombstone
from ._turn import Turn, build_report

__all__ = ["DEFAULT_IDLE_TIMEOUT", "Lineage", "SessionClosedError", "Sessions"]

log = get_logger("agentcache.session")

#: A session with no request for this long is closed (reason ``idle``), in every door.
DEFAULT_IDLE_TIMEOUT = 3600.0
DEFAULT_MAX_LINEAGES = 4096
DEFAULT_MAX_SCOPES = 1024
_MAX_ID = 256


class SessionClosedError(ConfigError):
    """A subagent forked from a session that was closed (the caller's mistake)."""


@dataclass(slots=True)
class Lineage:
    """What a manager keeps per lineage (a root session and its subagents): usage ``totals`` and the OpenAI
    ``routing_key`` its first request got, which every later session of the lineage reuses, so all land where
    the lineage's prefixes are cached."""

    totals: UsageTotals = field(default_factory=UsageTotals)
    routing_key: str | None = None


class Sessions:
    """The session manager (see the module docstring).

    ``provider``: the target every session plans for, as declared by the door (``anthropic``, ``openai``,
    ``engine``, an engine name, or a :class:`~agentcache.targets.Target`); None lets each session take it from
    its first request. ``model``: rules and prices as this model. ``settings``: default the process settings.
    ``sinks``: lifecycle event sinks. ``store``: default a :class:`MemoryStore` with the limits given here.
    ``idle_timeout``: seconds (None: never). ``clock``: wall-clock seconds (tests pass a fake).
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
        self.max_lineages = max_lineages
        #: Registered lifecycle sinks; append or remove at any time.
        self.sinks: list[Sink] = list(sinks)
        self._lock = threading.RLock()
        self._lineages: OrderedDict[str, Lineage] = OrderedDict()
        self._scopes: OrderedDict[tuple[str, TargetKind], ScopeMemory] = OrderedDict()
        self._seq = 0

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
            self._scopes[key] = scope
            while len(self._scopes) > DEFAULT_MAX_SCOPES:
                self._scopes.popitem(last=False)
            return scope

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
        state = self._lineages.pop(lineage, None) or Lineage()
        self._lineages[lineage] = state
        while len(self._lineages) > self.max_lineages:
            self._lineages.popitem(last=False)
        return state

    def _emit(self, events: list[LifecycleEvent]) -> None:
        sinks = tuple(self.sinks)
        for event in events:
            emit(event, sinks)

    def _factory(self, target: Target | None, model: str | None, explicit: bool) -> Any:
        def create(
            tenant: str, sid: str, parent: str | None, lineage: str, generation: int, snap: dict[str, Any] | None
        ) -> Session:
            known = target_named(snap["target"], model=model) if snap is not None and snap.get("target") else target
            if self.settings.target != "auto":  # the explicit setting beats whatever the door declared
                known = target_named(self.settings.target, model=model)
            return Session(
                self,
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

    def session(
        self,
        session_id: str | None = None,
        *,
        tenant: str = LOCAL_TENANT,
        parent: str | None = None,
        provider: str | Target | None = None,
        model: str | None = None,
    ) -> Session:
        """The live session ``session_id`` (a new id when None), opened if needed (``open`` event).
        ``provider``: its target (default: the manager's, else decided at its first request)."""
        target = target_named(provider, model=model) if provider is not None else self.provider
        events: list[LifecycleEvent] = []
        with self._lock:
            now = self.clock()
            self._sweep(now, events)
            opened = self._sync_store().open(
                tenant,
                session_id or uuid.uuid4().hex,
                parent=parent,
                explicit=True,
                now=now,
                create=self._factory(target, model or self.model, True),
                reuse=None,
            )
            sess = self._opened(opened, now, events)
        self._emit(events)
        return sess

    def _opened(self, opened: Opened, now: float, events: list[LifecycleEvent]) -> Session:
        events.extend(old.event("close", now, "evicted") for old in opened.evicted)
        if opened.reason is not None:
            events.append(opened.session.event("open", now, opened.reason))
        return opened.session

    def _identify(
        self, identity: Identity, api: Api, body: dict[str, Any], raw: RawBody | None
    ) -> tuple[str | None, bool, tuple[bytes, ...]]:
        """``(session id or None to look up, explicit, checkpoints)`` of a request (precedence: module docstring)."""
        if identity.session:
            return identity.session[:_MAX_ID], True, ()
        if identity.cache_key:
            return identity.cache_key[:_MAX_ID], True, ()
        if identity.infer:
            return None, False, checkpoints_of(api, body, raw)
        return new_session_id(), True, ()

    def begin(
        self,
        api: Api | str,
        body: dict[str, Any],
        *,
        identity: Identity | None = None,
        now: float | None = None,
        at: float | None = UNSET,
        raw: RawBody | None = None,
        base_url: str | None = None,
        target: Target | None = None,
        reuse: Session | None = None,
        size: int | None = None,
    ) -> Turn:
        """Find or open the session of ``identity`` and prepare wire ``body`` of ``api`` for it; returns the
        :class:`~agentcache.session.Turn`. ``now``: clock seconds (default the manager's clock); ``at``: the
        request's time for planning (default ``now``; None when unknown, as in recorded traffic without
        timestamps); ``raw``: source texts; ``base_url``: the destination (sinks' ``annotate``); ``target``: the
        door's resolution for a session that has none; ``reuse``: the caller's session object; ``size``: the
        body's bytes when known. Raises InputError for a malformed body, leaving no trace."""
        api, identity = Api(api), identity or Identity()
        events: list[LifecycleEvent] = []
        with self._lock:
            store = self._sync_store()
            now = self.clock() if now is None else now
            self._sweep(now, events)
            sid, explicit, cps = self._identify(identity, api, body, raw)
            if sid is None:
                sid = self._call("find", store.find, identity.tenant, cps) or new_session_id()
            opened = self._call(
                "open",
                store.open,
                identity.tenant,
                sid,
                parent=identity.parent,
                explicit=explicit,
                now=now,
                create=self._factory(self.provider, self.model, explicit),
                reuse=reuse,
            )
            sess = self._opened(opened, now, events)
            turn = self._prepare(sess, api, body, now if at is UNSET else at, raw, base_url, target, cps, size)
        self._emit(events)
        return turn

    async def abegin(
        self,
        api: Api | str,
        body: dict[str, Any],
        *,
        identity: Identity | None = None,
        now: float | None = None,
        at: float | None = UNSET,
        raw: RawBody | None = None,
        base_url: str | None = None,
        target: Target | None = None,
        reuse: Session | None = None,
        size: int | None = None,
    ) -> Turn:
        """:meth:`begin` for async code (required with an asynchronous store)."""
        if self.memory:
            return self.begin(
                api,
                body,
                identity=identity,
                now=now,
                at=at,
                raw=raw,
                base_url=base_url,
                target=target,
                reuse=reuse,
                size=size,
            )
        api, identity = Api(api), identity or Identity()
        now = self.clock() if now is None else now
        sid, explicit, cps = self._identify(identity, api, body, raw)
        if sid is None:
            sid = await self._acall("find", self.store.find, identity.tenant, cps) or new_session_id()
        opened = await self._acall(
            "open",
            self.store.open,
            identity.tenant,
            sid,
            parent=identity.parent,
            explicit=explicit,
            now=now,
            create=self._factory(self.provider, self.model, explicit),
            reuse=reuse,
        )
        events: list[LifecycleEvent] = []
        sess = self._opened(opened, now, events)
        turn = self._prepare(sess, api, body, now if at is UNSET else at, raw, base_url, target, cps, size)
        self._emit(events)
        return turn

    def _resolve(self, api: Api, target: Target | None) -> Target:
        if self.settings.target != "auto":
            return resolve_target(api, setting=self.settings.target, model=self.model)
        return target or self.provider or resolve_target(api, model=self.model)

    def _prepare(
        self,
        sess: Session,
        api: Api,
        body: dict[str, Any],
        at: float | None,
        raw: RawBody | None,
        base_url: str | None,
        target: Target | None,
        checkpoints: tuple[bytes, ...],
        size: int | None,
    ) -> Turn:
        if sess.target is None:
            sess.target = self._resolve(api, target)
        lineage = self._lineages.get(sess.lineage)
        prepared = sess.pipeline.prepare(
            api, body, now=at, raw=raw, routing_key=lineage.routing_key if lineage is not None else None
        )
        wire = annotate(prepared.body, sess.signal, base_url, tuple(self.sinks))
        self._seq += 1
        return Turn(sess, self._seq, api, prepared, wire, checkpoints, size)

    # ---- completing turns ------------------------------------------------------------------------

    def commit_turn(self, turn: Turn) -> bool:
        """See :meth:`Turn.commit`."""
        events: list[LifecycleEvent] = []
        with self._lock:
            if turn.committed is not None:
                return turn.committed
            now = self.clock()
            sess, before = turn.session, turn.session.body_bytes
            if turn.size is not None:
                sess.body_bytes = turn.size  # the store's memory estimate of the session uses it
            try:
                ok = self._sync_store().commit(
                    turn.session, turn.prepared, base=turn.base, checkpoints=turn.checkpoints, now=now
                )
                if not ok:
                    sess.body_bytes = before
            except Exception as exc:  # an agentcache bug must not break the caller's successful request
                log.warning("session.commit_failed", session_id=turn.session.session_id, error=type(exc).__name__)
                turn.committed = False
                turn.done = True
                return False
            self._committed(turn, ok, now, events)
        self._emit(events)
        return ok

    async def acommit_turn(self, turn: Turn) -> bool:
        """See :meth:`Turn.acommit`."""
        if self.memory:
            return self.commit_turn(turn)
        if turn.committed is not None:
            return turn.committed
        now = self.clock()
        try:
            ok = bool(
                await self._acall(
                    "commit",
                    self.store.commit,
                    turn.session,
                    turn.prepared,
                    base=turn.base,
                    checkpoints=turn.checkpoints,
                    now=now,
                )
            )
        except StoreUnavailable:
            turn.committed, turn.done = False, True
            raise
        events: list[LifecycleEvent] = []
        with self._lock:
            self._committed(turn, ok, now, events)
        self._emit(events)
        return ok

    def _committed(self, turn: Turn, ok: bool, now: float, events: list[LifecycleEvent]) -> None:
        turn.committed = ok
        sess = turn.session
        if not ok:
            turn.done = True
            log.debug("session.stale", session_id=sess.session_id, generation=turn.generation, outcome="commit")
            return
        sess.attempt = 0
        state = self._lineage(sess.lineage)
        state.routing_key = state.routing_key or turn.prepared.state.routing_key
        if isinstance(self.store, MemoryStore):
            events.extend(old.event("close", now, "evicted") for old in self.store.over_budget(now, sess))

    def finish_turn(self, turn: Turn, usage: CacheUsage | None, duration: float | None, cut: bool) -> TurnReport | None:
        """See :meth:`Turn.finish`."""
        if not turn.committed or turn.done:
            return None
        turn.done = True
        report = build_report(turn, usage, duration)
        events: list[LifecycleEvent] = []
        with self._lock:
            sess, now = turn.session, self.clock()
            current = not sess.closed and sess.generation == turn.generation
            if current:
                sess.last_report = report
            if usage is not None:
                sess.totals.add(usage, report.cost_usd)
                self._lineage(sess.lineage).totals.add(usage, report.cost_usd)
            events.append(
                LifecycleEvent(
                    "turn",
                    report.session_signal,
                    now,
                    None,
                    report.prefix_identity,
                    report.reuse_boundary,
                    report.storage_tier,
                    report,
                )
            )
            if cut and current:
                sess.attempt += 1
                events.append(sess.event("retry", now, "stream_cut"))
        self._emit(events)
        return report

    def fail_turn(self, turn: Turn, reason: str) -> None:
        """See :meth:`Turn.fail`."""
        events: list[LifecycleEvent] = []
        with self._lock:
            if turn.done or turn.committed:
                return
            turn.done = True
            sess = turn.session
            if sess.closed or sess.generation != turn.generation or sess.version != turn.base:
                log.debug("session.stale", session_id=sess.session_id, generation=turn.generation, outcome="failure")
                return
            sess.attempt += 1
            r = build_report(turn, None, None)
            signal = sess.signal
            events.append(
                LifecycleEvent(
                    "retry", signal, self.clock(), reason, r.prefix_identity, r.reuse_boundary, r.storage_tier
                )
            )
        self._emit(events)

    # ---- subagents, restarts, closing ------------------------------------------------------------

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
