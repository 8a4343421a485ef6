"""``audit`` of agents' own logs: what prompt caching cost on the usage the provider reported, why each miss
happened (inferred: the logs keep no request bodies), and what agentcache's time-only levers would have saved.

Each session's calls (:class:`~agentcache.loaders.UsageRecord`, in time order) go through
:func:`~agentcache.analysis._inferred.infer_losses` (the loss against the session's cached prefix and its cause)
and :func:`~agentcache.analysis._whatif.what_if` (the ``agentcache`` arm: the TTL policy and keep-warm on the
recorded pauses). Arms: ``reported`` (the usage as logged, priced per model on the cache that served it) and
``agentcache``. The report (:class:`~agentcache.analysis.AuditReport` with ``mode = "reported"``) adds the misses per
cause with what agentcache saves on them, and breakdowns per day (UTC), project, model, client and session.
"""

from __future__ import annotations

import datetime as dt
from collections import defaultdict
from collections.abc import Iterable, Sequence

from ._config import Settings
from .analysis._inferred import CallLoss, ExactCauses, infer_losses, read_instead
from .analysis._report import ArmMetrics, AuditReport, MissRecord, ModelRecord, SessionReport, TurnRecord
from .analysis._report_logs import BY, SPEND, CauseRow, GroupRow, SourceRow
from .analysis._whatif import WhatIf, priced, what_if
from .loaders import UsageRecord
from .model._rules import lookup_model
from .model._usage import CacheUsage, served_by
from .simulate import SimUsage

__all__ = ["LOG_ARMS", "audit_logs"]

#: The arms of an audit of agents' logs.
LOG_ARMS = ("reported", "agentcache")


def audit_logs(
    records: Iterable[UsageRecord],
    settings: Settings | None = None,
    sources: Sequence[SourceRow] = (),
    exact: ExactCauses | None = None,
) -> AuditReport:
    """Audit the API calls of agents' logs (see the module docstring). ``settings``: its ``ttl_policy`` is the
    what-if's. ``sources``: what was read, carried into the report. ``exact``: the causes an audit of the same
    calls' request bodies found (:func:`~agentcache.analysis._inferred.exact_causes`): they replace the inferred
    ones. Never raises for odd usage (a call whose model the price table does not know is priced as the provider's
    default model)."""
    policy = settings.ttl_policy if settings is not None else "auto"
    sessions = _by_session(records)
    static = _static_reads(sessions)
    report = AuditReport(
        provider=_one({served_by(c.usage) or "other" for calls in sessions.values() for c in calls}),
        model=_one({c.model for calls in sessions.values() for c in calls}),
        totals={arm: ArmMetrics() for arm in LOG_ARMS},
        sessions=[],
        breaks=[],
        misses=[],
        mode="reported",
        sources=list(sources),
        spend=dict.fromkeys(SPEND, 0.0),
    )
    causes: dict[str, CauseRow] = {}
    groups = _Groups()
    for name, calls in sessions.items():
        first = calls[0]
        losses = infer_losses(calls, static.get((first.client, first.model)), exact)
        arms = what_if(calls, losses, policy)
        sess = _session_report(name, calls, sessions)
        for i, (call, loss, alt) in enumerate(zip(calls, losses, arms, strict=True)):
            reported = priced(call.usage, call.model)
            turn = {"reported": reported, "agentcache": alt.usage}
            lost_usd = _miss(report, causes, name, i, call, loss, alt, reported)
            _spend(report.spend, call, loss)
            sess.usd_lost += lost_usd
            for metrics in (report.totals, sess.arms):
                _add(metrics, reported, alt)
            groups.add(call, name, reported, alt, lost_usd)
            report.turns.append(TurnRecord(name, i, call.at, turn))
        report.sessions.append(sess)
    report.causes = sorted(causes.values(), key=lambda c: -c.usd_lost)
    report.groups = groups.rows()
    report.models = _models(sessions)
    return report


def _models(sessions: dict[str, list[UsageRecord]]) -> list[ModelRecord]:
    """Each (provider, model) the calls used, with whether the price table knows it (else it is priced as the
    provider's default model: the report names it, as the audit of recorded requests does)."""
    counts: dict[tuple[str, str], int] = defaultdict(int)
    for calls in sessions.values():
        for c in calls:
            provider = served_by(c.usage)
            if provider in ("anthropic", "openai"):
                counts[provider, c.model] += 1
    out = []
    for (provider, model), n in sorted(counts.items()):
        priced_as, known = lookup_model(provider, model or None)
        out.append(ModelRecord(provider, model, known, priced_as, n))
    return out


def _by_session(records: Iterable[UsageRecord]) -> dict[str, list[UsageRecord]]:
    """Calls per session, each session's in time order (sessions in the order they started)."""
    out: dict[str, list[UsageRecord]] = defaultdict(list)
    for rec in sorted(records, key=lambda r: r.at if r.at is not None else 0.0):
        out[rec.session].append(rec)
    return dict(out)


def _static_reads(sessions: dict[str, list[UsageRecord]]) -> dict[tuple[str, str], int]:
    """Per (client, model): the most a main session's first call read (its tools and system prompt, written by
    earlier sessions): reads that stop there stopped at the static prefix."""
    out: dict[tuple[str, str], int] = {}
    for calls in sessions.values():
        first = calls[0]
        if first.kind == "main" and first.usage.cache_read_tokens > 0:
            key = (first.client, first.model)
            out[key] = max(out.get(key, 0), first.usage.cache_read_tokens)
    return out


