"""Session state stores: where sessions, generations and the prefix index live.

:class:`SessionStore` is the interface the proxy uses; :class:`MemoryStore` (the default) keeps everything in
this process, bounded: at most ``max_sessions`` live sessions whose estimated state stays within ``max_bytes``
(beyond either, the least recently used is closed with reason ``evicted``; its close event goes out with the
next ``open``) and ``max_tombstones`` closed ids remembered, so a closed id that comes back starts the next
generation and a late response for a closed generation changes nothing. :class:`~agentcache.proxy._redis.
RedisStore` shares the same state between proxy replicas.

The contract every store keeps:

* ``open`` returns the live session for ``(tenant, sid)``, creating generation 0 for a new id, or the next
  generation for an id whose previous generation was closed (reason ``resumed`` after an idle close or an
  eviction, ``restart`` after an explicit close);
* ``commit`` records a request as sent only if its session is still the live, open generation it was
  prepared in (returns False otherwise, touching nothing), then moves the session's index entries to the new
  request's checkpoints;
* ``close`` and ``sweep`` (idle sessions) end a generation exactly once, returning the sessions they closed.
"""

from __future__ import annotations

from collections import OrderedDict
from collections.abc import Sequence
from dataclasses import dataclass, field
from typing import Any, Protocol

from ..session._pipeline import Prepared
from ._sessions import LiveSession, PipelineFactory, index_entries, match_checkpoints

__all__ = ["MemoryStore", "OpenResult", "SessionStore", "StoreUnavailable", "open_reason"]


def open_reason(closed_for: str | None) -> str:
    """Why a session opens: ``new`` (never seen), ``resumed`` (it was closed as idle or evicted) or
    ``restart`` (it was closed on purpose and its id came back)."""
    if closed_for is None:
        return "new"
    return "resumed" if closed_for in ("idle", "evicted") else "restart"


class StoreUnavailable(Exception):
    """The shared store could not be reached; the proxy forwards the request unchanged (fail open)."""


@dataclass(frozen=True, slots=True)
class OpenResult:
    """``session``; ``reason`` it was opened (``new``, ``restart``, ``resumed``) or None when it was already
    live; ``evicted``: sessions closed to make room."""

    session: LiveSession
    reason: str | None = None
    evicted: tuple[LiveSession, ...] = ()


class SessionStore(Protocol):
    """What the proxy needs from a state store (see the module docstring)."""

    async def find(self, tenant: str, checkpoints: Sequence[bytes]) -> str | None:
        """The live session of ``tenant`` that a request with ``checkpoints`` continues, or None."""
        ...

    async def open(
        self, tenant: str, sid: str, *, parent: str | None, provider: str, explicit: bool, now: float
    ) -> OpenResult:
        """The live session ``(tenant, sid)``, opened when needed."""
        ...

    async def commit(
        self,
        session: LiveSession,
        prepared: Prepared,
        client_body: dict[str, Any],
        checkpoints: Sequence[bytes],
        size: int = 0,
    ) -> bool:
        """Record ``prepared`` as sent in ``session`` (see the module docstring); ``size``: the session's
        estimated state bytes from now on."""
        ...

    async def close(self, tenant: str, sid: str, now: float, reason: str) -> LiveSession | None:
        """Close the live generation of ``(tenant, sid)`` for ``reason``; None when there is none."""
        ...

    async def sweep(self, now: float, idle: float) -> list[LiveSession]:
        """Close every session idle for more than ``idle`` seconds."""
        ...

    def live(self) -> int:
        """Live sessions this process knows of."""
        ...

    async def ping(self) -> bool:
        """Whether the store answers now (False rather than raising)."""
        ...

    async def aclose(self) -> None:
        """Release connections."""
        ...


