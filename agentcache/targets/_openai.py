"""OpenAI's automatic prompt cache: routing keys per session lineage, explicit breakpoints where the model takes
them (gpt-5.6 and later).

Rules and prices: ``agentcache/data/models.toml`` (platform.openai.com/docs/guides/prompt-caching). The
``prompt_cache_key`` of :class:`~agentcache.policies.KeyPlanner` (the routing family of the prompt's first tokens
+ a shard of the lineage) is added when the client sends none and the ``openai_cache_key`` setting is ``lineage``;
once chosen it is the session's for good, and its lineage's (subagents, later generations).
"""

from __future__ import annotations

from ..model._canonical import CanonicalRequest
from ..model._fields import StorageTier
from ..model._plan import KEEP, WirePlan
from ..model._rules import openai_rules
from ..model._types import Api, TargetKind
from ..model._usage import CacheUsage
from ..policies import PlanHints
from ..policies.breakpoints import plan_openai_breakpoints
from ..simulate import Concurrency, OpenAISimulator, Simulator
from ..simulate._openai import routing_hash
from ._base import PlanInput, Target, TargetPlan

__all__ = ["OpenAITarget", "family_of"]


def family_of(req: CanonicalRequest) -> str:
    """The routing family of ``req``: the hex chain hash through the block holding its ``routing_prefix_tokens``-th
    token (OpenAI routes by a hash of a prompt's first ~256 tokens joined with its key: platform.openai.com/docs/
    guides/prompt-caching). Requests that share it share machines without a key, so one key per family, sharded
    only when it pays (:class:`~agentcache.policies.KeyPlanner`), never splits what the client's own traffic shares
    (a subagent whose tool list differs only after its first tools: Qwen Code's, issue 23)."""
    return routing_hash(req, openai_rules(req.model).routing_prefix_tokens).hex()


class OpenAITarget(Target):
    """OpenAI prompt caching (see the module docstring)."""

    kind = TargetKind.OPENAI

    def plan(self, inp: PlanInput) -> TargetPlan:
        """The routing key, and ``prompt_cache_breakpoint`` parts on models that take them."""
        rep = inp.request
        if inp.api == Api.ANTHROPIC_MESSAGES:
            return TargetPlan()  # audited under OpenAI rules: no field to carry a key or breakpoints
        key: str | None = None
        family: str | None = None
        if inp.settings.openai_cache_key == "lineage" and not rep.cache_key:
            # Every request carrying agentcache's key counts towards its family's rate (the planner records
            # it on commit), also once the session's key is fixed.
            family = family_of(rep)
            key = inp.routing_key
            if key is None and inp.keys is not None:
                key = inp.keys.key(family, inp.lineage, inp.now)
            if key is not None:
                rep = rep.evolve(cache_key=key)
        wire = WirePlan(cache_key=key if key is not None else KEEP)
        rules = openai_rules(self.model or rep.model)
        if not rules.breakpoints:
            return TargetPlan(wire, None, None, routing_key=key, family=family) if key else TargetPlan()
        hints = PlanHints(inp.ephemeral_tail, inp.rewrite_at, "30m", inp.settings.markers)
        bp = plan_openai_breakpoints(rep, hints, rules.max_explicit_with_implicit)
        paths = tuple(rep.blocks[i].path for i in bp.markers)
        reasons = tuple(bp.reasons[i] for i in bp.markers)
        wire = WirePlan(cache_key=wire.cache_key, markers=tuple(zip(paths, bp.markers.values(), strict=True)))
        reshapes = any(rep.blocks[i].data[:1] == b'"' for i in bp.markers)
        return TargetPlan(wire, bp.markers, None, paths, reasons, None, reshapes, key, family)

    def diagnostics(self, inp: PlanInput) -> WirePlan:
        """OpenAI prompt cache diagnostics (developers.openai.com/api/docs/guides/prompt-caching/diagnostics):
        ``prompt_cache_options.comparison_response_id`` = the session's last response id. Responses API, on
        models that take ``prompt_cache_options`` (gpt-5.6 and later), once a previous response is known."""
        rules = openai_rules(self.model or inp.request.model)
        if (
            not inp.settings.provider_diagnostics
            or inp.api != Api.OPENAI_RESPONSES
            or not rules.breakpoints
            or inp.previous_response is None
        ):
            return WirePlan()
        return WirePlan(diagnostics=inp.previous_response)

    def storage_tier(self, plan: TargetPlan, planned: CanonicalRequest, usage: CacheUsage | None) -> StorageTier:
        """Provider storage; the requested retention (``prompt_cache_options``), else ``in_memory``."""
        tiers = dict(usage.tiers) if usage is not None else {}
        return StorageTier("provider", planned.retention or "in_memory", tiers)

    def cost(self, usage: CacheUsage, model: str | None) -> float | None:
        """Input-side USD: uncached tokens at the input price, written ones at the write price (the input price
        when the model's row has none), cached ones at the cached price, all doubled over a model's long-context
        threshold (:meth:`~agentcache.model._rules.OpenAIRules.cost`). An unknown model is priced as the table's
        default model."""
        rules = openai_rules(self.model or model)
        return rules.cost(usage.uncached_tokens, usage.cache_read_tokens, usage.cache_write_tokens)

    def simulator(self, model: str | None = None, concurrency: Concurrency | None = None) -> Simulator:
        """:class:`~agentcache.simulate.OpenAISimulator`."""
        return OpenAISimulator(model or self.model)
