"""The live-traffic report (``/agentcache/v1/report``): the audit JSON schema, filled from what passes through.

Arms, per session and in total:

* ``reported``: the usage the upstream reported for each request (priced with the table; an engine or an
  unknown model costs 0);
* ``as_sent`` and ``agentcache`` (when ``simulate`` is on): the provider simulators replaying the client's
  original requests and the requests agentcache sent, through one shared simulated cache per tenant and
  provider, as ``agentcache audit`` does. Their difference is the money agentcache saved; the
  ``agentcache_proxy_saved_usd`` gauge follows it.

Breaks are diagnosed against the session's previous request; misses come from the simulated arms. Everything
is bounded: the most recent ``max_sessions`` sessions and ``max_records`` breaks and misses are kept, at most
``max_scopes`` simulated caches, and when they hold more than ``max_chain`` prefixes in all (~80 bytes each)
the biggest is restarted (a brief under-count of reuse, not a leak).
"""

from __future__ import annotations

from collections import Counter, OrderedDict, deque
from dataclasses import dataclass, field
from typing import Any

from ..analysis._report import ArmMetrics, AuditReport, BreakRecord, MissRecord, SessionReport
from ..model._usage import CacheUsage, cost_usd
from ..session._pipeline import Prepared
from ..simulate import AnthropicSimulator, OpenAISimulator, SimUsage, simulator_for
from ._metrics import ProxyMetrics, model_label

__all__ = ["LIVE_ARMS", "LiveReport"]

LIVE_ARMS = ("as_sent", "agentcache", "reported")


@dataclass(slots=True)
class _Sims:
    as_sent: AnthropicSimulator | OpenAISimulator
    agentcache: AnthropicSimulator | OpenAISimulator
    size: int = 0
    last: float = 0.0


