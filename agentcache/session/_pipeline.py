"""The per-session request pipeline shared by audit, the SDK wrappers and the proxy:
canonicalize → diagnose → repair → plan → apply.

:class:`SessionPipeline` holds one session's memory; :meth:`SessionPipeline.prepare` turns the
client's wire body into the body agentcache sends (repairs, routing key and planned breakpoints
applied) and reports what it found. :meth:`SessionPipeline.commit` records the prepared request as
sent; callers commit only once the request actually went out, so a request that failed before
sending leaves the session unchanged.
"""

from __future__ import annotations

from collections.abc import Mapping
from dataclasses import dataclass, field, replace
from typing import Any, NamedTuple

from .._config import Settings, get_settings
from ..adapters import WirePlan, apply, canonicalize
from ..analysis._diagnose import Divergence, diagnose
from ..analysis._repair import SessionMemory, plan_repairs
from ..model import _causes as C
from ..model._canonical import BlockCache, CanonicalRequest, common_prefix, static_end, with_markers
from ..model._rawjson import RawBody
from ..model._rules import anthropic_rules, openai_rules
from ..policies import (
    KeepWarmDecision,
    KeyPlanner,
    PlanHints,
    TTLDecision,
    choose_ttl,
    plan_breakpoints,
    plan_keep_warm,
)
from ..policies.breakpoints import plan_openai_breakpoints
from ..policies.volatility import VolatileMemory, move_volatile


@dataclass(slots=True)
class ScopeMemory:
    """State shared by the sessions of one cache scope: the first tool order and bytes seen for each
    tool-name set (so a new session of the same agent adopts them; a copy of those two fields, for the
    ``max_tool_sets`` most recent sets), and the OpenAI key planner."""

    tools: dict[frozenset[str], SessionMemory] = field(default_factory=dict)
    max_tool_sets: int = 1024
    keys: KeyPlanner = field(default_factory=KeyPlanner)


@dataclass(frozen=True, slots=True)
class Prepared:
    """What :meth:`SessionPipeline.prepare` decided for one request.

    ``body``: the wire body to send (the client's own object when nothing changed). ``original``:
    the client's request, canonical. ``planned``: what is sent, canonical, markers included.
    ``divergence``: ``original`` against the client's previous request (None for the first).
    ``repairs``: causes repaired. ``markers``: block paths carrying a planned marker, with the reason
    for each in ``marker_reasons``. ``ttl``: the TTL decision (Anthropic), else None.
    ``unmarked``: the wire body before markers were applied (what the session remembers).
    ``learned``: the client-habit hints this request taught, installed by ``commit``.
    """

    body: dict[str, Any]
    original: CanonicalRequest
    planned: CanonicalRequest
    divergence: Divergence | None
    repairs: tuple[str, ...]
    markers: tuple[str, ...]
    marker_reasons: tuple[str, ...] = ()
    ttl: TTLDecision | None = None
    unmarked: dict[str, Any] | None = None
    at: float | None = None
    learned: Learned | None = None


class Learned(NamedTuple):
    """Client-habit hints after a request (see ``SessionPipeline._learn``); installed on commit."""

    edit_points: tuple[int, ...]
    ephemeral_tail: int
    rewrite_at: int | None


def _tool_names(req: CanonicalRequest) -> frozenset[str]:
    return frozenset(b.name or "" for b in req.blocks if b.section == "tool")


