"""Session stores: where live sessions, closed ids (tombstones) and the prefix index live.

:class:`SessionStore` is what :class:`~agentcache.Sessions` needs; :class:`MemoryStore` (the default) keeps
everything in this process, :class:`~agentcache.session.RedisStore` shares it between proxy replicas
(:class:`AsyncSessionStore`: the same operations, awaited). Every store keeps one contract:

* ``open`` returns the live session ``(tenant, sid)``: generation 0 for a new id, the next generation for an id
  whose last one was closed (reason ``resumed`` after an idle close or an eviction, ``restart`` after an
  explicit close). A subagent's lineage is its parent's;
* ``commit`` records a prepared request as sent only if the turn is still current: its session is live and open
  in the generation it was prepared in, and nothing was committed to it since (optimistic concurrency on the
  session's ``version``). Otherwise it returns False and touches nothing; a late response never changes state;
* ``close`` and ``sweep`` (idle sessions) end a generation exactly once, returning the sessions they closed.

Bounded: at most ``max_open`` live sessions, ``max_bytes`` of their estimated state (each session's pipeline state
and its prefix-index entries at :data:`INDEX_ENTRY_BYTES`), and ``max_tombstones`` closed ids remembered (the
oldest forgotten first, :data:`TOMBSTONE_BYTES` each). Beyond either session bound the least recently active
session is closed (reason ``evicted``); nothing else counts against the sessions' bytes, so however much else a
process holds, the sessions keep their room (the proxy gives each structure its own share:
:mod:`agentcache.proxy._budget`).
"""

from __future__ import annotations

from collections import OrderedDict
from collections.abc import Callable
from dataclasses import dataclass, field
from typing import TYPE_CHECKING, Any, Protocol

from ..model._totals import UsageTotals
from ._identity import Checkpoints, index_entries, match_checkpoints

if TYPE_CHECKING:
    from ._pipeline import Prepared
    from ._session import Session

__all__ = [
    "AsyncSessionStore",
    "MemoryStore",
    "Opened",
    "SessionFactory",
    "SessionStore",
    "StoreUnavailable",
    "Tombstone",
    "open_reason",
]

DEFAULT_MAX_OPEN = 10_000
DEFAULT_MAX_TOMBSTONES = 50_000
DEFAULT_MAX_BYTES = 256 * 1024 * 1024
DEFAULT_MIN_INNER_MATCH = 2
#: Bytes of one prefix-index entry (``(tenant, hash) → (sid, head)``) and of one tombstone (key, Tombstone,
#: usage totals): 395 B and 481 B measured with a ``sys.getsizeof`` walk over 700-3,000 of each (CPython
#: 3.11, in-process traffic shaped like benchmarks/memory_soak.py), rounded up.
INDEX_ENTRY_BYTES = 400
TOMBSTONE_BYTES = 500

#: Builds a session's local object: ``(tenant, sid, parent, lineage, generation, snapshot) -> Session``; the
#: snapshot (:meth:`~agentcache.session.SessionPipeline.snapshot`) is None for a new generation.
SessionFactory = Callable[[str, str, "str | None", str, int, "dict[str, Any] | None"], "Session"]


class StoreUnavailable(Exception):
    """The session store failed (a shared store could not be reached); the request is forwarded unchanged (fail
    open). ``op``: the store operation (``find``, ``open``, ``commit``, ``close``, ``sweep``)."""

    def __init__(self, message: str, *, op: str = "store") -> None:
        super().__init__(message)
        self.op = op


def open_reason(closed_for: str | None) -> str:
    """Why a session opens: ``new`` (never seen), ``resumed`` (it was closed as idle or evicted) or ``restart``
    (it was closed on purpose, or restarted, and its id came back)."""
    if closed_for is None:
        return "new"
    return "resumed" if closed_for in ("idle", "evicted") else "restart"


@dataclass(frozen=True, slots=True)
class Tombstone:
    """What is kept of a closed session id: its last ``generation``, when (``closed_at``, seconds) and why it
    closed, and its usage ``totals`` (this process's)."""

    session_id: str
    generation: int
    closed_at: float
    reason: str
    totals: UsageTotals = field(default_factory=UsageTotals)


@dataclass(frozen=True, slots=True)
class Opened:
    """``session``; the ``reason`` it was opened (``new``, ``restart``, ``resumed``), None when it was already
    live; ``evicted``: sessions closed to make room."""

    session: Session
    reason: str | None = None
    evicted: tuple[Session, ...] = ()