@dataclass(slots=True)
class LiveReport:
    """Accumulates the live report; see the module docstring."""

    metrics: ProxyMetrics | None = None
    simulate: bool = True
    max_sessions: int = 10_000
    max_records: int = 2_000
    max_chain: int = 400_000
    max_scopes: int = 16
    totals: dict[str, ArmMetrics] = field(default_factory=lambda: {a: ArmMetrics() for a in LIVE_ARMS})
    sessions: OrderedDict[str, SessionReport] = field(default_factory=OrderedDict)
    breaks: deque[BreakRecord] = field(default_factory=deque)
    misses: deque[MissRecord] = field(default_factory=deque)
    providers: Counter[str] = field(default_factory=Counter)
    models: Counter[str] = field(default_factory=Counter)
    _sims: OrderedDict[tuple[str, str], _Sims] = field(default_factory=OrderedDict)

    def record(
        self,
        session: str,
        tenant: str,
        provider: str,
        request: int,
        prepared: Prepared,
        usage: CacheUsage | None,
        repaired: bool | None,
    ) -> None:
        """Add one committed request: its session key (``tenant/sid``), index within the session, the
        pipeline's decision, the reported usage, and whether its break (if any) was repaired."""
        model = prepared.planned.model
        self.providers[provider] += 1
        self.models[model] += 1
        rep = self._session(session)
        rep.requests += 1
        label = model_label(provider, model)
        if usage is not None:
            cost = cost_usd(usage, provider, model) or 0.0
            sim = SimUsage(
                usage.prompt_tokens,
                usage.cache_read_tokens,
                usage.cache_write_tokens,
                usage.uncached_tokens,
                cost,
                usage.cache_write_1h_tokens,
            )
            rep.arms["reported"].add(sim)
            self.totals["reported"].add(sim)
            if self.metrics is not None:
                self.metrics.cost.labels(provider, label, "reported").inc(cost)
        d = prepared.divergence
        if d is not None and d.cause is not None:
            fixed = bool(repaired)
            self._push(self.breaks, BreakRecord(session, request, d.first_divergent, d.cause, d.tokens_lost, fixed))
            if self.metrics is not None:
                self.metrics.breaks.labels(provider, d.cause, str(fixed).lower()).inc()
        if self.simulate and prepared.at is not None:
            self._simulate(session, tenant, provider, label, request, prepared)

    def _simulate(self, session: str, tenant: str, provider: str, label: str, request: int, prepared: Prepared) -> None:
        sims = self._sims_for(tenant, provider)
        now = max(sims.last, prepared.at or 0.0)
        sims.last = now
        rep = self.sessions[session]
        costs: dict[str, float] = {}
        for arm, sim, req in (
            ("as_sent", sims.as_sent, prepared.original),
            ("agentcache", sims.agentcache, prepared.planned),
        ):
            res = sim.run(req, now)
            rep.arms[arm].add(res.usage)
            self.totals[arm].add(res.usage)
            costs[arm] = res.usage.cost_usd
            lost = res.matched_tokens - res.usage.cache_read_tokens
            if res.loss_cause and (lost > 0 or res.rejected):
                miss = MissRecord(session, request, arm, res.loss_cause, max(lost, 0), res.rejected, res.loss_where)
                self._push(self.misses, miss)
                if self.metrics is not None:
                    self.metrics.misses.labels(provider, arm, res.loss_cause).inc()
            if self.metrics is not None:
                self.metrics.cost.labels(provider, label, arm).inc(res.usage.cost_usd)
        if self.metrics is not None:
            self.metrics.add_saved(costs["as_sent"] - costs["agentcache"])
        sims.size = _seen(sims.as_sent) + _seen(sims.agentcache)
        while sum(s.size for s in self._sims.values()) > self.max_chain:
            big = max(self._sims, key=lambda k: self._sims[k].size)
            old = self._sims.pop(big)  # restart the biggest simulated cache (a brief under-count of reuse)
            self._sims[big] = _Sims(simulator_for(big[1]), simulator_for(big[1]), last=old.last)
            if old.size == 0:
                break

    def _sims_for(self, tenant: str, provider: str) -> _Sims:
        key = (tenant, provider)
        sims = self._sims.get(key)
        if sims is None:
            sims = self._sims[key] = _Sims(simulator_for(provider), simulator_for(provider))
            while len(self._sims) > self.max_scopes:
                self._sims.popitem(last=False)
        self._sims.move_to_end(key)
        return sims

    def _session(self, session: str) -> SessionReport:
        rep = self.sessions.get(session)
        if rep is None:
            rep = self.sessions[session] = SessionReport(session, arms={a: ArmMetrics() for a in LIVE_ARMS})
            while len(self.sessions) > self.max_sessions:
                self.sessions.popitem(last=False)
        else:
            self.sessions.move_to_end(session)
        return rep

    def _push(self, records: deque[Any], record: Any) -> None:
        records.append(record)
        while len(records) > self.max_records:
            records.popleft()

    def report(self, tenant: str | None = None) -> AuditReport:
        """The report (only ``tenant``'s sessions, breaks and misses when given; totals are then theirs)."""
        prefix = None if tenant is None else tenant + "/"
        sessions = [s for k, s in self.sessions.items() if prefix is None or k.startswith(prefix)]
        if prefix is None:
            totals = self.totals
        else:
            totals = {a: ArmMetrics() for a in LIVE_ARMS}
            for s in sessions:
                for a, m in s.arms.items():
                    for name in ("requests", "prompt_tokens", "cache_read_tokens", "cache_write_tokens"):
                        setattr(totals[a], name, getattr(totals[a], name) + getattr(m, name))
                    totals[a].uncached_tokens += m.uncached_tokens
                    totals[a].cost_usd += m.cost_usd
        breaks = [b for b in self.breaks if prefix is None or b.session.startswith(prefix)]
        misses = [m for m in self.misses if prefix is None or m.session.startswith(prefix)]
        provider = _single(self.providers)
        return AuditReport(provider, _single(self.models), totals, sessions, breaks, misses)

    def to_dict(self, tenant: str | None = None) -> dict[str, Any]:
        """The JSON document (audit schema)."""
        return self.report(tenant).to_dict()


def _seen(sim: AnthropicSimulator | OpenAISimulator) -> int:
    """Prefixes a simulator remembers (its memory grows with them): the sizes of its scopes' seen-indexes."""
    scopes = getattr(sim, "_scopes", {})
    return sum(len(getattr(scope, "seen", ())) for scope in scopes.values())


def _single(counts: Counter[str]) -> str:
    """The only value seen, ``mixed`` for several, ``none`` for none."""
    if not counts:
        return "none"
    return next(iter(counts)) if len(counts) == 1 else "mixed"
