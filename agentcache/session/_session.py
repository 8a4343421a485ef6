"""One agent conversation: :class:`Session`, the object a door holds or looks up.

A session has a stable ``session_id`` (within its ``tenant``), a ``generation`` (incarnation: a restart, or a
request after a close, starts the next), an ``attempt`` (failed tries of the current turn; reset when a turn is
committed), a ``parent`` for a subagent and the ``lineage`` of its root (subagents and later generations share
the root's cache scope and, on OpenAI, its ``prompt_cache_key``). Its ``target`` (whose cache rules apply) is
decided at its first request and kept. Requests go through :meth:`Session.begin` → :class:`~agentcache.session.
Turn`; the rules for closes, restarts, idle sessions and late responses are the :class:`~agentcache.Sessions`
manager's, the same in every door.
"""

from __future__ import annotations

from typing import TYPE_CHECKING, Any

from ..model._fields import EventName, LifecycleEvent, SessionSignal, TurnReport
from ..model._rawjson import RawBody
from ..model._totals import UsageTotals
from ..model._types import Api
from ..targets import Target
from ._identity import Identity
from ._pipeline import SessionPipeline

if TYPE_CHECKING:
    from ._sessions import Sessions
    from ._turn import Turn

__all__ = ["STATE_BYTES_PER_BLOCK_BYTE", "UNSET", "Session"]

#: A session's pipeline state costs about this many bytes per byte of its last request's canonical blocks (the
#: body kept as sent, its canonical blocks and the block cache; measured ~9-10x on tau-bench-shaped bodies).
STATE_BYTES_PER_BLOCK_BYTE = 10


class _Unset:
    def __repr__(self) -> str:
        return "UNSET"


#: "Not given" for a request time: the manager's clock is used (None means "no time known").
UNSET: Any = _Unset()


