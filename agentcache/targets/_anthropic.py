"""Anthropic's prompt cache (Messages API): breakpoint markers, 5m/1h TTLs, keep-warm.

Rules and prices: ``agentcache/data/models.toml`` (platform.claude.com/docs/en/build-with-claude/prompt-caching).
Markers are placed by :func:`agentcache.policies.plan_breakpoints` with the TTL of
:func:`agentcache.policies.choose_ttl`, and written onto Anthropic Messages bodies only (other wire formats can
be audited under these rules: the markers then live on the canonical request alone).
"""

from __future__ import annotations

import itertools
from collections.abc import Mapping
from typing import Any

from ..model._canonical import CanonicalRequest, common_prefix
from ..model._fields import StorageTier
from ..model._plan import WirePlan
from ..model._provider import ANTHROPIC_BETA
from ..model._rules import anthropic_rules
from ..model._types import Api, TargetKind
from ..model._usage import CacheUsage
from ..policies import KeepWarmDecision, PlanHints, choose_ttl, expected_pause, plan_breakpoints, plan_keep_warm
from ..simulate import AnthropicSimulator, Concurrency, Simulator
from ._base import PlanInput, Target, TargetPlan

__all__ = ["AnthropicTarget", "gaps_of"]


def gaps_of(times: tuple[float, ...], now: float | None, timed: bool) -> list[float] | None:
    """Seconds between a session's consecutive requests, this one (at ``now``) included; None when a request
    came without a time (recorded traffic without timestamps: no gap is assumed long)."""
    if not timed or now is None or not times:
        return None
    seq = [*times, now]
    return [b - a for a, b in itertools.pairwise(seq)]


class AnthropicTarget(Target):
    """Anthropic prompt caching (see the module docstring)."""

    kind = TargetKind.ANTHROPIC

    def plan(self, inp: PlanInput) -> TargetPlan:
        """Markers (at most four, 1h before 5m) and the TTL for the request's new entries."""
        rep = inp.request
        rules = anthropic_rules(self.model or rep.model)
        shared = common_prefix(inp.sent, rep) if inp.sent is not None else 0
        cached = rep.tokens_before(shared)
        gaps, source = gaps_of(inp.times, inp.now, inp.timed), "session"
        if inp.sent is None and inp.spawns:  # a subagent's first request: when does its lineage's next one come?
            gaps, source = gaps_of(inp.spawns, inp.now, inp.timed), "siblings"
        ttl = choose_ttl(gaps, cached, rep.tokens - cached, rules, inp.settings.ttl_policy, source)
        hints = PlanHints(inp.ephemeral_tail, inp.rewrite_at, ttl.ttl, inp.settings.markers, inp.sibling_at)
        bp = plan_breakpoints(rep, inp.sent, rules, hints)
        paths = tuple(rep.blocks[i].path for i in bp.markers)
        reasons = tuple(bp.reasons[i] for i in bp.markers)
        wire = WirePlan()
        reshapes = False
        if inp.api == Api.ANTHROPIC_MESSAGES:
            wire = WirePlan(markers=tuple(zip(paths, bp.markers.values(), strict=True)), top_marker=False)
            # A marker on a string turns it into a text block: the sent body must be read again.
            reshapes = any(rep.blocks[i].data[:1] == b'"' for i in bp.markers)
        return TargetPlan(wire, bp.markers, bp.top, paths, reasons, ttl, reshapes)

    def diagnostics(self, inp: PlanInput) -> WirePlan:
        """Anthropic cache diagnostics (platform.claude.com/docs/en/build-with-claude/cache-diagnostics):
        ``diagnostics.previous_message_id`` = the session's last response id (null on its first request, which
        opts in), and the ``anthropic-beta: cache-diagnosis-2026-04-07`` header. Messages API only."""
        if not inp.settings.provider_diagnostics or inp.api != Api.ANTHROPIC_MESSAGES:
            return WirePlan()
        return WirePlan(diagnostics=inp.previous_response, headers=(("anthropic-beta", ANTHROPIC_BETA),))

    def storage_tier(self, plan: TargetPlan, planned: CanonicalRequest, usage: CacheUsage | None) -> StorageTier:
        """Provider storage; the TTL of the entries the request writes (None when it places no marker)."""
        tiers = dict(usage.tiers) if usage is not None else {}
        return StorageTier("provider", plan.ttl.ttl if plan.ttl is not None and plan.paths else None, tiers)

    def cost(self, usage: CacheUsage, model: str | None) -> float | None:
        """Input-side USD: uncached at the base price, reads and 5m/1h writes at the model's cache prices (0.1×,
        1.25×, 2× unless its row says otherwise). An unknown model is priced as the table's default model."""
        rules = anthropic_rules(self.model or model)
        w5 = usage.cache_write_tokens - usage.cache_write_1h_tokens
        return rules.cost(usage.uncached_tokens, usage.cache_read_tokens, w5, usage.cache_write_1h_tokens)

    def simulator(self, model: str | None = None, concurrency: Concurrency | None = None) -> Simulator:
        """:class:`~agentcache.simulate.AnthropicSimulator` (with ``concurrency``: overlapping requests)."""
        return AnthropicSimulator(model or self.model, concurrency)

    def keep_warm(
        self, sent: CanonicalRequest, times: tuple[float, ...], expected_gap: float | None
    ) -> KeepWarmDecision | None:
        """Refreshes (reads at 0.1×) against a rewrite (1.25×/2×) across the expected pause (default: the median
        of the session's past gaps longer than the 5m TTL); None when nothing is cached or no pause is expected."""
        rules = anthropic_rules(self.model or sent.model)
        if expected_gap is None:
            expected_gap = expected_pause(times, rules)
            if expected_gap is None:
                return None
        marks = sent.markers()
        if not marks:
            return None
        ttl = rules.ttl_1h_seconds if marks[-1][1].ttl == "1h" else rules.ttl_5m_seconds
        return plan_keep_warm(expected_gap, ttl, sent.tokens_before(marks[-1][0] + 1), rules)

    def keep_warm_body(self, sent_body: Mapping[str, Any]) -> dict[str, Any] | None:
        """The last sent request with ``max_tokens: 0`` (Anthropic's prompt cache pre-warming: it reads the cached
        prefix, refreshing its TTL, and generates nothing). None with extended thinking or structured output,
        which a ``max_tokens: 0`` request cannot carry (dropping them would change the cached prefix)."""
        thinking = sent_body.get("thinking")
        if isinstance(thinking, dict) and thinking.get("type") not in (None, "disabled"):
            return None
        if sent_body.get("output_format") is not None:
            return None
        return {**sent_body, "max_tokens": 0, "stream": False}
