"""The per-session request pipeline every door shares: canonicalize → diagnose → repair → plan → apply, once.

:class:`SessionPipeline` holds one session's memory (:class:`PipelineState`, immutable). :meth:`~SessionPipeline.
prepare` is pure: it turns the client's wire body into the body agentcache sends and reports what it found, and
returns the state the session will have once that body was sent (:attr:`Prepared.state`);
:meth:`~SessionPipeline.commit` installs it and is the only mutator, so a request that is never sent (or fails)
teaches nothing, and a retried request is planned exactly as its first try was.

One pass per request: the client body is canonicalized once; the repairs and the target's decisions are one
:class:`~agentcache.model.WirePlan`, applied once; the request that is sent is assembled from blocks
(:func:`~agentcache.analysis.repaired_request`), and the sent body is read again only when writing a marker
turned a string into a text block. :meth:`~SessionPipeline.snapshot` / :meth:`~SessionPipeline.from_snapshot`
carry the state between processes (the Redis store).
"""

from __future__ import annotations

from collections.abc import Mapping
from dataclasses import dataclass, field, replace
from typing import Any

from .._config import Settings, get_settings
from ..adapters import apply, canonicalize, reshaped, wire_for
from ..analysis._diagnose import Diagnosis, Divergence, diagnose
from ..analysis._repair import RepairPlan, Sent, ToolMemory, plan_repairs, repaired_request
from ..model._build import BlockCache, rebuild
from ..model._canonical import CanonicalRequest, static_end, unmarked, with_markers
from ..model._causes import MESSAGES_EDITED, REPAIRABLE_BREAKS, Cause
from ..model._plan import WirePlan
from ..model._rawjson import RawBody
from ..model._types import Api
from ..policies import KeepWarmDecision, TTLDecision
from ..policies.volatility import VolatileMemory, move_volatile
from ..targets import PlanInput, Target, TargetPlan, target_named
from ._scope import SCOPE_BYTES, ScopeMemory, tool_names
from ._snapshot import restore, snapshot
from ._state import Learned, PipelineState

__all__ = [
    "SCOPE_BYTES",
    "Learned",
    "PipelineState",
    "Prepared",
    "ScopeMemory",
    "SessionPipeline",
    "sibling_depth",
    "with_headers",
]


@dataclass(frozen=True, slots=True, kw_only=True)
class Prepared:
    """What :meth:`SessionPipeline.prepare` decided for one request.

    ``body``: the wire body to send (the client's own object when nothing changed). ``client``: the client's
    request, canonical. ``planned``: what is sent, canonical, markers included. ``before``: what the session
    sent before (None for its first request). ``divergence``: ``client`` against the client's previous request
    (None for the first), diagnosed by ``diverged`` when first read (the reports, after the upstream call).
    ``repairs``: the causes repaired. ``markers``: block paths given a marker, with the reason for each in
    ``marker_reasons``. ``ttl``: the TTL decision (Anthropic), else None. ``at``: the request's time (seconds; None
    when unknown). ``plan``: the target's decisions. ``state``: the session's state once this request was sent
    (installed by :meth:`SessionPipeline.commit`). ``headers``: the ``(name, value)`` headers the door adds when it
    sends ``body`` (:func:`with_headers`). ``diagnosed``: the request asks the provider to compare it with the
    session's last response (setting ``provider_diagnostics``)."""

    body: dict[str, Any]
    client: CanonicalRequest
    planned: CanonicalRequest
    before: CanonicalRequest | None
    diverged: Diagnosis | None
    repairs: tuple[Cause, ...]
    markers: tuple[str, ...]
    marker_reasons: tuple[str, ...]
    ttl: TTLDecision | None
    at: float | None
    plan: TargetPlan
    state: PipelineState
    headers: tuple[tuple[str, str], ...] = ()
    diagnosed: bool = False

    @property
    def divergence(self) -> Divergence | None:
        """See the class docstring: diagnosed when first read."""
        return self.diverged.value() if self.diverged is not None else None


