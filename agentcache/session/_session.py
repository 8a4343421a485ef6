"""Sessions: one :class:`Sessions` manager per process, one :class:`Session` per agent conversation.

A session has a stable ``session_id``, a ``generation`` (incarnation: :meth:`Session.restart` starts
the logical session over) and an ``attempt`` (failed tries of the current turn, same generation; reset
when a turn succeeds). :meth:`Session.fork` makes a subagent: its ``parent`` is the forking session and
it keeps the root's ``lineage``, so it shares the parent's cache scope (:class:`ScopeMemory`: first-seen
tool bytes and order) and, on OpenAI, its ``prompt_cache_key``. Requests go through
:meth:`Session.begin` → :class:`~agentcache.session._turn.Turn`. Events and the retry-versus-new-generation
contract: :mod:`agentcache.session._lifecycle`.

Bounded state: at most ``max_open`` open sessions (the least recently active is closed, reason
``evicted``); sessions idle longer than ``idle_timeout`` seconds are closed (reason ``idle``) by the
sweep that every open and every request runs; closed ids leave a :class:`Tombstone` (last generation,
totals) in an LRU of ``max_tombstones``; per-lineage totals and routing key (:class:`~agentcache.session._turn.Lineage`;
every session of a lineage, subagents and later generations included, sends the ``prompt_cache_key``
the lineage got first) live in an LRU of ``max_lineages``; a
closed session frees its pipeline. Reopening a tombstoned id continues its generation count. A session
closed for idleness or eviction resumes on its next request as a new generation (``open``, reason
``resumed``); one closed explicitly refuses requests (:class:`SessionClosedError`; wrappers then send
the request unchanged). Thread-safe: one lock per manager; events are emitted outside it.
"""

from __future__ import annotations

import threading
import time
import uuid
from collections import OrderedDict
from collections.abc import Callable, Iterable
from dataclasses import dataclass, field
from typing import Any

from .._config import Settings
from .._exceptions import ConfigError
from ..model._fields import LifecycleEvent, SessionSignal, TurnReport
from ..model._usage import UsageTotals
from ._lifecycle import Sink, annotate, emit
from ._pipeline import ScopeMemory, SessionPipeline
from ._turn import Lineage, Turn, learning, restore

__all__ = ["Session", "SessionClosedError", "Sessions", "Tombstone", "Turn", "provider_for_api"]

DEFAULT_IDLE_TIMEOUT = 1800.0
DEFAULT_MAX_OPEN = 10_000
DEFAULT_MAX_TOMBSTONES = 8192
DEFAULT_MAX_LINEAGES = 4096
_RESUMABLE = frozenset({"idle", "evicted"})


class SessionClosedError(ConfigError):
    """A request on a session that was closed explicitly (the caller's mistake)."""


def provider_for_api(api: str) -> str:
    """The provider whose rules apply to wire API ``api`` (``anthropic.messages`` → ``anthropic``)."""
    return "anthropic" if api.startswith("anthropic") else "openai"


@dataclass(frozen=True, slots=True)
class Tombstone:
    """What is kept of a closed session id: its last ``generation``, when (``closed_at``, seconds)
    and why it closed, and its usage ``totals``."""

    session_id: str
    generation: int
    closed_at: float
    reason: str
    totals: UsageTotals = field(default_factory=UsageTotals)


