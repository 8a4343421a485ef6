"""Pure decisions over the canonical model (``agentcache.policies``).

Policies import only the core model; they return frozen decisions that adapters apply to the wire.
"""

from __future__ import annotations

from .anchors import STRATEGIES, apply_strategy
from .breakpoints import BreakpointPlan, PlanHints, plan_breakpoints
from .cache_key import KeyPlanner, jump_hash
from .ttl import KeepWarmDecision, TTLDecision, choose_ttl, expected_pause, long_gap_probability, plan_keep_warm

__all__ = [
    "STRATEGIES",
    "BreakpointPlan",
    "KeepWarmDecision",
    "KeyPlanner",
    "PlanHints",
    "TTLDecision",
    "apply_strategy",
    "choose_ttl",
    "expected_pause",
    "jump_hash",
    "long_gap_probability",
    "plan_breakpoints",
    "plan_keep_warm",
]
