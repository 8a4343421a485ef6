"""The session manager every door drives: :class:`Sessions` (one per process, or per proxy app).

One set of rules, identical in ``wrap()``, the proxy, ``audit`` and ``replay``:

* **identity**: a request's session is found per :class:`~agentcache.session.Identity` (explicit id > client
  declaration > ``prompt_cache_key`` > the prefix index > a new id), within its tenant. A declared lineage
  (:mod:`agentcache.session._clients`: one id for a client's main conversation and its side requests) is
  searched on its own index chain; a conversation that continues none of its sessions is the lineage's main
  session (the lineage's id) when it is an agent loop (it carries tools) and the lineage has no live main one, or
  it carries the main one's history (its last request's final item, however the rest was re-serialized: Claude
  Code 2.1.332 resuming a session 2.1.197 started); else a side session ``<lineage>/<id>`` (a title or summary
  request, a second conversation) whose parent is the main one;
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

import functools
import uuid
from collections.abc import Generator
from dataclasses import dataclass, replace
from typing import Any

from .._log import get_logger
from ..model._bounded import bounded
from ..model._build import BlockCache
from ..model._canonical import CanonicalRequest
from ..model._fields import LifecycleEvent, TurnReport
from ..model._rawjson import RawBody
from ..model._types import Api
from ..model._usage import CacheUsage
from ..targets import Target, resolve_target, target_named
from ._drive import StoreOp, arun, run
from ._identity import LOCAL_TENANT, NO_CHECKPOINTS, Checkpoints, Identity, carries_last
from ._identity import checkpoints_from as _checkpoints
from ._identity import new_session_id as _new_id
from ._lifecycle import annotate
from ._lookup import Canonicalizer
from ._manager import DEFAULT_IDLE_TIMEOUT, SIBLING_BLOCKS, Lineage, Manager, SessionClosedError
from ._session import UNSET, Session
from ._store import MemoryStore, StoreUnavailable
from ._turn import Turn, build_report

__all__ = ["DEFAULT_IDLE_TIMEOUT", "Lineage", "SessionClosedError", "Sessions"]

log = get_logger("agentcache.session")


@dataclass(frozen=True, slots=True)
class _Who:
    """A request's identity before the store is asked: ``sid`` (None: look it up by ``checkpoints``),
    ``explicit`` (the id came from the request; such sessions are not indexed), ``parent``, ``lineage``, the
    declared lineage the lookup stays inside (None outside one), ``loop``: the request carries tools, and
    ``client``: the request, canonical, when the lookup needed it (the session's pipeline goes on from it), and
    ``cache``: the block cache that built it."""

    sid: str | None
    explicit: bool
    checkpoints: Checkpoints
    parent: str | None
    lineage: str | None = None
    loop: bool = False
    client: CanonicalRequest | None = None
    cache: BlockCache | None = None


@dataclass(frozen=True, slots=True)
class _Begin:
    """The arguments of one :meth:`Sessions.begin` (see there)."""

    api: Api
    body: dict[str, Any]
    identity: Identity
    at: float | None
    raw: RawBody | None
    base_url: str | None
    target: Target | None
    reuse: Session | None
    size: int | None


class Sessions(Manager):
    """The session manager (see the module docstring). Constructor and lookups: :class:`~agentcache.session.
    _manager.Manager`; here, opening sessions, preparing requests and completing turns."""

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

    def _identify(self, identity: Identity, api: Api, body: dict[str, Any], raw: RawBody | None) -> _Who:
        """Whose request this is, by the precedence of the module docstring (no store call). Every id a client
        chose is kept :func:`~agentcache.model._bounded.bounded`."""
        who = self._who(identity, api, body, raw)
        parent = bounded(who.parent) if who.parent is not None else None
        return who if parent is who.parent else replace(who, parent=parent)

    @functools.cached_property
    def _canonicalizer(self) -> Canonicalizer:
        """Canonicalizes the requests whose session is looked up (once, before the lookup)."""
        return Canonicalizer()

    def _who(self, identity: Identity, api: Api, body: dict[str, Any], raw: RawBody | None) -> _Who:
        if identity.session:
            return _Who(bounded(identity.session), True, NO_CHECKPOINTS, identity.parent)
        if identity.declared and identity.declared_lineage:
            lineage = bounded(identity.declared)
            client, cache = self._canonicalizer.canonical(api, body, raw)
            cps = _checkpoints(client, scope=lineage, cache=cache)
            return _Who(None, False, cps, identity.parent, lineage, bool(body.get("tools")), client, cache)
        if identity.declared:
            return _Who(bounded(identity.declared), True, NO_CHECKPOINTS, identity.parent or identity.declared_parent)
        if identity.cache_key:
            return _Who(bounded(identity.cache_key), True, NO_CHECKPOINTS, identity.parent)
        if identity.infer:
            client, cache = self._canonicalizer.canonical(api, body, raw)
            return _Who(None, False, _checkpoints(client, cache=cache), identity.parent, client=client, cache=cache)
        return _Who(_new_id(), True, NO_CHECKPOINTS, identity.parent)

    def _found(self, who: _Who, found: str | None, main: Session | None) -> tuple[str, str | None]:
        """``(session id, parent)`` once the prefix index answered ``found`` (see the module docstring; ``main``:
        the lineage's live main session)."""
        if found is not None:
            return found, who.parent
        if who.lineage is None:
            return _new_id(), who.parent
        sent = main.pipeline.state.sent if main is not None else None  # its client's last request, below
        if who.loop and (main is None or carries_last(who.checkpoints, sent.client if sent is not None else None)):
            return who.lineage, who.parent
        return bounded(f"{who.lineage}/{_new_id()}"), who.lineage

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
        req = _Begin(Api(api), body, identity or Identity(), at, raw, base_url, target, reuse, size)
        events: list[LifecycleEvent] = []
        with self._lock:
            self._sync_store()  # raises ConfigError for an asynchronous store
            now = self.clock() if now is None else now
            self._sweep(now, events)
            turn = run(self._begin(req, now, events), self._call)
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
            return self.begin(api, body, identity=identity, now=now, at=at, raw=raw, base_url=base_url,
                              target=target, reuse=reuse, size=size)  # fmt: skip
        req = _Begin(Api(api), body, identity or Identity(), at, raw, base_url, target, reuse, size)
        events: list[LifecycleEvent] = []
        turn = await arun(self._begin(req, self.clock() if now is None else now, events), self._acall)
        self._emit(events)
        return turn

    def _begin(self, req: _Begin, now: float, events: list[LifecycleEvent]) -> Generator[StoreOp, Any, Turn]:
        """The one implementation of :meth:`begin` and :meth:`abegin`: it yields each store operation, and the
        caller (holding the lock, or awaiting an asynchronous store) sends back its answer; returns the turn.
        ``events``: the lifecycle events to emit once done are appended to it."""
        tenant = req.identity.tenant
        who = self._identify(req.identity, req.api, req.body, req.raw)
        sid, parent = who.sid, who.parent
        if sid is None:
            found = yield StoreOp("find", self.store.find, (tenant, who.checkpoints))
            # A replica knows the lineage's main session when it holds a copy (else it opens it: fail soft).
            sid, parent = self._found(who, found, self.store.get(tenant, who.lineage) if who.lineage else None)
        create = self._factory(self.provider, self.model, who.explicit)
        opened = yield StoreOp("open", self.store.open, (tenant, sid),
                                {"parent": parent, "explicit": who.explicit, "now": now, "create": create,
                                 "reuse": req.reuse})  # fmt: skip
        sess = self._opened(opened, now, events)
        at = now if req.at is UNSET else req.at
        return self._prepare(sess, req, at, who)

    def _resolve(self, api: Api, target: Target | None) -> Target:
        if self.settings.target != "auto":
            return resolve_target(api, setting=self.settings.target, model=self.model)
        return target or self.provider or resolve_target(api, model=self.model)

    def _prepare(self, sess: Session, req: _Begin, at: float | None, who: _Who) -> Turn:
        api, body = req.api, req.body
        if sess.target is None:
            sess.target = self._resolve(api, req.target)
        lineage = self._lineages.get(sess.lineage)
        pipe = sess.pipeline
        if who.cache is not None and pipe.sent is None and self._canonicalizer.adopt(api, who.cache):
            pipe.cache = who.cache  # a new conversation's first request: the cache that built it is its own
        # A subagent's first request: its siblings' shared prefix is where it diverges from the latest sibling's.
        first_of_subagent = lineage is not None and sess.parent is not None and pipe.sent is None
        sibling = lineage.sibling if first_of_subagent and lineage is not None else None
        spawns = lineage.spawns if first_of_subagent and lineage is not None else ()
        prepared = pipe.prepare(
            api,
            body,
            now=at,
            raw=req.raw,
            client=who.client,
            routing_key=lineage.routing_key if lineage is not None else None,
            sibling=sibling,
            spawns=spawns,
        )
        if who.cache is not None:
            Canonicalizer.note(api, body, req.raw, pipe.cache)
        if sess.parent is not None and pipe.sent is None:
            # Learned when prepared, not committed: siblings launched together are prepared before any answers.
            with self._lock:
                state = self._lineage(sess.lineage)
                self._set_sibling(state, prepared.client.chain[:SIBLING_BLOCKS])
                if at is not None:
                    state.spawns = (*state.spawns[-31:], at)
        wire = annotate(prepared.body, sess.signal, req.base_url, tuple(self.sinks))
        self._seq += 1
        return Turn(sess, self._seq, api, prepared, wire, who.checkpoints, req.size)

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
                turn.settle(False)
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
            turn.settle(False)
            raise
        events: list[LifecycleEvent] = []
        with self._lock:
            self._committed(turn, ok, now, events)
        self._emit(events)
        return ok

    def _committed(self, turn: Turn, ok: bool, now: float, events: list[LifecycleEvent]) -> None:
        turn.settle(ok)
        sess = turn.session
        if not ok:
            log.debug("session.stale", session_id=sess.session_id, generation=turn.generation, outcome="commit")
            return
        sess.attempt = 0
        state = self._lineage(sess.lineage)
        state.routing_key = state.routing_key or turn.prepared.state.routing_key
        if isinstance(self.store, MemoryStore):
            events.extend(old.event("close", now, "evicted") for old in self.store.over_budget(now, sess))
        self._bound_scopes()

    def finish_turn(self, turn: Turn, usage: CacheUsage | None, duration: float | None, cut: bool) -> TurnReport | None:
        """See :meth:`Turn.finish` (which checked the turn's state)."""
        report = build_report(turn, usage, duration)
        events: list[LifecycleEvent] = []
        with self._lock:
            sess, now = turn.session, self.clock()
            current = not sess.closed and sess.generation == turn.generation
            if current:
                sess.last_report = report
                if usage is not None and usage.response_id is not None:
                    sess.responded(turn, usage.response_id)
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
        """See :meth:`Turn.fail` (which checked the turn's state)."""
        events: list[LifecycleEvent] = []
        with self._lock:
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
