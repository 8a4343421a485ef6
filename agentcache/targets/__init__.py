"""Targets: whose cache a session's requests are planned for (``anthropic``, ``openai``, or a local ``engine``),
each a strategy object owning its rules, planning, storage tier, cost, simulator and keep-warm; and the one
resolution every door uses to choose it."""

from __future__ import annotations

from ._anthropic import AnthropicTarget
from ._base import PlanInput, Target, TargetPlan
from ._detect import EngineInfo, aprobe, is_provider_host, probe
from ._engine import EngineTarget
from ._openai import OpenAITarget, family_of
from ._resolve import TARGET_CHOICES, cost_usd, resolve_target, target_named

__all__ = [
    "TARGET_CHOICES",
    "AnthropicTarget",
    "EngineInfo",
    "EngineTarget",
    "OpenAITarget",
    "PlanInput",
    "Target",
    "TargetPlan",
    "aprobe",
    "cost_usd",
    "family_of",
    "is_provider_host",
    "probe",
    "resolve_target",
    "target_named",
]