class Session:
    """One conversation: get one with :meth:`Sessions.session` or :meth:`fork`; ``with``/``async with`` closes
    it. Read-only attributes: ``session_id``, ``tenant``, ``parent``, ``lineage``, ``generation``, ``attempt``,
    ``turns`` (committed this generation), ``closed``/``close_reason``, ``target``, ``last_report`` (the last
    committed turn's :class:`~agentcache.TurnReport`), ``totals`` (:class:`~agentcache.UsageTotals`, every
    generation in this process)."""

    def __init__(
        self,
        manager: Sessions,
        tenant: str,
        session_id: str,
        parent: str | None,
        lineage: str,
        generation: int,
        *,
        target: Target | None = None,
        model: str | None = None,
        explicit: bool = True,
        snapshot: dict[str, Any] | None = None,
    ) -> None:
        self.manager, self.tenant, self.session_id = manager, tenant, session_id
        self.parent, self.lineage, self.generation = parent, lineage, generation
        self.target, self.model, self.explicit = target, model, explicit
        self.attempt = self.turns = self.version = 0
        self.closed, self.close_reason = False, ""
        self.last_active = 0.0
        self.last_report: TurnReport | None = None
        self.totals = UsageTotals()
        self.entries: tuple[bytes, ...] = ()
        self.size = 0
        #: The wire size in bytes of the last committed request, when the door knew it (the proxy does).
        self.body_bytes: int | None = None
        self._snapshot = snapshot
        self._pipeline: SessionPipeline | None = None
        self._forks: dict[str, int] = {}

    # ---- state ---------------------------------------------------------------------------------

    @property
    def signal(self) -> SessionSignal:
        """The current ``session_signal``."""
        return SessionSignal(self.session_id, self.generation, self.attempt, self.parent, self.lineage, self.turns)

    @property
    def provider(self) -> str | None:
        """The name of the session's target (``anthropic``, ``openai``, ``engine``), None before its first
        request."""
        return self.target.name if self.target is not None else None

    @property
    def pipeline(self) -> SessionPipeline:
        """This generation's pipeline (created on first use, from the store's snapshot when there is one)."""
        if self._pipeline is None:
            if self.target is None:
                raise RuntimeError(f"session {self.session_id}: no target before its first request")
            self._pipeline = self.manager.pipeline_for(self, self._snapshot)
            self._snapshot = None
        return self._pipeline

    def estimated_bytes(self) -> int:
        """Estimated bytes of this session's state in memory (see :data:`STATE_BYTES_PER_BLOCK_BYTE`): from the
        size of its last request's body when the door knew it (``body_bytes``), else from its blocks."""
        if self.body_bytes is not None:
            return STATE_BYTES_PER_BLOCK_BYTE * self.body_bytes
        sent = self._pipeline.sent if self._pipeline is not None else None
        if sent is None:
            return 0
        return STATE_BYTES_PER_BLOCK_BYTE * sum(len(b.data) for b in sent.blocks)

    def revive(self, generation: int, now: float) -> None:
        """Become ``generation`` of the same id, with no history (the store reopens a closed id)."""
        self.generation, self.attempt, self.turns, self.version = generation, 0, 0, 0
        self.closed, self.close_reason = False, ""
        self._pipeline = self._snapshot = None
        self.last_report = None
        self.last_active = now
        self.entries, self.size = (), 0

    def responded(self, turn: Turn, response_id: str) -> None:
        """Committed ``turn``'s response arrived with ``response_id`` (provider diagnostics compare the next request
        with it); ignored when the turn is no longer the session's last."""
        if self._pipeline is not None and turn.generation == self.generation:
            self._pipeline.responded(turn.prepared, response_id)

    def retire(self, reason: str) -> None:
        """Mark the generation closed and free its pipeline (the bulk of a session's memory)."""
        self.closed, self.close_reason = True, reason
        self._pipeline = self._snapshot = None

    def event(
        self, name: EventName, at: float, reason: str | None = None, basis: Session | None = None
    ) -> LifecycleEvent:
        """An event with no request of its own, carrying the prefix and tier of ``basis``'s (default: this
        session's) last committed turn, if any; a fork's basis is the parent, whose prefix it shares."""
        r = (basis or self).last_report
        ident, tier = (r.prefix_identity, r.storage_tier) if r is not None else (None, None)
        return LifecycleEvent(name, self.signal, at, reason, ident, None, tier)

    # ---- requests ------------------------------------------------------------------------------

    def begin(
        self,
        api: Api | str,
        body: dict[str, Any],
        *,
        now: float | None = None,
        at: float | None = UNSET,
        raw: RawBody | None = None,
        base_url: str | None = None,
        target: Target | None = None,
    ) -> Turn:
        """Prepare wire ``body`` of ``api``; returns the :class:`~agentcache.session.Turn` to complete. A closed
        session starts its next generation first. ``now``: the manager clock's seconds; ``at``: the request's
        time for planning (default ``now``; None: unknown); ``raw``: the body's source texts; ``base_url``: the
        destination (sinks' ``annotate``); ``target``: the door's resolution, used if the session has none.
        Raises InputError (malformed body) or an internal error, leaving no trace: the caller then sends its
        original request."""
        identity = Identity(self.tenant, self.session_id, self.parent)
        return self.manager.begin(
            api, body, identity=identity, now=now, at=at, raw=raw, base_url=base_url, target=target, reuse=self
        )

    async def abegin(
        self,
        api: Api | str,
        body: dict[str, Any],
        *,
        now: float | None = None,
        at: float | None = UNSET,
        raw: RawBody | None = None,
        base_url: str | None = None,
        target: Target | None = None,
    ) -> Turn:
        """:meth:`begin` through an asynchronous store."""
        identity = Identity(self.tenant, self.session_id, self.parent)
        return await self.manager.abegin(
            api, body, identity=identity, now=now, at=at, raw=raw, base_url=base_url, target=target, reuse=self
        )

    def fork(self, name: str = "subagent", *, model: str | None = None) -> Session:
        """A subagent session ``<session_id>/<name>`` (``-2``, ``-3``... when taken): same tenant, lineage and
        target, ``parent`` = this session (``fork`` event). Raises SessionClosedError when this one is closed."""
        return self.manager.fork(self, name, model)

    def restart(self) -> None:
        """Start a new generation: ``close`` then ``open`` (both reason ``restart``); history, attempt and turn
        count start over; totals carry on."""
        self.manager.restart(self)

    def close(self, reason: str = "closed") -> None:
        """Close the session (``close`` event; idempotent). Later responses change nothing; a later request
        starts the next generation."""
        if not self.closed:
            self.manager.close(self.session_id, tenant=self.tenant, reason=reason)

    async def aclose(self, reason: str = "closed") -> None:
        """:meth:`close` through an asynchronous store."""
        if not self.closed:
            await self.manager.aclose(self.session_id, tenant=self.tenant, reason=reason)

    def __enter__(self) -> Session:
        return self

    def __exit__(self, *exc: object) -> None:
        self.close()

    async def __aenter__(self) -> Session:
        return self

    async def __aexit__(self, *exc: object) -> None:
        await self.aclose()

    def __repr__(self) -> str:
        state = f"closed ({self.close_reason})" if self.closed else "open"
        return f"Session({self.session_id!r}, generation={self.generation}, attempt={self.attempt}, {state})"
