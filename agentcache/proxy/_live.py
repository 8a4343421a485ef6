"""The live-traffic report (``/agentcache/v1/report``): the audit JSON schema, filled from what passes through.

The same per-arm :class:`~agentcache.analysis.Ledger` as ``agentcache audit``, per session and in total:

* ``reported``: the usage the upstream reported for each request, priced by the session's target (an engine
  costs 0; a model the price table does not know is priced as the provider's default model);
* ``as_sent`` and ``agentcache`` (when ``simulate`` is on): the target's simulator replaying the client's original
  requests and the requests agentcache sent, through one shared simulated cache per tenant and target. Their
  difference is the money agentcache saved; the ``agentcache_saved_usd`` gauge follows it;
* ``engine`` (in front of a llama.cpp engine): the cached tokens the engine model predicts for what was sent,
  exact to the token with the upstream's own template and tokenizer (:class:`~._engine_arm.EngineArm`; off the
  request path). The cloud simulators' minimum lengths do not apply to an engine, so this is the arm to read
  beside ``reported`` there.

Bounded by ``max_bytes`` of estimated memory, shared out among its parts (:data:`REPORT_SHARES`): the most recent
sessions (at most ``max_sessions``) and breaks and misses (at most ``max_records``), a few simulated caches holding
a number of prefixes in all (see the ledger; each simulator keeps at most
:data:`~agentcache.simulate._base.MAX_MODEL_SCOPES` model scopes, least recently used dropped), the cross-session
static heads, and the provider/model names seen (the most common ``max_names``, each bounded). Every part evicts its
oldest; :meth:`LiveReport.estimated_bytes` is what the proxy's budget measures.

It also keeps the most recent ``max_records`` requests as turn records
(:class:`~agentcache.analysis._report.TurnRecord`: each arm's usage and the repairs; in place of the pipeline's whole
decision, a :class:`LiveTurn`: its client, model and TTL decision, never a request body) for the live page's
per-session timelines (:mod:`._live_page`); they are not part of the JSON document.
"""

from __future__ import annotations

from collections import Counter, deque
from dataclasses import dataclass
from typing import Any

from ..analysis._ledger import Ledger
from ..analysis._report import ArmMetrics, AuditReport, MissRecord, ModelRecord, TurnRecord
from ..model._rules import lookup_model
from ..model._types import Engine, TargetKind
from ..model._usage import CacheUsage
from ..session import Turn
from ..session._metrics import provider_label
from ._engine_arm import ENGINE_ARM, EngineArm
from ._metrics import ProxyMetrics

__all__ = ["LIVE_ARMS", "LiveReport", "LiveTurn"]

LIVE_ARMS = ("as_sent", "agentcache", "reported")
#: Bytes per session report (three arms' metrics): 837 B measured with a ``sys.getsizeof`` walk over 1,500
#: (CPython 3.11), rounded up.
SESSION_REPORT_BYTES = 900
#: Bytes per simulated prefix, over the seen index, the cache entries and the static index: 586 B measured
#: the same way over 33,000, rounded up.
SIM_PREFIX_BYTES = 600
#: Bytes per break or miss record with its strings (paths, causes, session key): an upper estimate.
RECORD_BYTES = 1500
#: Bytes per kept turn record (four arms' usage, the repairs and markers, the client and model names): an upper
#: estimate.
TURN_BYTES = 1200
#: How the report's ``max_bytes`` is shared out: the simulated caches' prefixes, the per-session arms, the break and
#: miss records, the cross-session static heads; the rest (names, the engine arm) is small.
REPORT_SHARES = {"prefixes": 0.5, "sessions": 0.2, "records": 0.1, "static": 0.15}


@dataclass(frozen=True, slots=True)
class LiveTurn:
    """What the live page needs of one request's pipeline decision (a kept turn record's ``prepared``): the
    ``client`` that sent it (the agent it declares, else its user agent's product; None when unknown), the
    ``model`` it named, the ``provider`` whose prices apply, the TTL decision (``ttl``; None off Anthropic), the
    keep-warm decision made after it (``keep_warm``: a ``KeepWarmDecision``; None when none was made), when it
    was held for a sibling writing its prefix, the hold (``coalesced``: a :class:`~agentcache.session.Hold`), and
    whether it carried tools (``loop``: an agent loop's turn; a title or summary call carries none)."""

    client: str | None
    model: str
    provider: str
    ttl: Any = None
    keep_warm: Any = None
    coalesced: Any = None
    loop: bool = True


