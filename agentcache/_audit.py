"""``audit``: recorded traffic → what its prompt caching cost, what it could cost, and why each
prefix broke.

All sessions replay through one shared simulated cache per arm, in time order (``at``; recorded
order where absent), as design.md's "Cache scope" requires:

* ``as_sent``: the requests exactly as recorded;
* ``agentcache``: after safe repairs (:mod:`agentcache._repair`) and policies (breakpoints on
  Anthropic);
* ``ideal``: every token already sent earlier in the scope, after safe repairs, counts as reused.
"""

from __future__ import annotations

from collections.abc import Callable, Iterable
from dataclasses import dataclass, field

from . import _causes as C
from ._canonical import CanonicalRequest, with_markers
from ._diagnose import _classify, common_prefix, diagnose, static_end
from ._pricing import anthropic_rules, default_model, normalize_model, openai_rules
from ._repair import SessionMemory, plan_repairs
from ._report import ARMS, ArmMetrics, AuditReport, BreakRecord, MissRecord, SessionReport
from .adapters import apply, canonicalize
from .loaders import Record
from .policies import plan_breakpoints
from .simulate import IdealSimulator, SimResult, simulator_for

#: Cross-session differences worth reporting: the sessions would share the prefix without them.
_CROSS_SESSION_CAUSES = frozenset({C.TOOLS_REORDERED, C.TOOLS_SERIALIZATION, C.SYSTEM_VOLATILE})


@dataclass(slots=True)
class _Session:
    report: SessionReport
    prev: CanonicalRequest | None = None
    prev_sent: CanonicalRequest | None = None
    memory: SessionMemory = field(default_factory=SessionMemory)
    count: int = 0


@dataclass(slots=True)
class _StaticIndex:
    """Static-prefix chain hashes → (session, request) that sent them, for cross-session breaks;
    plus, per tool-name set, the first session's tool memory so new sessions adopt its order."""

    refs: dict[bytes, tuple[str, CanonicalRequest]] = field(default_factory=dict)
    tools: dict[frozenset[str], SessionMemory] = field(default_factory=dict)

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
) -> AuditReport:
    """Audit ``records`` under ``provider``'s rules (inferred from the first record's api when None).

    ``model`` prices every request as that model (default: each request's own model when the provider
    table knows it, else the provider's default). ``progress(n)`` is called after every request.
    Raises ConfigError for an unknown provider and InputError for a malformed body.
    """
    recs = _time_order(list(records))
    if provider is None:
        provider = "anthropic" if recs and recs[0].api.startswith("anthropic") else "openai"
    rules_for = anthropic_rules if provider == "anthropic" else openai_rules
    price_model = model
    if price_model is None:
        known = {normalize_model(r.body.get("model") or "") for r in recs}
        price_model = None if all(rules_for(m).known for m in known) else default_model(provider)
    sims = {"as_sent": simulator_for(provider, price_model), "agentcache": simulator_for(provider, price_model)}
    ideal = IdealSimulator(provider, price_model)
    sessions: dict[str, _Session] = {}
    static = _StaticIndex()
    breaks: list[BreakRecord] = []
    misses: list[MissRecord] = []
    results: list[tuple[_Session, int, dict[str, SimResult]]] = []
    for n, rec in enumerate(recs):
        sess = sessions.get(rec.session)
        if sess is None:
            sess = sessions[rec.session] = _Session(SessionReport(rec.session))
        now = rec.at or 0.0
        orig = canonicalize(rec.api, rec.body)
        res = {"as_sent": sims["as_sent"].run(orig, now)}
        brk = _find_break(rec.session, sess, orig, static)

        fresh = sess.memory.sent is None
        if fresh:
            _seed_tools(sess.memory, orig, static)
        repair = plan_repairs(sess.memory, orig, rec.body)
        body1 = apply(rec.api, rec.body, repair.plan) if not repair.plan.empty else rec.body
        rep = canonicalize(rec.api, body1) if body1 is not rec.body else orig
        planned = rep
        if provider == "anthropic":
            bp = plan_breakpoints(rep, sess.memory.sent, anthropic_rules(price_model or rep.model))
            planned = with_markers(rep, bp.markers, bp.top)
        res["agentcache"] = sims["agentcache"].run(planned, now)
        ideal.run(rep)
        if brk is not None:
            if brk.against is None and sess.prev_sent is not None:
                fixed = not diagnose(sess.prev_sent, planned).is_break
            else:
                fixed = res["agentcache"].matched_tokens >= planned.tokens_before(static_end(planned))
            breaks.append(_with_repaired(brk, fixed))
        if fresh:
            static.tools.setdefault(_tool_names(planned), sess.memory)
        sess.memory.remember(planned, body1)
        static.add(rec.session, orig)
        sess.prev, sess.prev_sent = orig, planned
        results.append((sess, sess.count, res))
        sess.count += 1
        if progress is not None:
            progress(n + 1)

    totals = {a: ArmMetrics() for a in ARMS}
    for (sess, idx, res), ideal_usage in zip(results, ideal.finish(), strict=True):
        sess.report.requests += 1
        for arm in ("as_sent", "agentcache"):
            r = res[arm]
            sess.report.arms[arm].add(r.usage)
            totals[arm].add(r.usage)
            lost = r.matched_tokens - r.usage.cache_read_tokens
            if r.loss_cause and (lost > 0 or r.rejected):
                misses.append(MissRecord(sess.report.session, idx, arm, r.loss_cause, max(lost, 0), r.rejected, r.loss_where))
        sess.report.arms["ideal"].add(ideal_usage)
        totals["ideal"].add(ideal_usage)
    model_name = price_model or _common_model(recs, provider)
    return AuditReport(provider, model_name, totals, [s.report for s in sessions.values()], breaks, misses)


