"""One request in flight: :class:`Turn` commits it or records a retry, and builds its turn report.

:meth:`agentcache.session._session.Session.begin` prepares a request and returns a :class:`Turn`. Exactly one
of :meth:`Turn.succeed` (the upstream answered: commit the prepared request into the session's
pipeline, record usage, emit ``turn``) or :meth:`Turn.fail` (the upstream call raised: ``attempt`` + 1,
emit ``retry``, nothing committed) completes it. Both are no-ops for a *stale* turn: its session was
closed, restarted (another generation), or a newer turn of it was committed since; a late response
never changes state. Neither raises.

``SessionPipeline.prepare`` also updates a few learned hints (edit points, ephemeral tail, rewrite
point); :func:`learning`/:func:`restore` save and put them back when a request is not committed, so a
retried request is planned exactly as its first try was.
"""

from __future__ import annotations

import time
from dataclasses import dataclass, field
from typing import TYPE_CHECKING, Any

from ..model._canonical import CanonicalRequest, common_prefix
from ..model._fields import LifecycleEvent, PrefixIdentity, ReuseBoundary, SessionSignal, StorageTier, TurnReport
from ..model._usage import CacheUsage, UsageTotals, cost_usd
from ._lifecycle import log
from ._pipeline import Prepared, SessionPipeline

if TYPE_CHECKING:
    from ._session import Session

__all__ = ["Lineage", "Saved", "Turn", "learning", "restore"]


@dataclass(slots=True)
class Lineage:
    """What a manager keeps per lineage (a root session and its subagents): usage ``totals`` and the
    OpenAI ``routing_key`` (``prompt_cache_key``) its first committed request got, which every later
    session of the lineage reuses, so all land where the lineage's prefixes are cached."""

    totals: UsageTotals = field(default_factory=UsageTotals)
    routing_key: str | None = None


#: The learned pipeline hints ``prepare`` updates: (edit points, ephemeral tail, rewrite point).
Saved = tuple[list[int], int, int | None]


def learning(pipe: SessionPipeline) -> Saved:
    """The pipeline hints that ``prepare`` updates (restored when the request is not committed)."""
    return list(pipe.edit_points), pipe.ephemeral_tail, pipe.rewrite_at


def restore(pipe: SessionPipeline, saved: Saved) -> None:
    pipe.edit_points, pipe.ephemeral_tail, pipe.rewrite_at = list(saved[0]), saved[1], saved[2]


class Turn:
    """One request in flight. ``body``: the wire body to send. Complete it exactly once with
    :meth:`succeed` or :meth:`fail`; both are no-ops for a stale turn and never raise."""

    __slots__ = ("_saved", "api", "body", "done", "generation", "prepared", "sent_before", "seq", "session", "started")

    def __init__(
        self,
        session: Session,
        seq: int,
        api: str,
        prepared: Prepared,
        body: dict[str, Any],
        sent_before: CanonicalRequest | None,
        saved: Saved,
    ) -> None:
        self.session, self.seq, self.api, self.prepared, self.body = session, seq, api, prepared, body
        self.generation = session.generation
        self.sent_before, self._saved = sent_before, saved
        self.started = time.monotonic()
        self.done = False

    def succeed(self, usage: CacheUsage | None = None) -> TurnReport | None:
        """Commit the request and record ``usage``; returns the report (None when stale, or when
        agentcache itself failed: logged, fail open)."""
        sess, m = self.session, self.session.manager
        if self.done:
            return None
        self.done = True
        with m._lock:
            if not sess._current(self):
                log.debug("session.stale", session_id=sess.session_id, generation=self.generation, outcome="success")
                return None
            try:
                report = self._report(usage)
                sess.pipeline.commit(self.prepared)
            except Exception as exc:  # an agentcache bug must not break the caller's successful request
                log.warning("session.commit_failed", session_id=sess.session_id, error=type(exc).__name__)
                return None
            sess._committed_seq = self.seq
            sess.turns += 1
            sess.attempt = 0
            sess.last_report = report
            lineage = m._lineage(sess.lineage)
            lineage.routing_key = lineage.routing_key or sess.pipeline.routing_key
            if usage is not None:
                sess.totals.add(usage, report.cost_usd)
                lineage.totals.add(usage, report.cost_usd)
            now = m.clock()
            if m._open.get(sess.session_id) is sess:
                m._touch(sess, now)
            event = LifecycleEvent(
                "turn",
                report.session_signal,
                now,
                None,
                report.prefix_identity,
                report.reuse_boundary,
                report.storage_tier,
                report,
            )
        m._emit([event])
        return report

    def fail(self, exc: BaseException) -> None:
        """Record a retry (``attempt`` + 1, same generation); nothing is committed."""
        sess, m = self.session, self.session.manager
        if self.done:
            return
        self.done = True
        with m._lock:
            if not sess._current(self):
                log.debug("session.stale", session_id=sess.session_id, generation=self.generation, outcome="failure")
                return
            if sess._pipeline is not None:
                restore(sess._pipeline, self._saved)
            sess.attempt += 1
            r = self._report(None)
            event = LifecycleEvent(
                "retry", sess.signal, m.clock(), type(exc).__name__, r.prefix_identity, r.reuse_boundary, r.storage_tier
            )
        m._emit([event])

    def _report(self, usage: CacheUsage | None) -> TurnReport:
        sess, prep = self.session, self.prepared
        planned = prep.planned
        matched = common_prefix(self.sent_before, planned) if self.sent_before is not None else 0
        div = prep.divergence
        boundary = ReuseBoundary(
            matched,
            planned.tokens_before(matched),
            usage.cache_read_tokens if usage is not None else None,
            div.cause if div else None,
            div.first_divergent if div else None,
            div.tokens_lost if div else 0,
        )
        tiers = dict(usage.tiers) if usage is not None else {}
        if sess.provider == "anthropic":
            tier = StorageTier("provider", prep.ttl.ttl if prep.ttl is not None and prep.markers else None, tiers)
        elif sess.provider == "openai":
            tier = StorageTier("provider", planned.retention or "in_memory", tiers)
        else:
            tier = StorageTier("engine", None, tiers)
        model = sess.model or planned.model
        return TurnReport(
            self.api,
            planned.model,
            PrefixIdentity.of(planned),
            boundary,
            SessionSignal(sess.session_id, sess.generation, sess.attempt, sess.parent, sess.lineage, sess.turns),
            tier,
            usage,
            cost_usd(usage, sess.provider, model) if usage is not None else None,
            prep.repairs,
            prep.markers,
            time.monotonic() - self.started,
        )