class Sessions:
    """The process-wide session manager.

    ``provider``: ``anthropic``, ``openai`` or ``engine`` (repairs only) for every session; None lets
    each session take it from its first request (the wrappers infer it from the client and its
    base URL). ``model``: price and rules every request as this model. ``settings``: pipeline
    settings (default: the process settings). ``sinks``: lifecycle event sinks. ``clock``: wall-clock
    seconds (tests pass a fake). Limits as in the module docstring; ``idle_timeout=None`` disables it.
    """

    def __init__(
        self,
        *,
        provider: str | None = None,
        model: str | None = None,
        settings: Settings | None = None,
        sinks: Iterable[Sink] = (),
        idle_timeout: float | None = DEFAULT_IDLE_TIMEOUT,
        max_open: int = DEFAULT_MAX_OPEN,
        max_tombstones: int = DEFAULT_MAX_TOMBSTONES,
        max_lineages: int = DEFAULT_MAX_LINEAGES,
        clock: Callable[[], float] = time.time,
    ) -> None:
        if min(max_open, max_tombstones, max_lineages) < 1:
            raise ConfigError("session limits must be positive")
        self.provider, self.model, self.settings = provider, model, settings
        self.idle_timeout, self.clock = idle_timeout, clock
        self.max_open, self.max_tombstones, self.max_lineages = max_open, max_tombstones, max_lineages
        self._lock = threading.RLock()
        self._open: OrderedDict[str, Session] = OrderedDict()  # least recently active first
        self._tombs: OrderedDict[str, Tombstone] = OrderedDict()
        self._lineages: OrderedDict[str, Lineage] = OrderedDict()
        self._scopes: dict[str, ScopeMemory] = {}
        #: Registered lifecycle sinks; append or remove at any time.
        self.sinks: list[Sink] = list(sinks)
        self._seq = 0

    def scope(self, provider: str) -> ScopeMemory:
        """The cache-scope memory shared by this manager's sessions on ``provider``."""
        with self._lock:
            return self._scopes.setdefault(provider, ScopeMemory())

    def _emit(self, events: list[LifecycleEvent]) -> None:
        sinks = tuple(self.sinks)
        for event in events:
            emit(event, sinks)

    def session(
        self, session_id: str | None = None, *, provider: str | None = None, model: str | None = None
    ) -> Session:
        """The open session ``session_id`` (a new id when None), opened if needed (``open`` event)."""
        events: list[LifecycleEvent] = []
        with self._lock:
            now = self.clock()
            self._sweep(now, events)
            sid = session_id or uuid.uuid4().hex
            sess = self._open.get(sid)
            if sess is None:
                tomb = self._tombs.pop(sid, None)
                sess = Session(self, sid, None, sid, tomb.generation + 1 if tomb else 0, now)
                sess.provider, sess.model = provider or sess.provider, model or sess.model
                self._add(sess, now, events)
                events.append(sess._event("open", now, "new"))
            else:
                self._touch(sess, now)
        self._emit(events)
        return sess

    def tombstone(self, session_id: str) -> Tombstone | None:
        """The tombstone of closed id ``session_id``, or None (open, unknown, or forgotten)."""
        with self._lock:
            return self._tombs.get(session_id)

    def accepts(self, session_id: str, generation: int) -> bool:
        """True when a response for ``(session_id, generation)`` may still change state."""
        with self._lock:
            sess = self._open.get(session_id)
            return sess is not None and sess.generation == generation

    def totals(self, session_id: str) -> UsageTotals | None:
        """Usage totals of an open or tombstoned session id (current generation for open ones)."""
        with self._lock:
            sess = self._open.get(session_id)
            if sess is not None:
                return sess.totals
            tomb = self._tombs.get(session_id)
            return tomb.totals if tomb is not None else None

    def lineage_totals(self, lineage: str) -> UsageTotals | None:
        """Usage totals over every session of ``lineage`` (a root session id and its subagents)."""
        with self._lock:
            state = self._lineages.get(lineage)
            return state.totals if state is not None else None

    def sweep(self, now: float | None = None) -> int:
        """Close sessions idle longer than ``idle_timeout``; returns how many were closed."""
        events: list[LifecycleEvent] = []
        with self._lock:
            self._sweep(self.clock() if now is None else now, events)
        self._emit(events)
        return len(events)

    def close_all(self, reason: str = "shutdown") -> None:
        """Close every open session."""
        events: list[LifecycleEvent] = []
        with self._lock:
            now = self.clock()
            for sess in list(self._open.values()):
                sess._close(reason, now, events)
        self._emit(events)

    def __len__(self) -> int:
        return len(self._open)

    def _add(self, sess: Session, now: float, events: list[LifecycleEvent]) -> None:
        self._open[sess.session_id] = sess
        while len(self._open) > self.max_open:
            next(iter(self._open.values()))._close("evicted", now, events)

    def _touch(self, sess: Session, now: float) -> None:
        sess.last_active = now
        self._open.move_to_end(sess.session_id)

    def _sweep(self, now: float, events: list[LifecycleEvent]) -> None:
        if self.idle_timeout is None:
            return
        while self._open:
            oldest = next(iter(self._open.values()))
            if now - oldest.last_active <= self.idle_timeout:
                break
            oldest._close("idle", now, events)

    def _bury(self, sess: Session, now: float, reason: str) -> None:
        if self._open.get(sess.session_id) is sess:
            del self._open[sess.session_id]
        self._tombs.pop(sess.session_id, None)
        self._tombs[sess.session_id] = Tombstone(sess.session_id, sess.generation, now, reason, sess.totals)
        while len(self._tombs) > self.max_tombstones:
            self._tombs.popitem(last=False)

    def _lineage(self, lineage: str) -> Lineage:
        state = self._lineages.pop(lineage, None) or Lineage()
        self._lineages[lineage] = state
        if len(self._lineages) > self.max_lineages:
            self._lineages.popitem(last=False)
        return state

    def _next_seq(self) -> int:
        self._seq += 1
        return self._seq


