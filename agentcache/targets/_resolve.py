"""One target resolution for every door: explicit setting > declared > detected > inferred from the API.

* **explicit setting**: the ``target`` setting (``AGENTCACHE_TARGET``, or ``target`` in the config file's
  ``[agentcache]`` table): ``anthropic``, ``openai``, ``engine`` or an engine name; ``auto`` (the default) defers;
* **declared** by the door: ``wrap(..., provider=)`` / ``Sessions(provider=)``, ``agentcache proxy --engine``,
  ``agentcache audit --provider``, ``agentcache replay --engine``;
* **detected**: the endpoint answered as a local engine (:mod:`agentcache.targets._detect`);
* **inferred**: the provider whose API the request speaks (``/v1/messages`` → Anthropic, the OpenAI routes →
  OpenAI). So a gateway in front of a provider (LiteLLM, OpenRouter, a company gateway) gets that provider's
  rules, and only a recognised engine, or one named by the user, gets the engine target.

A session takes its target at its first request and keeps it.
"""

from __future__ import annotations

from .._exceptions import ConfigError
from ..model._types import Api, Engine, TargetKind, parse_engine
from ..model._usage import CacheUsage
from ._anthropic import AnthropicTarget
from ._base import Target
from ._engine import EngineTarget
from ._openai import OpenAITarget

__all__ = ["TARGET_CHOICES", "cost_usd", "resolve_target", "target_named"]

#: What the ``target`` setting and a door's declaration may name (besides an engine name).
TARGET_CHOICES = ("auto", "anthropic", "openai", "engine")


def target_named(name: str | Target, *, model: str | None = None, engine: Engine | None = None) -> Target:
    """The target called ``name``: ``anthropic``, ``openai``, ``engine`` (of kind ``engine``, default ``other``)
    or an engine's name (``sglang``, ``llama.cpp``, ``llama``, ``vllm``). A Target is returned as is. Raises
    ConfigError, listing the choices, for anything else."""
    if isinstance(name, Target):
        return name
    key = str(name).strip().lower()
    if key == TargetKind.ANTHROPIC:
        return AnthropicTarget(model)
    if key == TargetKind.OPENAI:
        return OpenAITarget(model)
    if key == TargetKind.ENGINE:
        return EngineTarget(engine or Engine.OTHER, model)
    try:
        return EngineTarget(parse_engine(key), model)
    except ConfigError:
        raise ConfigError(
            f"unknown target {name!r}; expected one of anthropic, openai, engine, or an engine: "
            + ", ".join(e.value for e in Engine)
        ) from None


def resolve_target(
    api: Api | str,
    *,
    setting: str | None = None,
    declared: str | Target | None = None,
    detected: Engine | None = None,
    model: str | None = None,
) -> Target:
    """The target for a session whose first request speaks ``api`` (see the module docstring for the order).
    ``model`` prices and rules every request as that model. Raises ConfigError for an unknown name or api."""
    for choice in (setting, declared):
        if choice is not None and choice != "auto":
            return target_named(choice, model=model, engine=detected)
    if detected is not None:
        return EngineTarget(detected, model)
    try:
        provider = Api(api).provider
    except ValueError:
        raise ConfigError(f"unknown api {api!r}; expected one of {', '.join(a.value for a in Api)}") from None
    return target_named(provider, model=model)


def cost_usd(usage: CacheUsage, provider: str | None, model: str | None) -> float | None:
    """Input-side USD of reported ``usage`` on ``provider`` (a target name) for ``model``: the target's own
    price (:meth:`Target.cost`; Anthropic writes at 1.25× (5m) or 2× (1h) and reads at 0.1× the base input
    price, OpenAI cached tokens at the model's cached price, from ``agentcache/data/models.toml``; a model the
    table does not know at the default model's prices). None for an engine or an unknown provider."""
    if provider is None:
        return None
    try:
        target = target_named(provider)
    except ConfigError:
        return None
    return target.cost(usage, model)