class LiveReport:
    """Accumulates the live report; see the module docstring."""

    def __init__(
        self,
        metrics: ProxyMetrics | None = None,
        simulate: bool = True,
        max_sessions: int = 10_000,
        max_records: int = 2_000,
        max_names: int = 64,
        max_bytes: int = 64 * 1024 * 1024,
    ) -> None:
        self.metrics = metrics
        self.max_bytes = max_bytes
        self.ledger = Ledger(
            None,
            reported=True,
            simulate=simulate,
            max_sessions=max(1, min(max_sessions, int(max_bytes * REPORT_SHARES["sessions"]) // SESSION_REPORT_BYTES)),
            max_records=max(1, min(max_records, int(max_bytes * REPORT_SHARES["records"]) // RECORD_BYTES)),
            max_chain=max(1, int(max_bytes * REPORT_SHARES["prefixes"]) // SIM_PREFIX_BYTES),
            max_static_bytes=int(max_bytes * REPORT_SHARES["static"]),
        )
        self.max_names = max_names
        #: the most recent requests (see the module docstring), at most as many as breaks and misses
        self.turns: deque[TurnRecord] = deque(maxlen=self.ledger.max_records)
        #: the ``engine`` arm, set by the proxy in front of a llama.cpp engine
        self.engine: EngineArm | None = None
        #: requests per (tenant, provider) and per (tenant, model): the report's top-level ``provider``/``model``
        #: are those of the tenant it is for (a tenant never reads another's model name)
        self.providers: Counter[tuple[str, str]] = Counter()
        self.models: Counter[tuple[str, str]] = Counter()
        #: requests per (tenant, provider, model), for the report's ``models`` (a caller sees its own tenant's)
        self.model_uses: Counter[tuple[str, str, str]] = Counter()

    def record(
        self,
        session: str,
        tenant: str,
        turn: Turn,
        usage: CacheUsage | None,
        client: str | None = None,
        keep_warm: Any = None,
        hold: Any = None,
    ) -> MissRecord | None:
        """Add one committed request: its session key (``tenant/sid``), the turn, the reported usage, and when
        known the ``client`` that sent it, the keep-warm decision made after it and its coalescing ``hold``.
        Returns the miss of what agentcache sent (the ``agentcache`` arm's, in the scope-wide simulated cache: a
        subagent's first call that reads less than the scope holds), or None (no miss, or ``simulate`` off)."""
        target = turn.session.target
        assert target is not None
        prepared = turn.prepared
        provider, model = target.name, prepared.planned.model
        self._count(self.providers, (tenant, provider))
        self._count(self.models, (tenant, model))
        if target.kind != TargetKind.ENGINE:  # an engine has no price table
            self._count(self.model_uses, (tenant, str(target.kind), model or ""))
        sess = turn.session
        parent = f"{tenant}/{sess.parent}" if sess.parent else None
        lineage = f"{tenant}/{sess.lineage}" if sess.lineage else None
        done = self.ledger.record(
            session,
            turn.signal.turn,
            prepared,
            scope=tenant,
            usage=usage,
            target=target,
            parent=parent,
            lineage=lineage,
        )
        usages = {arm: r.usage for arm, r in done.results.items()}
        if done.reported is not None:
            usages["reported"] = done.reported
        loop = bool(turn.body.get("tools"))
        live = LiveTurn(client, model or "", target.name, prepared.ttl, keep_warm, hold, loop)
        self.turns.append(TurnRecord(session, turn.signal.turn, prepared.at, usages, prepared.repairs, (), live))
        if self.engine is not None and getattr(target, "engine", None) == Engine.LLAMA_CPP:
            self.engine.submit(session, turn.api, turn.body, usage)
        if self.metrics is not None:  # the reported arm's cost comes from the turn's event
            label = provider_label(turn.api, target.kind == TargetKind.ENGINE)
            self.metrics.sink.record(label, model, done)
        return next((m for m in done.misses if m.arm == "agentcache"), None)

    def _count(self, counts: Counter[Any], name: Any) -> None:
        counts[name] += 1
        if len(counts) > self.max_names:  # client-chosen strings: keep the most common only
            for rare, _ in counts.most_common()[self.max_names // 2 :]:
                del counts[rare]

    def estimated_bytes(self) -> int:
        """Estimated bytes the report holds (the constants above; names counted by their length)."""
        led = self.ledger
        names = sum(len(n) + len(t) + 150 for c in (self.providers, self.models) for t, n in c)
        names += sum(len(m) + 150 for _, _, m in self.model_uses)
        return (
            len(led.sessions) * SESSION_REPORT_BYTES
            + led.simulated_prefixes() * SIM_PREFIX_BYTES
            + (len(led.breaks) + len(led.misses) + len(led.errors)) * RECORD_BYTES
            + len(self.turns) * TURN_BYTES
            + led.static_bytes()
            + names
            + (self.engine.estimated_bytes() if self.engine is not None else 0)
        )

    def report(self, tenant: str | None = None) -> AuditReport:
        """The report (only ``tenant``'s sessions, breaks and misses when given; totals are then theirs)."""
        report = self.ledger.report(_single(self.providers, tenant), _single(self.models, tenant), tenant)
        prefix = None if tenant is None else tenant + "/"
        report.turns = [t for t in self.turns if prefix is None or t.session.startswith(prefix)]
        uses: Counter[tuple[str, str]] = Counter()
        for (who, provider, model), n in self.model_uses.items():
            if tenant is None or who == tenant:
                uses[provider, model] += n
        if self.engine is not None and self.engine.total.requests:
            self._add_engine_arm(report, tenant)
        report.models = [
            ModelRecord(provider, model, known, priced_as, n)
            for (provider, model), n in sorted(uses.items())
            for priced_as, known in [lookup_model(provider, model or None)]
        ]
        return report

    def _add_engine_arm(self, report: AuditReport, tenant: str | None) -> None:
        """The ``engine`` arm's metrics into ``report``'s sessions and totals (a tenant's: its sessions')."""
        assert self.engine is not None
        total = ArmMetrics()
        for session in report.sessions:
            metrics = self.engine.sessions.get(session.session)
            if metrics is not None:
                session.arms[ENGINE_ARM] = metrics
                total.merge(metrics)
        report.totals[ENGINE_ARM] = self.engine.total if tenant is None else total

    def to_dict(self, tenant: str | None = None) -> dict[str, Any]:
        """The JSON document (audit schema)."""
        return self.report(tenant).to_dict()


def _single(counts: Counter[tuple[str, str]], tenant: str | None) -> str:
    """The only name ``tenant`` (None: any tenant) was counted with, ``mixed`` for several, ``none`` for none."""
    names = {name for who, name in counts if tenant is None or who == tenant}
    if not names:
        return "none"
    return next(iter(names)) if len(names) == 1 else "mixed"
