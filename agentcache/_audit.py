"""``audit``: recorded traffic → what its prompt caching cost, what it could cost, and why each
prefix broke.

All sessions replay through one shared simulated cache per arm, in time order (``at``; recorded
order where absent), as design.md's "Cache scope" requires:

* ``as_sent``: the requests exactly as recorded;
* ``agentcache``: after safe repairs (:mod:`agentcache.analysis._repair`) and policies (breakpoints on
  Anthropic);
* ``ideal``: every token already sent earlier in the scope, after safe repairs, counts as reused.
"""

from __future__ import annotations

from collections.abc import Callable, Iterable
from dataclasses import dataclass, field
from typing import Any

from ._exceptions import ConfigError, InputError
from .adapters import canonicalize
from .analysis._diagnose import _classify, diagnose
from .analysis._report import ArmMetrics, AuditReport, BreakRecord, MissRecord, SessionReport, TurnRecord
from .loaders import Record
from .model import _causes as C
from .model._canonical import CanonicalRequest, common_prefix, static_end
from .model._rules import anthropic_rules, default_model, normalize_model, openai_rules
from .model._volatile import VolatileSpan
from .policies import STRATEGIES, apply_strategy
from .policies.volatility import suggestion
from .session._pipeline import Prepared, ScopeMemory, SessionPipeline
from .simulate import IdealSimulator, SimResult, simulator_for

#: Cross-session differences worth reporting: the sessions would share the prefix without them.
_CROSS_SESSION_CAUSES = frozenset({C.TOOLS_REORDERED, C.TOOLS_SERIALIZATION, C.SYSTEM_VOLATILE})


@dataclass(slots=True)
class _Session:
    report: SessionReport
    pipe: SessionPipeline
    prev_sent: CanonicalRequest | None = None
    count: int = 0


@dataclass(slots=True)
class _StaticIndex:
    """Static-prefix chain hashes → (session, request) that sent them, for cross-session breaks."""

    refs: dict[bytes, tuple[str, CanonicalRequest]] = field(default_factory=dict)

    def add(self, session: str, req: CanonicalRequest) -> None:
        for h in req.chain[: static_end(req)]:
            self.refs.setdefault(h, (session, req))

    def match(self, req: CanonicalRequest) -> tuple[str, CanonicalRequest] | None:
        best = None
        for h in req.chain[: static_end(req)]:
            ref = self.refs.get(h)
            if ref is None:
                break
            best = ref
        if best is None and req.chain:
            best = self.refs.get(req.chain[0])
        return best


