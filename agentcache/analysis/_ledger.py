"""The per-arm ledger shared by ``agentcache audit`` and the proxy's live report: every committed turn, replayed
through one shared simulated cache per arm and cache scope, in time order, with its breaks and misses.

Arms (docs/design.md, "Cache scope"): ``as_sent`` (the client's requests as they came), ``agentcache`` (what was sent
after repairs and policies), optionally one per baseline strategy (``--compare``: Anthropic marker strategies,
:mod:`agentcache.policies.anchors`, or OpenAI ``prompt_cache_key`` strategies, :mod:`agentcache.analysis._key_arms`),
``ideal`` (every token already sent earlier in the scope counts as reused: the bound) and ``reported`` (the usage the
upstream reported, priced by the provider that served it: :func:`~agentcache.model._usage.served_by`). With
``sim_errors``, each request whose reported usage comes from the cache the target simulates also gets a
:class:`~agentcache.analysis._report.SimErrorRecord`: the ``as_sent`` arm against that usage (the simulator's
error). A break is the client's divergence from its own previous request (``repaired``: the sent request extends
what the session sent before), or, for a session's first request, a difference in the static prefix against
another session of the scope where they would otherwise share it. A miss is a simulated arm reading fewer tokens
than it matched, for a cache-mechanics cause.

Bounded where asked (the live report): the most recent ``max_sessions`` sessions and ``max_records`` breaks and
misses, ``max_scopes`` simulated caches, and when these hold more than ``max_chain`` prefixes in all the biggest
is restarted (a brief under-count of reuse, not a leak); the cross-session static indexes keep the static heads of
requests (never whole requests), ``max_static_bytes`` of them in all, oldest forgotten first.
"""

from __future__ import annotations

from collections import OrderedDict, deque
from collections.abc import Iterable
from dataclasses import dataclass, field, replace
from typing import Any

from ..model._canonical import common_prefix, static_end
from ..model._causes import SYSTEM_VOLATILE, TOOLS_REORDERED, TOOLS_SERIALIZATION
from ..model._types import TargetKind
from ..model._usage import CacheUsage, served_by
from ..model._volatile import VolatileSpan
from ..policies import STRATEGIES, apply_strategy
from ..policies.volatility import suggestion
from ..simulate import Concurrency, IdealSimulator, OpenAISimulator, SimResult, Simulator, SimUsage
from ..targets import Target, cost_usd
from ._diagnose import _classify, extends
from ._inferred import provider_loss
from ._key_arms import KeyArms
from ._report import ArmMetrics, AuditReport, BreakRecord, MissRecord, SessionReport, SimErrorRecord, TurnRecord
from ._static import StaticIndex

__all__ = ["COALESCED", "Ledger", "Recorded"]

#: The arm of agentcache with its coalescer, simulated when the ledger models concurrency.
COALESCED = "agentcache_coalesced"

#: Cross-session differences worth reporting: the sessions would share the prefix without them.
_CROSS_SESSION_CAUSES = frozenset({TOOLS_REORDERED, TOOLS_SERIALIZATION, SYSTEM_VOLATILE})


@dataclass(frozen=True, slots=True)
class Recorded:
    """What :meth:`Ledger.record` added for one request: the simulated arms' ``results``, its ``brk`` (or
    None), the ``misses`` and the priced ``reported`` usage (or None)."""

    results: dict[str, SimResult]
    brk: BreakRecord | None
    misses: tuple[MissRecord, ...]
    reported: SimUsage | None


@dataclass(slots=True)
class _Scope:
    """The simulated caches of one cache scope, one per arm."""

    target: Target
    sims: dict[str, Simulator]
    static: StaticIndex
    last: float = 0.0
    keys: KeyArms = field(default_factory=KeyArms)