class SessionPipeline:
    """One session's pipeline.

    ``provider`` decides the policies (``anthropic``: breakpoints and TTL; ``openai``: routing key).
    ``model`` overrides the request's model for the provider rules. ``lineage``: the root session of
    a subagent tree (defaults to ``session``); subagents share its OpenAI key. ``apply_markers``:
    write planned markers onto Anthropic wire bodies (audit only needs them on the canonical form).
    """

    def __init__(
        self,
        provider: str,
        model: str | None = None,
        scope: ScopeMemory | None = None,
        apply_markers: bool = True,
        settings: Settings | None = None,
        session: str = "",
        lineage: str | None = None,
    ):
        self.provider = provider
        self.model = model
        self.scope = scope if scope is not None else ScopeMemory()
        self.apply_markers = apply_markers
        self.settings = settings or get_settings()
        self.session = session
        self.lineage = lineage or session
        self.memory = SessionMemory()
        self.cache = BlockCache()
        self.last_original: CanonicalRequest | None = None
        self.times: list[float] = []
        self.timed = True
        self.edit_points: list[int] = []
        self.ephemeral_tail = 0
        self.rewrite_at: int | None = None
        self.routing_key: str | None = None
        self.volatile = VolatileMemory()

    # ---- learning from the client's own history ------------------------------------------------

    def _learn(self, prev: CanonicalRequest, new: CanonicalRequest, div: Divergence) -> Learned:
        """The hints after the repaired request ``new``, given how it relates to the last sent ``prev``.
        Pure: :meth:`commit` installs them, so a request that is never sent teaches nothing."""
        edits, tail, rewrite = list(self.edit_points), 0, self.rewrite_at
        if div.cause is None or div.cause in C.REPAIRABLE_BREAKS:
            return Learned(tuple(edits), tail, rewrite)  # same meaning: nothing to learn about the client
        old = prev.blocks[div.shared_blocks]
        last_msg = max((b.message for b in prev.blocks if b.message is not None), default=None)
        n_new = len({b.message for b in new.blocks if b.message is not None})
        n_old = len({b.message for b in prev.blocks if b.message is not None})
        if old.message is not None and old.message == last_msg and n_new > n_old:
            # The client dropped trailing blocks of its last message and went on: they are ephemeral.
            tail = sum(1 for b in prev.blocks[div.shared_blocks :] if not b.is_option)
        if div.cause == C.MESSAGES_EDITED and old.message is not None:
            edits.append(old.message)
            growth = max(1, n_new - n_old)
            stride = edits[-1] - edits[-2] if len(edits) > 1 else growth
            rewrite = old.message + stride if stride > 0 else None
        return Learned(tuple(edits), tail, rewrite)

    def _routing_key(self, req: CanonicalRequest, now: float | None) -> str:
        """This session's ``prompt_cache_key``: fixed once chosen, so the session stays where its
        history lives; later requests still count towards the family's rate."""
        end = static_end(req)
        family = (req.chain[end - 1] if end else b"").hex()
        key = self.scope.keys.key(family, self.lineage, now)
        if self.routing_key is None:
            self.routing_key = key
        return self.routing_key

    # ---- the pipeline ------------------------------------------------------------------------

    def prepare(
        self,
        api: str,
        body: dict[str, Any],
        original: CanonicalRequest | None = None,
        now: float | None = None,
        raw: RawBody | None = None,
    ) -> Prepared:
        """Plan the request sent at ``now`` (seconds; None when unknown). ``original``: ``body`` already
        canonicalized with this session's cache (after ``self.cache.begin()``). ``raw``: the source texts of
        ``body`` when it was parsed by :func:`agentcache.model._rawjson.loads` (unchanged units are then keyed by
        their text, not encoded). Raises InputError for a malformed body (the caller fails open)."""
        if original is None:
            self.cache.begin(raw)
        orig = original if original is not None else canonicalize(api, body, cache=self.cache)
        div = diagnose(self.last_original, orig) if self.last_original is not None else None
        client = orig
        if self.settings.move_volatile and api == "anthropic.messages":
            moved = move_volatile(body, self.volatile)
            if moved is not body:
                body, orig = moved, canonicalize(api, moved, cache=self.cache)
        if self.memory.sent is None:
            first = self.scope.tools.get(_tool_names(orig))
            if first is not None and _tool_names(orig):
                self.memory.tool_order = list(first.tool_order)
                self.memory.tool_units = dict(first.tool_units)
        repair = plan_repairs(self.memory, orig, body, self.last_original)
        wire = apply(api, body, repair.plan) if not repair.plan.empty else body
        rep = canonicalize(api, wire, cache=self.cache) if wire is not body else orig
        if (
            self.provider == "openai"
            and api != "anthropic.messages"
            and self.settings.openai_cache_key == "lineage"
            and not orig.cache_key
        ):
            key = self._routing_key(rep, now)
            wire = apply(api, wire, WirePlan(cache_key=key))
            rep = replace(rep, cache_key=key)
        learned = Learned(tuple(self.edit_points), self.ephemeral_tail, self.rewrite_at)
        if self.memory.sent is not None:
            # Learn from the repaired request against what was sent, so the lesson does not depend on
            # whether the client's bytes needed repairs (planning twice gives the same plan).
            learned = self._learn(self.memory.sent, rep, diagnose(self.memory.sent, rep))
        planned, unmarked = rep, wire
        marks: tuple[str, ...] = ()
        reasons: tuple[str, ...] = ()
        ttl: TTLDecision | None = None
        if self.provider == "openai" and api != "anthropic.messages":
            orules = openai_rules(self.model or rep.model)
            if orules.breakpoints:
                hints = PlanHints(learned.ephemeral_tail, learned.rewrite_at, "30m", self.settings.markers)
                bp = plan_openai_breakpoints(rep, hints, orules.max_explicit_with_implicit)
                planned = with_markers(rep, bp.markers)
                marks = tuple(rep.blocks[i].path for i in bp.markers)
                reasons = tuple(bp.reasons[i] for i in bp.markers)
                if self.apply_markers:
                    wire = apply(api, wire, WirePlan(markers=tuple((p, "30m") for p in marks)))
                    if _reshaped(rep, bp.markers):
                        planned = canonicalize(api, wire, cache=self.cache)
        if self.provider == "anthropic":
            rules = anthropic_rules(self.model or rep.model)
            shared = common_prefix(self.memory.sent, rep) if self.memory.sent is not None else 0
            cached = rep.tokens_before(shared)
            gaps = None
            if self.timed and now is not None and self.times:
                gaps = [b - a for a, b in zip([*self.times, now], [*self.times, now][1:], strict=False)]
            ttl = choose_ttl(gaps, cached, rep.tokens - cached, rules, self.settings.ttl_policy)
            hints = PlanHints(learned.ephemeral_tail, learned.rewrite_at, ttl.ttl, self.settings.markers)
            bp = plan_breakpoints(rep, self.memory.sent, rules, hints)
            planned = with_markers(rep, bp.markers, bp.top)
            marks = tuple(rep.blocks[i].path for i in bp.markers)
            reasons = tuple(bp.reasons[i] for i in bp.markers)
            if self.apply_markers and api == "anthropic.messages":
                wire = apply(
                    api,
                    wire,
                    WirePlan(
                        markers=tuple((p, m.ttl) for p, m in zip(marks, bp.markers.values(), strict=True)),
                        top_marker=False,
                    ),
                )
                # A marker on a string turns it into a text block: re-read what is really sent. Otherwise
                # markers are not content and the planned request already is what is sent.
                planned = (
                    canonicalize(api, wire, cache=self.cache)
                    if _reshaped(rep, bp.markers)
                    else with_markers(rep, bp.markers)
                )
        return Prepared(wire, client, planned, div, repair.repaired, marks, reasons, ttl, unmarked, now, learned)

    def keep_warm(self, expected_gap: float | None = None) -> KeepWarmDecision | None:
        """Whether keep-warm requests should bridge the next gap (Anthropic; None when there is
        nothing cached or no gap to expect). ``expected_gap`` in seconds defaults to the median of the
        session's past gaps longer than 5 minutes. The proxy and wrappers act on it (setting
        ``keep_warm``), sending :meth:`keep_warm_body` at ``first_at`` and every ``interval`` seconds."""
        if self.provider != "anthropic" or self.memory.sent is None:
            return None
        sent = self.memory.sent
        rules = anthropic_rules(self.model or sent.model)
        if expected_gap is None:
            gaps = [b - a for a, b in zip(self.times, self.times[1:], strict=False)]
            long = sorted(g for g in gaps if g > rules.ttl_5m_seconds)
            if not long:
                return None
            expected_gap = long[len(long) // 2]
        marks = sent.markers()
        if not marks:
            return None
        ttl = rules.ttl_1h_seconds if marks[-1][1].ttl == "1h" else rules.ttl_5m_seconds
        return plan_keep_warm(expected_gap, ttl, sent.tokens_before(marks[-1][0] + 1), rules)

    def keep_warm_body(self) -> dict[str, Any] | None:
        """The last sent request as a prefill-only keep-warm request (``max_tokens: 0``, Anthropic's prompt cache
        pre-warming): it reads the cached prefix, which refreshes its TTL, and generates nothing. None when
        nothing was sent, or when the request uses extended thinking or structured output, which a
        ``max_tokens: 0`` request cannot carry (and dropping them would change the cached prefix)."""
        sent = self.memory.sent_body
        if sent is None:
            return None
        thinking = sent.get("thinking")
        if isinstance(thinking, dict) and thinking.get("type") not in (None, "disabled"):
            return None
        if sent.get("output_format") is not None:
            return None
        return {**sent, "max_tokens": 0, "stream": False}

    def commit(self, prepared: Prepared) -> None:
        """Record ``prepared`` as sent."""
        fresh = self.memory.sent is None
        self.memory.remember(prepared.planned, prepared.body)
        if prepared.learned is not None:
            self.edit_points = list(prepared.learned.edit_points)
            self.ephemeral_tail, self.rewrite_at = prepared.learned.ephemeral_tail, prepared.learned.rewrite_at
        names = _tool_names(prepared.planned)
        if fresh and names not in self.scope.tools:
            # The tool order and bytes only, not this session's live memory (its whole last request).
            first = SessionMemory(tool_units=dict(self.memory.tool_units), tool_order=list(self.memory.tool_order))
            self.scope.tools[names] = first
            while len(self.scope.tools) > self.scope.max_tool_sets:
                del self.scope.tools[next(iter(self.scope.tools))]
        self.last_original = prepared.original
        if prepared.at is None:
            self.timed = False
        else:
            self.times = [*self.times[-31:], prepared.at]


def _reshaped(req: CanonicalRequest, marked: Mapping[int, object]) -> bool:
    """True when writing markers on blocks ``marked`` changes the request's content: a marker on a string
    unit (a JSON string, not an object) turns it into a one-element list of text blocks."""
    return any(req.blocks[i].data[:1] == b'"' for i in marked)