def audit(
    records: Iterable[Record],
    provider: str | None = None,
    model: str | None = None,
    progress: Callable[[int], None] | None = None,
    compare: bool = False,
) -> AuditReport:
    """Audit ``records`` under ``provider``'s rules (inferred from the first record's api when None).

    ``model`` prices every request as that model (default: each request's own model when the provider
    table knows it, else the provider's default). ``progress(n)`` is called after every request.
    ``compare`` adds one arm per baseline marker strategy (``anthropic_auto``, ``langchain``,
    ``litellm``, ``no_markers``; Anthropic rules only).
    A record whose body cannot be read is skipped and listed in ``report.errors`` (InputError naming
    its file and record). Raises ConfigError for an unknown provider.
    """
    recs = _time_order(list(records))
    if provider is None:
        provider = "anthropic" if recs and recs[0].api.startswith("anthropic") else "openai"
    rules_for = anthropic_rules if provider == "anthropic" else openai_rules
    if model is not None and not rules_for(model).known:
        raise ConfigError(f"unknown {provider} model {model!r}: add it to agentcache/data/models.toml")
    # Each request is priced as its own model; one the table does not know gets the provider default's
    # numbers (its name still decides capabilities such as OpenAI breakpoints).
    price_model = model
    known = {normalize_model(str(r.body.get("model") or "")) for r in recs}
    report_model = model or (_common_model(recs, provider) if all(rules_for(m).known for m in known) else None)
    strategies: tuple[str, ...] = STRATEGIES if compare else ()
    if compare and provider != "anthropic":
        raise ConfigError("--compare compares Anthropic marker strategies: use --provider anthropic")
    arms = ("as_sent", "agentcache", "ideal", *strategies)
    sims = {a: simulator_for(provider, price_model) for a in ("as_sent", "agentcache", *strategies)}
    ideal = IdealSimulator(provider, price_model)
    sessions: dict[str, _Session] = {}
    static = _StaticIndex()
    scope = ScopeMemory()
    breaks: list[BreakRecord] = []
    errors: list[InputError] = []
    misses: list[MissRecord] = []
    results: list[tuple[_Session, int, Record, dict[str, SimResult], Prepared]] = []
    for n, rec in enumerate(recs):
        now = rec.at or 0.0
        sess = sessions.get(rec.session)
        pipe = (
            sess.pipe if sess is not None else SessionPipeline(provider, price_model, scope, False, session=rec.session)
        )
        try:
            pipe.cache.begin()
            orig = canonicalize(rec.api, rec.body, cache=pipe.cache)
        except (InputError, ConfigError) as exc:  # one bad record never stops the audit
            errors.append(InputError(str(exc), source=rec.source or None, record=rec.index))
            continue
        if sess is None:
            sess = sessions[rec.session] = _Session(SessionReport(rec.session, arms=_arms(arms)), pipe)
        prep = sess.pipe.prepare(rec.api, rec.body, orig, rec.at)
        res = {"as_sent": sims["as_sent"].run(orig, now), "agentcache": sims["agentcache"].run(prep.planned, now)}
        for name in strategies:
            res[name] = sims[name].run(apply_strategy(name, orig), now)
        ideal.run(prep.planned)  # markers are not content: the planned chain is the repaired one
        brk = _break_record(rec.session, sess, prep, static, res["agentcache"])
        if brk is not None:
            breaks.append(brk)
        sess.pipe.commit(prep)
        static.add(rec.session, orig)
        sess.prev_sent = prep.planned
        results.append((sess, sess.count, rec, res, prep))
        sess.count += 1
        if progress is not None:
            progress(n + 1)

    totals = _arms(arms)
    turns: list[TurnRecord] = []
    for (sess, idx, rec, res, prep), ideal_usage in zip(results, ideal.finish(), strict=True):
        usages = {a: (ideal_usage if a == "ideal" else res[a].usage) for a in arms}
        turns.append(TurnRecord(sess.report.session, idx, rec.at, usages, prep.repairs, prep.markers, prep))
        sess.report.requests += 1
        for arm in ("as_sent", "agentcache", *strategies):
            r = res[arm]
            sess.report.arms[arm].add(r.usage)
            totals[arm].add(r.usage)
            lost = r.matched_tokens - r.usage.cache_read_tokens
            if r.loss_cause and (lost > 0 or r.rejected):
                miss = MissRecord(sess.report.session, idx, arm, r.loss_cause, max(lost, 0), r.rejected, r.loss_where)
                misses.append(miss)
        sess.report.arms["ideal"].add(ideal_usage)
        totals["ideal"].add(ideal_usage)
    model_name = report_model or default_model(provider)
    return AuditReport(
        provider, model_name, totals, [s.report for s in sessions.values()], breaks, misses, turns, errors
    )


def _arms(names: Iterable[str]) -> dict[str, ArmMetrics]:
    return {a: ArmMetrics() for a in names}


def _time_order(recs: list[Record]) -> list[Record]:
    """Stable sort by ``at``; a record without ``at`` keeps the time of the record before it."""
    keyed = []
    last = 0.0
    for i, r in enumerate(recs):
        last = r.at if r.at is not None else last
        keyed.append((last, i, r))
    keyed.sort(key=lambda t: (t[0], t[1]))
    return [r for _, _, r in keyed]


def _break_record(
    session: str, sess: _Session, prep: Prepared, static: _StaticIndex, agentcache: SimResult
) -> BreakRecord | None:
    """The break ``prep``'s request makes against its session's previous request, or, for a first
    request, against another session's static prefix (only where sharing was possible)."""
    d = prep.divergence
    if d is not None:
        if d.cause is None:
            return None
        fixed = sess.prev_sent is not None and not diagnose(sess.prev_sent, prep.planned).is_break
        return BreakRecord(
            session,
            sess.count,
            d.first_divergent,
            d.cause,
            d.tokens_lost,
            fixed,
            None,
            _span(d.volatile, d.first_divergent),
        )
    orig = prep.original
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
    fixed = agentcache.matched_tokens >= prep.planned.tokens_before(static_end(prep.planned))
    return BreakRecord(session, sess.count, path, cause, lost, fixed, other, _span(span, path))


def _span(span: VolatileSpan | None, where: str | None) -> dict[str, Any] | None:
    if span is None:
        return None
    advice = suggestion(span, where or "the system prompt")
    return {"start": span.start, "end": span.end, "kinds": list(span.kinds), "text": span.text, "suggestion": advice}


def _common_model(recs: list[Record], provider: str) -> str:
    models = {str(r.body.get("model")) for r in recs}
    return models.pop() if len(models) == 1 else default_model(provider)