class Ledger:
    """See the module docstring. ``target``: whose cache the simulators model (its rules and prices); ``model``:
    price every request as this model. ``strategies``: baseline strategies to add as arms (Anthropic marker
    strategies, ``STRATEGIES``, or OpenAI key strategies, ``KEY_STRATEGIES``; ``rpm_per_key`` for the latter's
    key planner). ``ideal``: add the ``ideal`` arm (two passes: :meth:`finish` prices it). ``reported``: add the
    ``reported`` arm; ``sim_errors``: keep the simulator's error per request (see the module docstring).
    ``overflow``: the request times are real, so OpenAI's simulated partitions overflow above their per-minute rate
    (:mod:`agentcache.simulate._openai`).
    ``simulate``: False keeps only ``reported``. ``concurrency``: model overlapping requests
    (:class:`~agentcache.simulate.Concurrency`) in every simulated arm and add the :data:`COALESCED` arm.
    ``keep_turns``: keep a :class:`TurnRecord` per request
    (charts, tests)."""

    def __init__(
        self,
        target: Target | None = None,
        *,
        model: str | None = None,
        strategies: Iterable[str] = (),
        ideal: bool = False,
        reported: bool = False,
        sim_errors: bool = False,
        rpm_per_key: float = 15.0,
        overflow: bool = False,
        simulate: bool = True,
        keep_turns: bool = False,
        max_sessions: int | None = None,
        max_records: int | None = None,
        max_scopes: int = 16,
        max_chain: int = 400_000,
        max_static_bytes: int = 16 * 1024 * 1024,
        concurrency: Concurrency | None = None,
    ) -> None:
        self.target, self.model = target, model
        self.strategies = tuple(strategies)
        # Overlapping requests modelled: every simulated arm sees them, and ``agentcache_coalesced`` is agentcache
        # with its coalescer (a request waits for the sibling writing its prefix).
        self.concurrency = concurrency
        coalesced = (COALESCED,) if concurrency is not None and simulate else ()
        self.simulated = ("as_sent", "agentcache", *coalesced, *self.strategies) if simulate else ()
        base = ("as_sent", "agentcache", *coalesced) if simulate else ()
        self.arms = (*base, *(("ideal",) if ideal else ()), *self.strategies, *(("reported",) if reported else ()))
        self.keep_turns = keep_turns
        self.sim_errors = sim_errors and simulate
        self.rpm_per_key = rpm_per_key
        self.overflow = overflow
        self.max_sessions, self.max_records, self.max_scopes, self.max_chain = (
            max_sessions,
            max_records,
            max_scopes,
            max_chain,
        )
        self.max_static_bytes = max_static_bytes
        self.totals: dict[str, ArmMetrics] = {a: ArmMetrics() for a in self.arms}
        self.sessions: OrderedDict[str, SessionReport] = OrderedDict()
        self.breaks: deque[BreakRecord] = deque()
        self.misses: deque[MissRecord] = deque()
        self.errors: deque[SimErrorRecord] = deque()
        self.turns: list[TurnRecord] = []
        self._scopes: OrderedDict[str, _Scope] = OrderedDict()
        self._ideal = IdealSimulator(target.name, model) if ideal and target is not None else None
        self._pending: list[tuple[SessionReport, int, float | None, dict[str, SimUsage], Any]] = []

    # ---- recording -----------------------------------------------------------------------------

    def record(
        self,
        session: str,
        request: int,
        prepared: Any,
        *,
        scope: str = "",
        usage: CacheUsage | None = None,
        target: Target | None = None,
        parent: str | None = None,
        lineage: str | None = None,
    ) -> Recorded:
        """Add one committed request: its ``session`` key, 0-based ``request`` index within the session, the
        pipeline's :class:`~agentcache.session.Prepared`, its cache ``scope`` (tenant), the reported ``usage``,
        its session's ``target`` (default the ledger's) and, when known, its ``parent`` and ``lineage`` keys."""
        t = target or self.target
        assert t is not None, "a ledger without a target needs one per record"
        rep = self._session(session)
        if parent is not None or lineage is not None:
            rep.parent, rep.lineage = parent, lineage
        rep.requests += 1
        sc = self._scope(f"{scope}\x00{t.name}", t)
        gap, rep.last = request > 0 and rep.last != request - 1, request
        if gap and self.simulated:
            self._prime(sc, prepared, session, request, lineage)
        now = sc.last = max(sc.last, prepared.at if prepared.at is not None else sc.last)
        results: dict[str, SimResult] = {}
        if self.simulated:
            arms = self._arms(sc, prepared.client, prepared.planned, (session, request, lineage, prepared.at))
            results = {arm: sc.sims[arm].run(req, now) for arm, req in arms.items()}
        brk = self._break(session, request, prepared, sc.static, results.get("agentcache"))
        if brk is not None:
            self._push(self.breaks, brk)
        sc.static.add(session, prepared.client)
        usages = {arm: r.usage for arm, r in results.items()}
        misses: list[MissRecord] = []
        for arm, r in results.items():
            rep.arms[arm].add(r.usage)
            self.totals[arm].add(r.usage)
            lost = r.matched_tokens - r.usage.cache_read_tokens
            if r.loss_cause and (lost > 0 or r.rejected):
                miss = MissRecord(session, request, arm, r.loss_cause, max(lost, 0), r.rejected, r.loss_where)
                misses.append(miss)
                self._push(self.misses, miss)
        sim: SimUsage | None = None
        if "reported" in self.arms and usage is not None:
            served = served_by(usage)

            def price(u: CacheUsage) -> float | None:
                if served is None or served == t.name or t.kind == TargetKind.ENGINE:  # an engine is free
                    return t.cost(u, self.model or prepared.planned.model)
                # another provider's usage through this API (LiteLLM in front of Anthropic): its own prices
                return cost_usd(u, served, prepared.planned.model)

            sim = SimUsage.of(usage, price(usage) or 0.0)
            usages["reported"] = sim
            rep.arms["reported"].add(sim)
            self.totals["reported"].add(sim)
            if served == t.name and "as_sent" in results:
                if self.sim_errors:
                    self._push(self.errors, SimErrorRecord(session, request, "as_sent", results["as_sent"].usage, sim))
                loss = provider_loss(session, request, results["as_sent"].usage, usage, price)
                if loss is not None:  # the upstream did not read what the client's own traffic could
                    misses.append(loss)
                    self._push(self.misses, loss)
        if self._ideal is not None:
            self._ideal.run(prepared.planned, t.name)  # markers are not content: the planned chain is the repaired one
            self._pending.append((rep, request, prepared.at, usages, prepared))
        elif self.keep_turns:
            record = TurnRecord(session, request, prepared.at, usages, prepared.repairs, prepared.markers, prepared)
            self.turns.append(record)
        self._bound_sims()
        return Recorded(results, brk, tuple(misses), sim)

    def finish(self) -> None:
        """Price the ``ideal`` arm (it needs every request first: a write is charged only if a later request reads
        it) and complete the turn records."""
        if self._ideal is None:
            return
        for (rep, request, at, usages, prepared), ideal in zip(self._pending, self._ideal.finish(), strict=True):
            rep.arms["ideal"].add(ideal)
            self.totals["ideal"].add(ideal)
            if self.keep_turns:
                arms = {a: (ideal if a == "ideal" else usages[a]) for a in self.arms if a == "ideal" or a in usages}
                self.turns.append(
                    TurnRecord(rep.session, request, at, arms, prepared.repairs, prepared.markers, prepared)
                )
        self._pending.clear()

    def report(self, provider: str, model: str, tenant: str | None = None) -> AuditReport:
        """The report (only ``tenant``'s sessions, breaks and misses when given: session keys ``tenant/...``;
        totals are then theirs)."""
        prefix = None if tenant is None else tenant + "/"
        sessions = [s for k, s in self.sessions.items() if prefix is None or k.startswith(prefix)]
        totals = self.totals
        if prefix is not None:
            totals = {a: ArmMetrics() for a in self.arms}
            for s in sessions:
                for a, m in s.arms.items():
                    totals[a].merge(m)
        breaks = [b for b in self.breaks if prefix is None or b.session.startswith(prefix)]
        misses = [m for m in self.misses if prefix is None or m.session.startswith(prefix)]
        errors = [e for e in self.errors if prefix is None or e.session.startswith(prefix)]
        report = AuditReport(provider, model, totals, sessions, breaks, misses, list(self.turns))
        report.simulator_errors = errors
        return report

    # ---- parts -------------------------------------------------------------------------------

    def _break(
        self, session: str, request: int, prepared: Any, static: StaticIndex, agentcache: SimResult | None
    ) -> BreakRecord | None:
        d = prepared.divergence
        if d is not None:
            if d.cause is None:
                return None
            before = prepared.before
            fixed = before is not None and extends(before, prepared.planned)
            volatile = _span(d.volatile, d.first_divergent)
            return BreakRecord(session, request, d.first_divergent, d.cause, d.tokens_lost, fixed, None, volatile)
        if request != 0:
            return None
        orig = prepared.client
        ref = static.match(orig)
        if ref is None:
            return None
        other, prev = ref
        n = common_prefix(prev, orig)
        end = static_end(prev)
        if n >= end or n >= static_end(orig):
            return None
        cause, path, span = _classify(prev, orig, n, prev.blocks[n], orig.blocks[n])
        if cause not in _CROSS_SESSION_CAUSES:
            return None
        lost = prev.tokens_before(end) - prev.tokens_before(n)
        planned = prepared.planned
        fixed = agentcache is not None and agentcache.matched_tokens >= planned.tokens_before(static_end(planned))
        return BreakRecord(session, request, path, cause, lost, fixed, other, _span(span, path))

    def _prime(self, sc: _Scope, prepared: Any, session: str, request: int, lineage: str | None) -> None:
        """The session's previous request, which this ledger did not record (another worker or replica served it,
        or the ledger had dropped the session), written into the simulated caches as it was sent, uncounted: what
        this request finds there is then what it found upstream, not a session start again. At the previous
        request's time when known (never before the scope's clock), else the scope's clock."""
        planned, diverged = prepared.before, prepared.diverged
        if planned is None:
            return
        client = diverged.prev if diverged is not None else planned
        times = prepared.state.times
        at = sc.last = max(sc.last, times[-2] if len(times) >= 2 and prepared.state.timed else sc.last)
        for arm, req in self._arms(sc, client, planned, (session, request - 1, lineage, at)).items():
            sc.sims[arm].run(req, at)
        sc.static.add(session, client)

    def _arms(
        self, sc: _Scope, client: Any, planned: Any, where: tuple[str, int, str | None, float | None]
    ) -> dict[str, Any]:
        """The request each simulated arm sends for the client's request ``client`` that agentcache sent as
        ``planned``: ``where`` is ``(session, request index, lineage, time)`` (the key strategies' inputs)."""
        session, request, lineage, at = where
        out = {"as_sent": client, "agentcache": planned}
        if COALESCED in sc.sims:
            out[COALESCED] = planned
        for name in self.strategies:
            if name in STRATEGIES:
                out[name] = apply_strategy(name, client)
            else:
                out[name] = sc.keys.apply(name, client, session, request, lineage or session, at)
        return out

    def _session(self, session: str) -> SessionReport:
        rep = self.sessions.get(session)
        if rep is None:
            rep = self.sessions[session] = SessionReport(session, arms={a: ArmMetrics() for a in self.arms})
            while self.max_sessions is not None and len(self.sessions) > self.max_sessions:
                self.sessions.popitem(last=False)
        elif self.max_sessions is not None:
            self.sessions.move_to_end(session)
        return rep

    def _scope(self, key: str, target: Target) -> _Scope:
        sc = self._scopes.get(key)
        if sc is None:
            sc = self._scopes[key] = self._new_scope(target)
            while len(self._scopes) > self.max_scopes:
                self._scopes.popitem(last=False)
        self._scopes.move_to_end(key)
        return sc

    def _new_scope(self, target: Target, last: float = 0.0) -> _Scope:
        sims: dict[str, Simulator] = {}
        for arm in self.simulated:
            conc = self.concurrency
            if conc is not None:
                conc = replace(conc, coalesce=arm == COALESCED)
            sim = target.simulator(self.model, conc)
            assert sim is not None
            if isinstance(sim, OpenAISimulator):
                sim.overflow = self.overflow
            sims[arm] = sim
        limit = None if self.max_sessions is None else self.max_static_bytes // self.max_scopes
        return _Scope(target, sims, StaticIndex(limit), last, KeyArms(self.rpm_per_key))

    def _bound_sims(self) -> None:
        if self.max_sessions is None:
            return
        while sum(_size(s) for s in self._scopes.values()) > self.max_chain:
            big = max(self._scopes, key=lambda k: _size(self._scopes[k]))
            old = self._scopes[big]
            # Restart the biggest: a brief under-count of reuse, not a leak.
            self._scopes[big] = self._new_scope(old.target, old.last)
            if _size(old) == 0:
                break

    def simulated_prefixes(self) -> int:
        """Prefixes the simulated caches remember (what their memory grows with; bounded by ``max_chain``)."""
        return sum(_size(s) for s in self._scopes.values())

    def static_bytes(self) -> int:
        """Estimated bytes of the cross-session static indexes (bounded by ``max_static_bytes`` in all)."""
        return sum(s.static.bytes for s in self._scopes.values())

    def _push(self, records: deque[Any], record: Any) -> None:
        records.append(record)
        while self.max_records is not None and len(records) > self.max_records:
            records.popleft()


def _size(scope: _Scope) -> int:
    """Prefixes a scope's simulators remember (their memory grows with them)."""
    total = 0
    for sim in scope.sims.values():
        scopes = getattr(sim, "_scopes", None)
        if scopes is not None:
            total += sum(len(getattr(s, "seen", ())) for s in scopes.values())
        else:
            total += int(getattr(sim, "prefixes", 0))
    return total


def _span(span: VolatileSpan | None, where: str | None) -> dict[str, Any] | None:
    if span is None:
        return None
    advice = suggestion(span, where or "the system prompt")
    return {"start": span.start, "end": span.end, "kinds": list(span.kinds), "text": span.text, "suggestion": advice}
