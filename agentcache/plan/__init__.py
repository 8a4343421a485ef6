"""``agentcache plan``: capacity and eviction planning for a self-hosted KV cache, on recorded traffic.

Every recorded request (any format ``audit`` reads) is rendered to token ids (:mod:`._tokens`), replayed in
time order through SGLang's paged radix tree with its tiers and eviction (the engine cache model
:class:`agentcache.engine.TieredRadixCache`), once per swept configuration (:mod:`._run`), and summarised with
the pre-launch checklist and the ``agentcache serve --l2/--l3`` flags the traffic calls for (:mod:`._plan`,
:mod:`._render`).
"""

from __future__ import annotations

from ..engine import Prompt
from ._capacity import kv_bytes_from_config, parse_sizes
from ._plan import PlanOptions, PlanReport, plan
from ._render import render_plan
from ._run import ConfigResult, CostModel, PlanConfig, Step, percentile, schedule, simulate
from ._tokens import BlockRenderer, Renderer, ServerRenderer

__all__ = [
    "BlockRenderer",
    "ConfigResult",
    "CostModel",
    "PlanConfig",
    "PlanOptions",
    "PlanReport",
    "Prompt",
    "Renderer",
    "ServerRenderer",
    "Step",
    "kv_bytes_from_config",
    "parse_sizes",
    "percentile",
    "plan",
    "render_plan",
    "schedule",
    "simulate",
]