def sibling_depth(req: CanonicalRequest, sibling: tuple[bytes, ...]) -> int | None:
    """Blocks ``req`` (as the client sent it) shares with a sibling subagent's first request (its client prefix
    ``chain``: the bytes the client sent, before agentcache's markers reshape any string), when they diverge
    inside the messages (past tools and system, before ``req``'s end): the siblings' shared prefix, which no
    marker of the client's may end (claude-code#82739: a 33-token difference between subagent prompts rewrote
    5,308 cached tokens because the last breakpoint sat ~5.3K tokens before it). None otherwise."""
    n = min(len(sibling), len(req.chain))
    shared = next((i for i in range(n) if sibling[i] != req.chain[i]), n)
    return shared if static_end(req) < shared < len(req.blocks) else None


def learn(old: Learned, prev: CanonicalRequest, new: CanonicalRequest, div: Divergence) -> Learned:
    """The client habits after the repaired request ``new``, given how it relates to the last sent ``prev``."""
    if div.ephemeral:  # the client dropped trailing blocks of its last message and went on: they are ephemeral
        return Learned(old.edit_points, div.ephemeral, old.rewrite_at)
    if div.cause is None or div.cause in REPAIRABLE_BREAKS:
        return old  # same meaning: nothing to learn about the client
    edits, tail, rewrite = list(old.edit_points), 0, old.rewrite_at
    before = prev.blocks[div.shared_blocks]
    if div.cause == MESSAGES_EDITED and before.message is not None:
        edits.append(before.message)
        growth = max(1, new.messages - prev.messages)
        stride = edits[-1] - edits[-2] if len(edits) > 1 else growth
        rewrite = before.message + stride if stride > 0 else None
    return Learned(tuple(edits[-32:]), tail, rewrite)


@dataclass(slots=True)
class _Pass:
    """One :meth:`SessionPipeline.prepare` pass, filled in step by step: the inputs (``st``: the session's state,
    ``last``: what it sent last, ``given``: the client's request canonicalized already), then each step's
    results (set by the step that computes them)."""

    api: Api
    body: dict[str, Any]
    now: float | None
    st: PipelineState
    last: Sent | None
    routing_key: str | None
    sibling: tuple[bytes, ...] | None
    spawns: tuple[float, ...]
    given: CanonicalRequest | None
    client: CanonicalRequest = field(init=False)
    div: Diagnosis | None = field(init=False)
    work: CanonicalRequest = field(init=False)
    work_body: dict[str, Any] = field(init=False)
    volatile: VolatileMemory = field(init=False)
    tools: ToolMemory = field(init=False)
    repair: RepairPlan = field(init=False)
    rep: CanonicalRequest = field(init=False)
    learned: Learned = field(init=False)
    key: str | None = field(init=False)
    tplan: TargetPlan = field(init=False)
    plan: WirePlan = field(init=False)
    wire: dict[str, Any] = field(init=False)
    planned: CanonicalRequest = field(init=False)

    @property
    def before(self) -> CanonicalRequest | None:
        """What the session sent last, canonical (None for its first request)."""
        return self.last.request if self.last is not None else None


