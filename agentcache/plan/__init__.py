"""``agentcache plan``: capacity and eviction planning for a self-hosted KV cache, on recorded traffic.

Every recorded request (any format ``audit`` reads) is rendered to token ids (:mod:`._tokens`), replayed in
time order through a paged radix tree shared by all sessions with SGLang's tiers and eviction (:mod:`._tree`),
once per swept configuration (:mod:`._run`), and summarised with the pre-launch checklist and the
``agentcache serve --l2/--l3`` flags the traffic calls for (:mod:`._plan`, :mod:`._render`).
"""

from __future__ import annotations

from ._capacity import kv_bytes_from_config, parse_sizes
from ._plan import PlanOptions, PlanReport, plan
from ._render import render_plan
from ._run import ConfigResult, CostModel, PlanConfig, Step, percentile, schedule, simulate
from ._tokens import BlockRenderer, Prompt, Renderer, ServerRenderer, ids_prompt
from ._tree import EVICTIONS, Access, TieredRadixCache

__all__ = [
    "EVICTIONS",
    "Access",
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
    "TieredRadixCache",
    "ids_prompt",
    "kv_bytes_from_config",
    "parse_sizes",
    "percentile",
    "plan",
    "render_plan",
    "schedule",
    "simulate",
]