class Session:
    """One agent conversation: create with :meth:`Sessions.session` or :meth:`fork`; ``with``/``async
    with`` closes it. Read-only: ``session_id``, ``parent``, ``lineage``, ``generation``, ``attempt``,
    ``turns`` (committed this generation), ``closed``/``close_reason``, ``last_report`` (the last
    committed turn's :class:`TurnReport`), ``totals`` (:class:`UsageTotals`, all generations)."""

    def __init__(self, m: Sessions, sid: str, parent: str | None, lineage: str, generation: int, now: float) -> None:
        self.manager, self.session_id, self.parent, self.lineage = m, sid, parent, lineage
        self.provider: str | None = m.provider
        self.model: str | None = m.model
        self.generation, self.attempt, self.turns = generation, 0, 0
        self.closed, self.close_reason = False, ""
        self.last_report: TurnReport | None = None
        self.totals = UsageTotals()
        self.last_active = now
        self._pipeline: SessionPipeline | None = None
        self._committed_seq = 0
        self._forks: dict[str, int] = {}

    @property
    def signal(self) -> SessionSignal:
        """The current ``session_signal``."""
        return SessionSignal(self.session_id, self.generation, self.attempt, self.parent, self.lineage, self.turns)

    def _event(self, name: Any, now: float, reason: str | None = None, basis: Session | None = None) -> LifecycleEvent:
        """An event with no request of its own: the prefix and tier of ``basis``'s (default: this
        session's) last committed turn, if any; a fork's basis is the parent, whose prefix it shares."""
        r = (basis or self).last_report
        ident, tier = (r.prefix_identity, r.storage_tier) if r is not None else (None, None)
        return LifecycleEvent(name, self.signal, now, reason, ident, None, tier)

    @property
    def pipeline(self) -> SessionPipeline:
        """This generation's pipeline (created on first use; needs a known provider)."""
        if self._pipeline is None:
            if self.provider is None:
                raise ConfigError(f"session {self.session_id}: provider unknown before its first request")
            m = self.manager
            scope, sid = m.scope(self.provider), self.session_id
            pipe = SessionPipeline(
                self.provider, self.model, scope, settings=m.settings, session=sid, lineage=self.lineage
            )
            known = m._lineages.get(self.lineage)
            if known is not None:  # subagents and new generations keep the lineage's routing key
                pipe.routing_key = known.routing_key
            self._pipeline = pipe
        return self._pipeline

    def fork(self, name: str = "subagent", *, model: str | None = None) -> Session:
        """A subagent session ``<session_id>/<name>`` (``-2``, ``-3``... when taken), same lineage and
        provider, ``parent`` = this session (``fork`` event). Raises SessionClosedError when closed."""
        m = self.manager
        events: list[LifecycleEvent] = []
        with m._lock:
            if self.closed:
                raise SessionClosedError(f"session {self.session_id} is closed")
            now = m.clock()
            m._sweep(now, events)
            n = self._forks.get(name, 0)
            while True:
                n += 1
                sid = f"{self.session_id}/{name}" if n == 1 else f"{self.session_id}/{name}-{n}"
                if sid not in m._open and sid not in m._tombs:
                    break
            if len(self._forks) < 256 or name in self._forks:
                self._forks[name] = n
            child = Session(m, sid, self.session_id, self.lineage, 0, now)
            child.provider, child.model = self.provider, model or self.model
            m._add(child, now, events)
            m._touch(self, now)
            events.append(child._event("fork", now, name, self))
        m._emit(events)
        return child

    def restart(self) -> None:
        """Start a new generation: ``close`` (reason ``restart``) then ``open`` (reason ``restart``);
        history, attempt and turn count start over; totals carry on."""
        m = self.manager
        with m._lock:
            if self.closed:
                raise SessionClosedError(f"session {self.session_id} is closed")
            now = m.clock()
            events = [self._event("close", now, "restart")]
            self._new_generation(now)
            events.append(self._event("open", now, "restart"))
        m._emit(events)

    def _new_generation(self, now: float) -> None:
        self.generation += 1
        self.attempt = self.turns = 0
        self._pipeline = None
        self.last_report = None
        self.last_active = now

    def close(self, reason: str = "closed") -> None:
        """Close the session (``close`` event; idempotent). Later responses change nothing."""
        m = self.manager
        events: list[LifecycleEvent] = []
        with m._lock:
            self._close(reason, m.clock(), events)
        m._emit(events)

    async def aclose(self, reason: str = "closed") -> None:
        """:meth:`close` for ``async`` code (closing does no I/O on the event loop)."""
        self.close(reason)

    def _close(self, reason: str, now: float, events: list[LifecycleEvent]) -> None:
        if self.closed:
            return
        self.closed, self.close_reason = True, reason
        self._pipeline = None  # the bulk of a session's memory
        self.manager._bury(self, now, reason)
        events.append(self._event("close", now, reason))

    def __enter__(self) -> Session:
        return self

    def __exit__(self, *exc: object) -> None:
        self.close()

    async def __aenter__(self) -> Session:
        return self

    async def __aexit__(self, *exc: object) -> None:
        self.close()

    def __repr__(self) -> str:
        state = f"closed ({self.close_reason})" if self.closed else "open"
        return f"Session({self.session_id!r}, generation={self.generation}, attempt={self.attempt}, {state})"

    def begin(
        self,
        api: str,
        body: dict[str, Any],
        *,
        provider: str | None = None,
        base_url: str | None = None,
        now: float | None = None,
    ) -> Turn:
        """Prepare wire ``body`` of ``api``; returns the :class:`Turn` to complete. ``provider``: used when
        the session has none yet (default: from ``api``); ``base_url``: the destination (sinks' ``annotate``);
        ``now``: wall-clock seconds. Raises SessionClosedError (closed explicitly), InputError (malformed
        body) or an internal error, leaving no trace: the caller then sends its original request."""
        m = self.manager
        events: list[LifecycleEvent] = []
        with m._lock:
            now = m.clock() if now is None else now
            m._sweep(now, events)
            if self.closed:
                self._resume(now, events)
            m._touch(self, now)
            if self.provider is None:
                self.provider = provider or provider_for_api(api)
            pipe = self.pipeline
            saved = learning(pipe)
            sent_before = pipe.memory.sent
            try:
                prepared = pipe.prepare(api, body, now=now)
                wire = annotate(prepared.body, self.signal, base_url, tuple(m.sinks))
            except BaseException:
                restore(pipe, saved)
                raise
            turn = Turn(self, m._next_seq(), api, prepared, wire, sent_before, saved)
        m._emit(events)
        return turn

    def _resume(self, now: float, events: list[LifecycleEvent]) -> None:
        m = self.manager
        if self.close_reason not in _RESUMABLE or self.session_id in m._open:
            raise SessionClosedError(f"session {self.session_id} is closed ({self.close_reason})")
        m._tombs.pop(self.session_id, None)
        self.closed, self.close_reason = False, ""
        self._new_generation(now)
        m._add(self, now, events)
        events.append(self._event("open", now, "resumed"))

    def _current(self, turn: Turn) -> bool:
        return not self.closed and turn.generation == self.generation and turn.seq > self._committed_seq