class SessionPipeline:
    """One session's pipeline (see the module docstring).

    ``target``: a :class:`~agentcache.targets.Target` or its name (``anthropic``, ``openai``, ``engine``...).
    ``scope``: the cache scope's shared memory. ``settings``: default the process settings. ``session`` /
    ``lineage``: the session id and its root (subagents share the root's routing key). ``model``: rules as this
    model (with a target name only).
    """

    def __init__(
        self,
        target: Target | str,
        *,
        scope: ScopeMemory | None = None,
        settings: Settings | None = None,
        session: str = "",
        lineage: str | None = None,
        model: str | None = None,
    ) -> None:
        self.target = target_named(target, model=model)
        self.scope = scope if scope is not None else ScopeMemory()
        self.settings = settings or get_settings()
        self.session = session
        self.lineage = lineage or session
        self.state = PipelineState()
        self.cache = BlockCache()

    @property
    def sent(self) -> CanonicalRequest | None:
        """What the session sent last, canonical (None before its first request)."""
        return self.state.sent.request if self.state.sent is not None else None

    @property
    def sent_body(self) -> Mapping[str, Any] | None:
        """The wire body the session sent last."""
        return self.state.sent.body if self.state.sent is not None else None

    def prepare(
        self,
        api: Api | str,
        body: dict[str, Any],
        *,
        now: float | None = None,
        raw: RawBody | None = None,
        client: CanonicalRequest | None = None,
        routing_key: str | None = None,
        sibling: tuple[bytes, ...] | None = None,
        spawns: tuple[float, ...] = (),
    ) -> Prepared:
        """Plan the request sent at ``now`` (seconds; None when unknown). ``raw``: the source texts of ``body``
        when it was parsed by :func:`agentcache.model.loads` (its unchanged units are then keyed by their text).
        ``client``: ``body`` canonicalized already (the session lookup canonicalizes before it; None: here).
        ``routing_key``: the key the session's lineage already carries. ``sibling``: for a subagent's first
        request, the prefix chain of its latest sibling's first request (where the two diverge inside the
        messages, the planner may mark the end of their shared part: :func:`sibling_depth`); ``spawns``: the times
        of the lineage's earlier subagents' first requests (the TTL policy's gaps for a subagent's first request).
        Pure; raises InputError for a malformed body (the caller then sends the original request unchanged)."""
        self.cache.begin(raw)
        p = _Pass(Api(api), body, now, self.state, self.state.sent, routing_key, sibling, spawns, client)
        for step in (self._canonicalize, self._move_volatile, self._repair, self._plan, self._apply):
            step(p)
        return Prepared(
            body=p.wire, client=p.client, planned=p.planned, before=p.before, diverged=p.div,
            repairs=p.repair.repaired, markers=p.tplan.paths, marker_reasons=p.tplan.reasons, ttl=p.tplan.ttl,
            at=now, plan=p.tplan, state=self._next_state(p), headers=p.plan.headers,
            diagnosed=isinstance(p.plan.diagnostics, str),
        )  # fmt: skip

    # The steps of :meth:`prepare`, in order: each reads and fills one :class:`_Pass`.

    def _canonicalize(self, p: _Pass) -> None:
        """The client's request, canonical, and how it diverges from the client's previous one."""
        if p.given is not None:
            p.client = p.work = p.given
            if not self.cache.last or self.cache.last[0] is not p.given:  # built with another cache: a reference
                self.cache.remember(p.given)
        else:
            p.client = p.work = canonicalize(p.api, p.body, cache=self.cache)
        last = p.last
        p.div = Diagnosis(last.client, p.client) if last is not None and last.client is not None else None

    def _move_volatile(self, p: _Pass) -> None:
        """Setting ``move_volatile`` (Anthropic): system lines seen changing move out of the cached prefix."""
        p.work_body, p.volatile = p.body, p.st.volatile
        if self.settings.move_volatile and wire_for(p.api).moves_volatile:
            moved, p.volatile = move_volatile(p.body, p.st.volatile)
            if moved is not p.body:  # opt-in, and it changes the prompt: read the moved body too
                p.work_body, p.work = moved, canonicalize(p.api, moved, cache=self.cache)

    def _repair(self, p: _Pass) -> None:
        """The repairs (a new session adopts its scope's tool memory), the repaired request, what was learned."""
        last, st = p.last, p.st
        p.tools = st.tools if last is not None else self.scope.tools.get(tool_names(p.work)) or st.tools
        p.repair = plan_repairs(p.work, p.work_body, last, p.tools)
        p.rep = repaired_request(p.work, p.repair, (last.request,) if last is not None else ())
        p.learned = st.learned
        if last is not None and p.div is not None and p.div.breaks():
            p.learned = learn(st.learned, last.request, p.rep, diagnose(last.request, p.rep))

    def _plan(self, p: _Pass) -> None:
        """The target's decisions, merged with the repairs' into one wire plan."""
        st, first = p.st, p.last is None
        p.key = st.routing_key or p.routing_key
        inp = PlanInput(
            api=p.api, request=p.rep, sent=p.before, settings=self.settings, now=p.now, times=st.times,
            timed=st.timed, ephemeral_tail=p.learned.ephemeral_tail, rewrite_at=p.learned.rewrite_at,
            routing_key=p.key, lineage=self.lineage, keys=self.scope.keys,
            repaired=bool(p.repair.plan.replace) or p.repair.plan.tool_order is not None,
            previous_response=st.response_id,
            sibling_at=sibling_depth(p.client, p.sibling) if p.sibling is not None and first else None,
            spawns=p.spawns if first else (),
        )  # fmt: skip
        p.tplan = self.target.plan(inp)
        plan = p.repair.plan.merged(p.tplan.wire).merged(self.target.diagnostics(inp))
        if plan.markers is not None:
            marked = {m for i in p.rep.marked if (m := p.rep.blocks[i].message) is not None}
            # Messages re-sent in an earlier form too: the marker writer visits them (they may carry old markers).
            plan = replace(plan, marked=frozenset(marked) | frozenset(p.repair.messages))
        p.plan = plan

    def _apply(self, p: _Pass) -> None:
        """The wire body to send (the plan applied once) and what is sent, canonical."""
        p.wire = apply(p.api, p.work_body, p.plan) if not p.plan.empty else p.work_body
        p.planned = self._planned(p.api, p.rep, p.tplan)

    def _next_state(self, p: _Pass) -> PipelineState:
        """The session's state once the prepared request was sent."""
        st, last, planned = p.st, p.last, p.planned
        forms = _forms(p.repair, p.rep, planned, p.tplan)
        return PipelineState(
            sent=Sent(planned, p.wire, p.client, forms, _cache_key(last, planned)),
            client_body=None if p.wire is p.body else p.body,
            tools=p.tools.after(planned, p.before),
            routing_key=p.key or p.tplan.routing_key,
            times=(*st.times[-31:], p.now) if p.now is not None else st.times,
            timed=st.timed and p.now is not None,
            learned=p.learned,
            volatile=p.volatile,
        )

    def _planned(self, api: Api, rep: CanonicalRequest, tplan: TargetPlan) -> CanonicalRequest:
        """What is sent, canonical: ``rep`` with the target's routing key and markers. A marker on a string turned
        it into a text block on the wire: its block is rebuilt as such (the same as reading the sent body again,
        without reading it)."""
        if tplan.routing_key is not None:
            rep = rep.evolve(cache_key=tplan.routing_key)
        if tplan.markers is None:
            return rep
        planned = with_markers(rep, tplan.markers, tplan.top)
        if not tplan.reshapes:
            return planned
        blocks = list(planned.blocks)
        for i, marker in tplan.markers.items():
            if blocks[i].data[:1] == b'"':
                blocks[i] = reshaped(api, blocks[i], marker)
        return rebuild(planned, blocks, (rep,))

    def unchanged(self, prepared: Prepared, body: dict[str, Any]) -> Prepared:
        """``prepared`` (of this pipeline, for the client's ``body``) as if ``body`` had been sent unchanged: for a
        door that sends the original because writing the planned body failed (fail open), so that the state
        committed is what went out. Nothing repaired or marked, no routing key or header of agentcache's."""
        st = self.state
        last, client = st.sent, prepared.client
        before = last.request if last is not None else None
        sent = Sent(client, body, client, {}, _cache_key(last, client))
        state = replace(prepared.state, sent=sent, client_body=None, tools=st.tools.after(client, before),
                        routing_key=st.routing_key)  # fmt: skip
        return replace(
            prepared, body=body, planned=client, repairs=(), markers=(), marker_reasons=(), ttl=None,
            plan=TargetPlan(), state=state, headers=(), diagnosed=False,
        )  # fmt: skip

    def responded(self, prepared: Prepared, response_id: str) -> None:
        """The response to ``prepared`` (committed) arrived with ``response_id``: the next request is compared with
        it (provider diagnostics). Ignored when another request was committed since."""
        if self.state is prepared.state:
            self.state = replace(prepared.state, response_id=response_id)

    def commit(self, prepared: Prepared) -> None:
        """Record ``prepared`` as sent: the session's state becomes ``prepared.state``."""
        fresh = self.state.sent is None
        self.state = prepared.state
        self.scope.record(prepared, fresh, self.lineage)

    def snapshot(self) -> dict[str, Any]:
        """The session's state as a JSON-ready document (see :func:`snapshot`)."""
        return snapshot(self.state, self.target)

    @classmethod
    def from_snapshot(
        cls,
        doc: Mapping[str, Any],
        target: Target | str,
        *,
        scope: ScopeMemory | None = None,
        settings: Settings | None = None,
        session: str = "",
        lineage: str | None = None,
    ) -> SessionPipeline:
        """A pipeline in the state a :meth:`snapshot` recorded: the next request is planned exactly as it would
        have been in the pipeline that took the snapshot. Raises ValueError/KeyError/InputError for a bad
        document."""
        pipe = cls(target, scope=scope, settings=settings, session=session, lineage=lineage)
        restore(pipe, doc)
        return pipe

    def keep_warm(self, expected_gap: float | None = None) -> KeepWarmDecision | None:
        """Whether keep-warm requests should bridge the next pause (``expected_gap`` seconds; default from the
        session's past gaps); None when nothing was sent or the target has no keep-warm (Anthropic only). The
        proxy acts on it (setting ``keep_warm``), sending :meth:`keep_warm_body` at ``first_at`` and every
        ``interval`` seconds."""
        st = self.state
        return self.target.keep_warm(st.sent.request, st.times, expected_gap) if st.sent is not None else None

    def keep_warm_body(self) -> dict[str, Any] | None:
        """The last sent request as a prefill-only keep-warm request, or None (nothing sent, or not possible)."""
        return self.target.keep_warm_body(self.state.sent.body) if self.state.sent is not None else None


