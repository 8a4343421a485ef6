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

from collections import OrderedDict
from collections.abc import Mapping
from dataclasses import dataclass, field, replace
from typing import Any

from .._config import Settings, get_settings
from ..adapters import apply, canonicalize, reshaped
from ..analysis._diagnose import Divergence, diagnose
from ..analysis._repair import RepairPlan, Sent, ToolMemory, plan_repairs, repaired_request
from ..model._build import BlockCache, rebuild
from ..model._canonical import CanonicalRequest, static_end, unmarked, with_markers
from ..model._causes import MESSAGES_EDITED, REPAIRABLE_BREAKS, Cause
from ..model._rawjson import RawBody
from ..model._types import Api
from ..policies import KeepWarmDecision, KeyPlanner, TTLDecision
from ..policies.volatility import move_volatile
from ..targets import PlanInput, Target, TargetPlan, target_named
from ._snapshot import restore, snapshot
from ._state import Learned, PipelineState

__all__ = ["Learned", "PipelineState", "Prepared", "ScopeMemory", "SessionPipeline", "sibling_depth", "with_headers"]


#: Bytes of one cache scope's own objects (the ScopeMemory, its planner, their dicts), and of one remembered tool
#: set beyond its tools' canonical bytes (its entry, name set and ToolMemory); a remembered tool set holds
#: :data:`TOOL_SET_BYTES_PER_BYTE` bytes per byte of its tools' canonical data (the JSON units and the blocks):
#: measured with a ``sys.getsizeof`` walk (tests/test_memory_bounds.py measures them again), rounded up.
SCOPE_BYTES = 2000
TOOL_SET_BYTES = 1000
TOOL_SET_BYTES_PER_BYTE = 6


@dataclass(slots=True)
class ScopeMemory:
    """State shared by the sessions of one cache scope: the first tool memory seen for each tool-name set (so a
    new session of the same agent adopts its order and bytes; the ``max_tool_sets`` most recent sets), and the
    OpenAI key planner. ``tool_bytes``: the remembered tool sets' estimated bytes."""

    tools: OrderedDict[frozenset[str], ToolMemory] = field(default_factory=OrderedDict)
    max_tool_sets: int = 1024
    keys: KeyPlanner = field(default_factory=KeyPlanner)
    tool_bytes: int = 0

    def record(self, prepared: Prepared, fresh: bool, lineage: str = "") -> None:
        """Count ``prepared`` as sent by ``lineage``: its routing key's family, and its tools if it opened a
        session."""
        if prepared.plan.family is not None:
            self.keys.record(prepared.plan.family, prepared.at, lineage)
        names = _tool_names(prepared.planned)
        if fresh and names and names not in self.tools:
            self.tools[names] = prepared.state.tools
            self.tool_bytes += _tool_set_bytes(prepared.state.tools)
            while len(self.tools) > self.max_tool_sets:
                self.forget_oldest()

    def estimated_bytes(self) -> int:
        """Estimated bytes this scope holds: its tool sets and its planner's families."""
        return SCOPE_BYTES + self.tool_bytes + self.keys.estimated_bytes()

    def forget_oldest(self) -> bool:
        """Forget the least recently remembered tool set, else the planner's least recently used family (a memory
        bound's eviction); False when nothing is left."""
        if self.tools:
            _, old = self.tools.popitem(last=False)
            self.tool_bytes -= _tool_set_bytes(old)
            return True
        return self.keys.forget_oldest()


def _tool_set_bytes(tools: ToolMemory) -> int:
    return TOOL_SET_BYTES + TOOL_SET_BYTES_PER_BYTE * sum(len(b.data) + len(b.env) for b in tools.blocks.values())


@dataclass(frozen=True, slots=True)
class Prepared:
    """What :meth:`SessionPipeline.prepare` decided for one request.

    ``body``: the wire body to send (the client's own object when nothing changed). ``client``: the client's
    request, canonical. ``planned``: what is sent, canonical, markers included. ``before``: what the session
    sent before (None for its first request). ``divergence``: ``client`` against the client's previous request
    (None for the first). ``repairs``: the causes repaired. ``markers``: block paths given a marker, with the
    reason for each in ``marker_reasons``. ``ttl``: the TTL decision (Anthropic), else None. ``at``: the
    request's time (seconds; None when unknown). ``plan``: the target's decisions. ``state``: the session's
    state once this request was sent (installed by :meth:`SessionPipeline.commit`). ``headers``: the
    ``(name, value)`` headers the door adds when it sends ``body`` (:func:`with_headers`). ``diagnosed``: the
    request asks the provider to compare it with the session's last response (setting ``provider_diagnostics``).
    """

    body: dict[str, Any]
    client: CanonicalRequest
    planned: CanonicalRequest
    before: CanonicalRequest | None
    divergence: Divergence | None
    repairs: tuple[Cause, ...]
    markers: tuple[str, ...]
    marker_reasons: tuple[str, ...]
    ttl: TTLDecision | None
    at: float | None
    plan: TargetPlan
    state: PipelineState
    headers: tuple[tuple[str, str], ...] = ()
    diagnosed: bool = False