class SessionStore(Protocol):
    """A store used synchronously (see the module docstring)."""

    def find(self, tenant: str, checkpoints: Checkpoints) -> str | None:
        """The live inferred session of ``tenant`` that a request with ``checkpoints`` continues, or None."""
        ...

    def open(
        self,
        tenant: str,
        sid: str,
        *,
        parent: str | None,
        explicit: bool,
        now: float,
        create: SessionFactory,
        reuse: Session | None,
    ) -> Opened:
        """The live session ``(tenant, sid)``, opened when needed (``explicit``: the id came from the request, not
        the prefix index; ``reuse``: the caller's closed object of that id, revived in place so the caller's
        handle stays the session)."""
        ...

    def commit(self, session: Session, prepared: Prepared, *, base: int, checkpoints: Checkpoints, now: float) -> bool:
        """Record ``prepared`` as sent in ``session`` if ``base`` is still its version (see the module docstring)."""
        ...

    def close(self, tenant: str, sid: str, *, reason: str, now: float) -> Session | None:
        """Close the live generation of ``(tenant, sid)``; None when there is none."""
        ...

    def sweep(self, now: float, idle: float) -> list[Session]:
        """Close every session idle for more than ``idle`` seconds (reason ``idle``)."""
        ...

    def get(self, tenant: str, sid: str) -> Session | None:
        """The live session ``(tenant, sid)``, or None."""
        ...

    def tombstone(self, tenant: str, sid: str) -> Tombstone | None:
        """The tombstone of a closed id, or None."""
        ...

    def live(self) -> int:
        """Live sessions this process holds."""
        ...


class AsyncSessionStore(Protocol):
    """A store used from async code: :class:`SessionStore`'s operations, awaited (Redis)."""

    async def find(self, tenant: str, checkpoints: Checkpoints) -> str | None: ...

    async def open(
        self,
        tenant: str,
        sid: str,
        *,
        parent: str | None,
        explicit: bool,
        now: float,
        create: SessionFactory,
        reuse: Session | None,
    ) -> Opened: ...

    async def commit(
        self, session: Session, prepared: Prepared, *, base: int, checkpoints: Checkpoints, now: float
    ) -> bool: ...

    async def close(self, tenant: str, sid: str, *, reason: str, now: float) -> Session | None: ...

    async def sweep(self, now: float, idle: float) -> list[Session]: ...

    def live(self) -> int: ...

    def get(self, tenant: str, sid: str) -> Session | None:
        """The live session ``(tenant, sid)`` as far as this process holds a copy, or None."""
        ...

    async def ping(self) -> bool: ...

    async def aclose(self) -> None: ...