def with_headers(headers: Mapping[str, str] | None, add: tuple[tuple[str, str], ...]) -> dict[str, str]:
    """``headers`` (any mapping; names compared case-insensitively) with the planned ``add`` headers: a value
    joins an existing comma-separated list (``anthropic-beta``) unless it is already in it."""
    out = dict(headers or {})
    for name, value in add:
        key = next((k for k in out if k.lower() == name.lower()), name)
        have = [v.strip() for v in str(out.get(key, "")).split(",") if v.strip()]
        if value not in have:
            out[key] = ",".join([*have, value])
    return out


def _forms(
    repair: RepairPlan, rep: CanonicalRequest, planned: CanonicalRequest, tplan: TargetPlan
) -> dict[int, tuple[Any, ...]]:
    """Message index → the blocks sent for it (unmarked), wherever they differ from the client's: the earlier
    forms the repairs re-sent, and the strings a marker turned into text blocks."""
    forms: dict[int, tuple[Any, ...]] = dict(repair.messages)
    if tplan.reshapes and tplan.markers is not None:
        for i in tplan.markers:
            k = rep.blocks[i].message
            if k is not None and rep.blocks[i].data[:1] == b'"' and k < planned.messages:
                forms[k] = unmarked(planned.blocks[slice(*planned.message_span(k))])
    return forms


def _cache_key(last: Sent | None, planned: CanonicalRequest) -> str | None:
    """The first routing key the session sent (a key that changes per request is restored to it)."""
    if last is not None and last.cache_key is not None:
        return last.cache_key
    return planned.cache_key
