"""Provider cache simulators: deterministic models of the published caching rules."""

from __future__ import annotations

from .._exceptions import ConfigError
from ._anthropic import AnthropicSimulator, breakpoints, last_cacheable, markers_valid
from ._base import Concurrency, SeenIndex, SimResult, Simulator, SimUsage
from ._engine import EngineSimulator
from ._ideal import IdealSimulator
from ._openai import OpenAISimulator, cached_tokens


def simulator_for(provider: str, model: str | None = None) -> Simulator:
    """A fresh simulator for ``provider`` (``anthropic``, ``openai`` or ``engine``). Raises ConfigError otherwise."""
    if provider == "anthropic":
        return AnthropicSimulator(model)
    if provider == "openai":
        return OpenAISimulator(model)
    if provider == "engine":
        return EngineSimulator(model)
    raise ConfigError(f"unknown provider {provider!r}; expected 'anthropic', 'openai' or 'engine'")


__all__ = [
    "AnthropicSimulator",
    "Concurrency",
    "EngineSimulator",
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
    "simulator_for",
]
