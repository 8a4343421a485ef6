"""Provider cache simulators: deterministic models of the published caching rules."""

from __future__ import annotations

from .._exceptions import ConfigError
from ._anthropic import AnthropicSimulator, breakpoints, last_cacheable, markers_valid
from ._base import SeenIndex, SimResult, SimUsage
from ._ideal import IdealSimulator
from ._openai import OpenAISimulator, cached_tokens


def simulator_for(provider: str, model: str | None = None) -> AnthropicSimulator | OpenAISimulator:
    """A fresh simulator for ``provider`` (``anthropic`` or ``openai``). Raises ConfigError otherwise."""
    if provider == "anthropic":
        return AnthropicSimulator(model)
    if provider == "openai":
        return OpenAISimulator(model)
    raise ConfigError(f"unknown provider {provider!r}; expected 'anthropic' or 'openai'")


__all__ = [
    "AnthropicSimulator",
    "IdealSimulator",
    "OpenAISimulator",
    "SeenIndex",
    "SimResult",
    "SimUsage",
    "breakpoints",
    "cached_tokens",
    "last_cacheable",
    "markers_valid",
    "simulator_for",
]