@dataclass(slots=True)
class MemoryStore:
    """The in-process store (see the module docstring). ``factory`` builds a new session's pipeline.
    ``bytes``: the estimated state bytes of the live sessions."""

    factory: PipelineFactory
    max_sessions: int = 10_000
    max_tombstones: int = 50_000
    index_checkpoints: int = 64
    min_inner_match: int = 2
    _sessions: OrderedDict[tuple[str, str], LiveSession] = field(default_factory=OrderedDict)
    _tombstones: OrderedDict[tuple[str, str], tuple[int, str]] = field(default_factory=OrderedDict)
    _index: dict[tuple[str, bytes], tuple[str, bool]] = field(default_factory=dict)
    max_bytes: int = 256 * 1024 * 1024
    _bytes: int = 0
    _evicted: list[LiveSession] = field(default_factory=list)

    async def find(self, tenant: str, checkpoints: Sequence[bytes]) -> str | None:
        """See :meth:`SessionStore.find`."""
        return match_checkpoints(checkpoints, lambda h: self._index.get((tenant, h)), self.min_inner_match)

    async def open(
        self, tenant: str, sid: str, *, parent: str | None, provider: str, explicit: bool, now: float
    ) -> OpenResult:
        """See :meth:`SessionStore.open`."""
        key = (tenant, sid)
        sess = self._sessions.get(key)
        if sess is not None:
            self._sessions.move_to_end(key)
            sess.last_seen = now
            evicted, self._evicted = tuple(self._evicted), []
            return OpenResult(sess, None, evicted)
        prev = self._tombstones.pop(key, None)
        generation = 0 if prev is None else prev[0] + 1
        lineage = sid
        if parent is not None:
            ancestor = self._sessions.get((tenant, parent))
            lineage = ancestor.lineage if ancestor is not None else parent
        pipe = self.factory(tenant, provider, sid, lineage)
        sess = LiveSession(tenant, sid, generation, lineage, parent, provider, pipe, explicit, last_seen=now)
        self._sessions[key] = sess
        while len(self._sessions) > self.max_sessions:
            _, old = self._sessions.popitem(last=False)
            self._retire(old, "evicted")
            self._evicted.append(old)
        evicted, self._evicted = tuple(self._evicted), []
        return OpenResult(sess, open_reason(prev[1] if prev is not None else None), evicted)

    async def commit(
        self,
        session: LiveSession,
        prepared: Prepared,
        client_body: dict[str, Any],
        checkpoints: Sequence[bytes],
        size: int = 0,
    ) -> bool:
        """See :meth:`SessionStore.commit`."""
        key = (session.tenant, session.sid)
        if session.closed or self._sessions.get(key) is not session:
            return False
        session.pipe.commit(prepared)
        self._bytes += size - session.size
        session.size = size
        while self._bytes > self.max_bytes and len(self._sessions) > 1:
            old_key, old = next(iter(self._sessions.items()))
            if old is session:
                break
            del self._sessions[old_key]
            self._retire(old, "evicted")
            self._evicted.append(old)
        session.turns += 1
        session.version += 1
        if prepared.at is not None:
            session.last_seen = max(session.last_seen, prepared.at)
        self._drop_entries(session)
        entries = index_entries(checkpoints, self.index_checkpoints)
        for h, head in entries:
            self._index[(session.tenant, h)] = (session.sid, head)
        session.entries = tuple(h for h, _ in entries)
        return True

    async def close(self, tenant: str, sid: str, now: float, reason: str) -> LiveSession | None:
        """See :meth:`SessionStore.close`."""
        sess = self._sessions.pop((tenant, sid), None)
        if sess is not None:
            self._retire(sess, reason)
        return sess

    async def sweep(self, now: float, idle: float) -> list[LiveSession]:
        """See :meth:`SessionStore.sweep`."""
        out: list[LiveSession] = []
        # Least recently used first: stop at the first session still active.
        while self._sessions:
            key, sess = next(iter(self._sessions.items()))
            if now - sess.last_seen <= idle:
                break
            del self._sessions[key]
            self._retire(sess, "idle")
            out.append(sess)
        return out

    def live(self) -> int:
        """See :meth:`SessionStore.live`."""
        return len(self._sessions)

    async def ping(self) -> bool:
        """See :meth:`SessionStore.ping` (memory always answers)."""
        return True

    @property
    def bytes(self) -> int:
        """Estimated state bytes of the live sessions."""
        return self._bytes

    async def aclose(self) -> None:
        """Nothing to release."""

    def _retire(self, sess: LiveSession, reason: str) -> None:
        sess.closed = True
        self._bytes -= sess.size
        self._drop_entries(sess)
        key = (sess.tenant, sess.sid)
        self._tombstones[key] = (sess.generation, reason)
        self._tombstones.move_to_end(key)
        while len(self._tombstones) > self.max_tombstones:
            self._tombstones.popitem(last=False)

    def _drop_entries(self, sess: LiveSession) -> None:
        for h in sess.entries:
            k = (sess.tenant, h)
            hit = self._index.get(k)
            if hit is not None and hit[0] == sess.sid:
                del self._index[k]
        sess.entries = ()