def sibling_depth(req: CanonicalRequest, sibling: tuple[bytes, ...]) -> int | None:
    """Blocks ``req`` (as the client sent it) shares with a sibling subagent's first request (its client prefix
    ``chain``: the bytes the client sent, before agentcache's markers reshape any string), when they diverge
    inside the messages (past tools and system, before ``req``'s end): the siblings' shared prefix, which no
    marker of the client's may end (claude-code#82739: a 33-token difference between subagent prompts rewrote
    5,308 cached tokens because the last breakpoint sat ~5.3K tokens before it). None otherwise."""
    n = min(len(sibling), len(req.chain))
    shared = next((i for i in range(n) if sibling[i] != req.chain[i]), n)
    return shared if static_end(req) < shared < len(req.blocks) else None


def _tool_names(req: CanonicalRequest) -> frozenset[str]:
    head = req.blocks[: req.msg_start[0]] if req.messages else req.blocks
    return frozenset(b.name or "" for b in head if b.section == "tool")


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
        routing_key: str | None = None,
        sibling: tuple[bytes, ...] | None = None,
        spawns: tuple[float, ...] = (),
    ) -> Prepared:
        """Plan the request sent at ``now`` (seconds; None when unknown). ``raw``: the source texts of ``body``
        when it was parsed by :func:`agentcache.model.loads` (its unchanged units are then keyed by their text).
        ``routing_key``: the key the session's lineage already carries. ``sibling``: for a subagent's first
        request, the prefix chain of its latest sibling's first request (where the two diverge inside the
        messages, the planner may mark the end of their shared part: :func:`sibling_depth`); ``spawns``: the times
        of the lineage's earlier subagents' first requests (the TTL policy's gaps for a subagent's first request).
        Pure; raises InputError for a malformed body (the caller then sends the original request unchanged)."""
        api = Api(api)
        st = self.state
        self.cache.begin(raw)
        client = canonicalize(api, body, cache=self.cache)
        last = st.sent
        div = diagnose(last.client, client) if last is not None and last.client is not None else None
        work_body, work, volatile = body, client, st.volatile
        if self.settings.move_volatile and api == Api.ANTHROPIC_MESSAGES:
            moved, volatile = move_volatile(body, st.volatile)
            if moved is not body:  # opt-in, and it changes the prompt: read the moved body too
                work_body, work = moved, canonicalize(api, moved, cache=self.cache)
        tools = st.tools
        if last is None:
            tools = self.scope.tools.get(_tool_names(work)) or tools
        repair = plan_repairs(work, work_body, last, tools)
        rep = repaired_request(work, repair, (last.request,) if last is not None else ())
        learned = st.learned
        if last is not None and div is not None and (div.cause is not None or div.ephemeral):
            learned = learn(st.learned, last.request, rep, diagnose(last.request, rep))
        key = st.routing_key or routing_key
        inp = PlanInput(
            api,
            rep,
            last.request if last is not None else None,
            self.settings,
            now,
            st.times,
            st.timed,
            learned.ephemeral_tail,
            learned.rewrite_at,
            key,
            self.lineage,
            self.scope.keys,
            bool(repair.plan.replace) or repair.plan.tool_order is not None,
            st.response_id,
            sibling_depth(client, sibling) if sibling is not None and last is None else None,
            spawns if last is None else (),
        )
        tplan = self.target.plan(inp)
        plan = repair.plan.merged(tplan.wire).merged(self.target.diagnostics(inp))
        if plan.markers is not None:
            marked = {m for i in rep.marked if (m := rep.blocks[i].message) is not None}
            plan = replace(plan, marked=frozenset(marked) | _replaced(repair))
        wire = apply(api, work_body, plan) if not plan.empty else work_body
        planned = self._planned(api, rep, tplan)
        state = PipelineState(
            Sent(planned, wire, client, _forms(repair, rep, planned, tplan), _cache_key(last, planned)),
            None if wire is body else body,
            tools.after(planned, last.request if last is not None else None),
            key or tplan.routing_key,
            (*st.times[-31:], now) if now is not None else st.times,
            st.timed and now is not None,
            learned,
            volatile,
        )
        return Prepared(
            wire,
            client,
            planned,
            last.request if last is not None else None,
            div,
            repair.repaired,
            tplan.paths,
            tplan.reasons,
            tplan.ttl,
            now,
            tplan,
            state,
            plan.headers,
            isinstance(plan.diagnostics, str),
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


def _replaced(repair: RepairPlan) -> frozenset[int]:
    """Messages re-sent in an earlier form: the marker writer visits them (they may carry old markers)."""
    return frozenset(repair.messages)


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