def _one(values: set[str]) -> str:
    return values.pop() if len(values) == 1 else "mixed"


def _lineage(name: str, sessions: dict[str, list[UsageRecord]]) -> str:
    seen = {name}
    while (parent := sessions[name][0].parent if name in sessions else None) is not None and parent not in seen:
        seen.add(parent)
        name = parent
    return name


def _session_report(name: str, calls: list[UsageRecord], sessions: dict[str, list[UsageRecord]]) -> SessionReport:
    first = calls[0]
    return SessionReport(
        session=name,
        requests=len(calls),
        arms={arm: ArmMetrics() for arm in LOG_ARMS},
        parent=first.parent,
        lineage=_lineage(name, sessions),
        client=first.client,
        project=first.project,
        model=_one({c.model for c in calls}),
        started=first.at,
    )


def _add(arms: dict[str, ArmMetrics], reported: SimUsage, alt: WhatIf) -> None:
    """One call into the ``reported`` and ``agentcache`` totals (keep-warm refreshes count as requests of the
    ``agentcache`` arm: they are real requests that read the prefix)."""
    arms["reported"].add(reported)
    arms["agentcache"].add(alt.usage)
    if alt.refresh is not None:
        m = arms["agentcache"]
        m.add(alt.refresh)
        m.requests += alt.refreshes - 1


def _miss(
    report: AuditReport,
    causes: dict[str, CauseRow],
    session: str,
    index: int,
    call: UsageRecord,
    loss: CallLoss,
    alt: WhatIf,
    reported: SimUsage,
) -> float:
    """Record the call's miss (reported arm; and the agentcache arm's when it still misses): the USD it lost."""
    if loss.cause is None:
        return 0.0
    lost_usd = reported.cost_usd - priced(read_instead(call.usage, loss.lost), call.model).cost_usd
    common, cause = (session, index), str(loss.cause)
    report.misses.append(
        MissRecord(*common, "reported", cause, loss.lost, False, loss.where, loss.inferred, lost_usd, loss.detail)
    )
    row = causes.setdefault(cause, CauseRow(cause))
    row.misses += 1
    row.tokens_lost += loss.lost
    row.usd_lost += lost_usd
    row.diagnosed += 0 if loss.inferred else 1
    saved = reported.cost_usd - alt.usage.cost_usd - (alt.refresh.cost_usd if alt.refresh is not None else 0.0)
    if alt.saved_by is not None:
        row.saved_usd += saved
        row.saved_by[alt.saved_by] = row.saved_by.get(alt.saved_by, 0.0) + saved
    else:
        miss = MissRecord(*common, "agentcache", cause, loss.lost, False, loss.where, loss.inferred, lost_usd)
        report.misses.append(miss)
    return lost_usd


def _spend(spend: dict[str, float], call: UsageRecord, loss: CallLoss) -> None:
    """Split the call's reported USD into reads, writes (a session's or subagent's first call, new turns,
    rewrites of what a miss lost) and uncached input."""
    u = call.usage
    part = _Parts(u, call.model)
    spend["reads"] += part.of(read=u.cache_read_tokens)
    spend["uncached"] += part.of(uncached=u.uncached_tokens)
    writes = part.of(w5=u.cache_write_tokens - u.cache_write_1h_tokens, w1=u.cache_write_1h_tokens)
    if loss.start is not None:
        spend[f"writes.{loss.start}_start"] += writes
        return
    rewritten = min(loss.lost, u.cache_write_tokens) if loss.cause is not None else 0
    share = rewritten / u.cache_write_tokens if u.cache_write_tokens else 0.0
    spend["writes.rewrites"] += writes * share
    spend["writes.new_turns"] += writes * (1 - share)


class _Parts:
    """Prices parts of one call's usage (the same cache and model)."""

    def __init__(self, usage: CacheUsage, model: str) -> None:
        self.usage, self.model = usage, model

    def of(self, read: int = 0, w5: int = 0, w1: int = 0, uncached: int = 0) -> float:
        part = CacheUsage(read + w5 + w1 + uncached, read, w5 + w1, uncached, self.usage.source, w1)
        return priced(part, self.model).cost_usd


class _Groups:
    """The breakdown tables, filled call by call."""

    def __init__(self) -> None:
        self._rows: dict[tuple[str, str], GroupRow] = {}
        self._sessions: dict[tuple[str, str], set[str]] = defaultdict(set)

    def add(self, call: UsageRecord, session: str, reported: SimUsage, alt: WhatIf, lost_usd: float) -> None:
        day = dt.datetime.fromtimestamp(call.at, dt.UTC).date().isoformat() if call.at is not None else "unknown"
        keys = {"day": day, "project": call.project or "unknown", "model": call.model, "client": call.client}
        for by, key in keys.items():
            row = self._rows.setdefault((by, key), GroupRow(by, key, arms={arm: ArmMetrics() for arm in LOG_ARMS}))
            _add(row.arms, reported, alt)
            row.usd_lost += lost_usd
            self._sessions[by, key].add(session)

    def rows(self) -> dict[str, list[GroupRow]]:
        out: dict[str, list[GroupRow]] = {by: [] for by in BY if by != "session"}
        for (by, key), row in self._rows.items():
            row.sessions = len(self._sessions[by, key])
            out[by].append(row)
        out["day"].sort(key=lambda r: r.key)
        for by in ("project", "model", "client"):
            out[by].sort(key=lambda r: -r.arms["reported"].cost_usd)
        return out
