"""The provider cache simulators: deterministic models of Anthropic's and OpenAI's published caching rules, the
ideal bound, and the shapes every cache simulator shares (:class:`Simulator`, :class:`SimResult`,
:class:`SeenIndex`). An engine's cache models are :mod:`agentcache.engine`'s; a target picks its simulator
(:meth:`agentcache.targets.Target.simulator`)."""

from __future__ import annotations

from ._anthropic import AnthropicSimulator, breakpoints, last_cacheable, markers_valid
from ._base import Concurrency, SeenIndex, SimResult, Simulator, SimUsage
from ._ideal import IdealSimulator
from ._openai import OpenAISimulator, cached_tokens

__all__ = [
    "AnthropicSimulator",
    "Concurrency",
    "IdealSimulator",
    "OpenAISimulator",
    "SeenIndex",
    "SimResult",
    "SimUsage",
    "Simulator",
    "breakpoints",
    "cached_tokens",
    "last_cacheable",
    "markers_valid",
]