class MemoryStore:
    """The in-process :class:`SessionStore` (see the module docstring). Not thread-safe by itself: the
    :class:`~agentcache.Sessions` manager serialises calls."""

    def __init__(
        self,
        *,
        max_open: int = DEFAULT_MAX_OPEN,
        max_tombstones: int = DEFAULT_MAX_TOMBSTONES,
        max_bytes: int = DEFAULT_MAX_BYTES,
        min_inner_match: int = DEFAULT_MIN_INNER_MATCH,
    ) -> None:
        self.max_open, self.max_bytes = max_open, max_bytes
        self.max_tombstones = max(1, max_tombstones)
        self.min_inner_match = min_inner_match
        self._live: OrderedDict[tuple[str, str], Session] = OrderedDict()  # least recently active first
        self._tombs: OrderedDict[tuple[str, str], Tombstone] = OrderedDict()
        self._index: dict[tuple[str, bytes], tuple[str, bool]] = {}
        self._bytes = 0

    @property
    def session_bytes(self) -> int:
        """Estimated bytes of the live sessions' state and their index entries (bounded by ``max_bytes``)."""
        return self._bytes + len(self._index) * INDEX_ENTRY_BYTES

    @property
    def tombstone_bytes(self) -> int:
        """Estimated bytes of the tombstones (bounded by ``max_tombstones``)."""
        return len(self._tombs) * TOMBSTONE_BYTES

    @property
    def state_bytes(self) -> int:
        """Estimated bytes the store holds: :attr:`session_bytes` and :attr:`tombstone_bytes`."""
        return self.session_bytes + self.tombstone_bytes

    def find(self, tenant: str, checkpoints: Checkpoints) -> str | None:
        """See :meth:`SessionStore.find`."""
        return match_checkpoints(checkpoints, lambda h: self._index.get((tenant, h)), self.min_inner_match)

    def open(
        self,
        tenant: str,
        sid: str,
        *,
        parent: str | None,
        explicit: bool,
        now: float,
        create: SessionFactory,
        reuse: Session | None,
    ) -> Opened:
        """See :meth:`SessionStore.open`."""
        key = (tenant, sid)
        sess = self._live.get(key)
        if sess is not None:
            self._live.move_to_end(key)
            sess.last_active = max(sess.last_active, now)
            return Opened(sess)
        tomb = self._tombs.pop(key, None)
        generation = tomb.generation + 1 if tomb is not None else 0
        if reuse is not None and reuse.closed and reuse.tenant == tenant and reuse.session_id == sid:
            reuse.revive(generation, now)
            sess = reuse
        else:
            up = self._live.get((tenant, parent)) if parent is not None else None
            lineage = up.lineage if up is not None else (parent or sid)
            sess = create(tenant, sid, parent, lineage, generation, None)
            sess.explicit, sess.last_active = explicit, now
            if tomb is not None:
                sess.totals = tomb.totals
        self._live[key] = sess
        evicted = []
        while len(self._live) > self.max_open:
            evicted.append(self._retire(next(iter(self._live.values())), "evicted", now))
        return Opened(sess, open_reason(tomb.reason if tomb is not None else None), tuple(evicted))

    def commit(self, session: Session, prepared: Prepared, *, base: int, checkpoints: Checkpoints, now: float) -> bool:
        """See :meth:`SessionStore.commit`."""
        key = (session.tenant, session.session_id)
        if session.closed or self._live.get(key) is not session or session.version != base:
            return False
        session.pipeline.commit(prepared)
        session.version += 1
        session.turns += 1
        session.last_active = max(session.last_active, now)
        size = session.estimated_bytes()
        self._bytes += size - session.size
        session.size = size
        if session.explicit:
            return True
        entries = index_entries(checkpoints, self.min_inner_match)
        keep = {h for h, _ in entries}
        tenant, sid = session.tenant, session.session_id
        for h in session.entries:  # only the entries that left the window go (the window slides by a turn)
            if h not in keep and self._index.get((tenant, h), ("",))[0] == sid:
                del self._index[(tenant, h)]
        for h, head in entries:
            self._index[(tenant, h)] = (sid, head)
        session.entries = tuple(keep)
        return True

    def over_budget(self, now: float, keep: Session) -> list[Session]:
        """Close least recently active sessions (not ``keep``) while :attr:`session_bytes` is over ``max_bytes``; a
        ``keep`` larger than ``max_bytes`` alone cannot be held: it is closed itself, the others stay."""
        out: list[Session] = []
        if keep.size > self.max_bytes and self._live.get((keep.tenant, keep.session_id)) is keep:
            return [self._retire(keep, "evicted", now)]
        while self.session_bytes > self.max_bytes and len(self._live) > 1:
            old = next(iter(self._live.values()))
            if old is keep:
                break
            out.append(self._retire(old, "evicted", now))
        return out

    def close(self, tenant: str, sid: str, *, reason: str, now: float) -> Session | None:
        """See :meth:`SessionStore.close`."""
        sess = self._live.get((tenant, sid))
        return self._retire(sess, reason, now) if sess is not None else None

    def sweep(self, now: float, idle: float) -> list[Session]:
        """See :meth:`SessionStore.sweep`."""
        out: list[Session] = []
        while self._live:  # least recently active first: stop at the first one still active
            sess = next(iter(self._live.values()))
            if now - sess.last_active <= idle:
                break
            out.append(self._retire(sess, "idle", now))
        return out

    def get(self, tenant: str, sid: str) -> Session | None:
        """See :meth:`SessionStore.get`."""
        return self._live.get((tenant, sid))

    def tombstone(self, tenant: str, sid: str) -> Tombstone | None:
        """See :meth:`SessionStore.tombstone`."""
        return self._tombs.get((tenant, sid))

    def live(self) -> int:
        """See :meth:`SessionStore.live`."""
        return len(self._live)

    def sessions(self) -> list[Session]:
        """The live sessions, least recently active first."""
        return list(self._live.values())

    def _retire(self, sess: Session, reason: str, now: float) -> Session:
        key = (sess.tenant, sess.session_id)
        if self._live.get(key) is sess:
            del self._live[key]
        self._bytes -= sess.size
        self._drop_entries(sess)
        sess.retire(reason)
        self._tombs.pop(key, None)
        self._tombs[key] = Tombstone(sess.session_id, sess.generation, now, reason, sess.totals)
        while len(self._tombs) > self.max_tombstones:
            self._tombs.popitem(last=False)
        return sess

    def _drop_entries(self, sess: Session) -> None:
        for h in sess.entries:
            k = (sess.tenant, h)
            hit = self._index.get(k)
            if hit is not None and hit[0] == sess.session_id:
                del self._index[k]
        sess.entries = ()