def _time_order(recs: list[Record]) -> list[Record]:
    """Stable sort by ``at``; a record without ``at`` keeps the time of the record before it."""
    keyed = []
    last = 0.0
    for i, r in enumerate(recs):
        last = r.at if r.at is not None else last
        keyed.append((last, i, r))
    keyed.sort(key=lambda t: (t[0], t[1]))
    return [r for _, _, r in keyed]


def _find_break(session: str, sess: _Session, orig: CanonicalRequest, static: _StaticIndex) -> BreakRecord | None:
    if sess.prev is not None:
        d = diagnose(sess.prev, orig)
        if not d.is_break or d.cause is None:
            return None
        vol = {"start": d.volatile.start, "end": d.volatile.end, "kinds": list(d.volatile.kinds)} if d.volatile else None
        return BreakRecord(session, sess.count, d.first_divergent, d.cause, d.tokens_lost, False, None, vol)
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
    vol = {"start": span.start, "end": span.end, "kinds": list(span.kinds)} if span else None
    return BreakRecord(session, sess.count, path, cause, lost, False, other, vol)


def _with_repaired(b: BreakRecord, fixed: bool) -> BreakRecord:
    return BreakRecord(b.session, b.request, b.first_divergent, b.cause, b.tokens_lost, fixed, b.against, b.volatile)


def _tool_names(req: CanonicalRequest) -> frozenset[str]:
    return frozenset(b.name or "" for b in req.blocks if b.section == "tool")


def _seed_tools(memory: SessionMemory, req: CanonicalRequest, static: _StaticIndex) -> None:
    """A new session adopts the tool order and bytes of the first session with the same tool set."""
    first = static.tools.get(_tool_names(req))
    if first is not None and _tool_names(req):
        memory.tool_order = list(first.tool_order)
        memory.tool_units = dict(first.tool_units)


def _common_model(recs: list[Record], provider: str) -> str:
    models = {str(r.body.get("model")) for r in recs}
    return models.pop() if len(models) == 1 else default_model(provider)
