"""The small vocabularies every layer shares: wire APIs, cache targets and engines.

String enums, so JSON documents, logs and metrics keep the plain values (``"anthropic.messages"``,
``"engine"``, ``"llama.cpp"``) and comparisons with those strings still hold.
"""

from __future__ import annotations

from enum import StrEnum

from .._exceptions import ConfigError

__all__ = ["Api", "Engine", "TargetKind", "engine_aliases", "parse_engine"]


class Api(StrEnum):
    """A wire format agentcache reads and writes (one adapter each, ``agentcache.adapters``)."""

    ANTHROPIC_MESSAGES = "anthropic.messages"
    OPENAI_CHAT = "openai.chat"
    OPENAI_RESPONSES = "openai.responses"

    @property
    def provider(self) -> TargetKind:
        """The provider whose API this is (the rules a gateway speaking it gets)."""
        return TargetKind.ANTHROPIC if self is Api.ANTHROPIC_MESSAGES else TargetKind.OPENAI


class TargetKind(StrEnum):
    """Whose cache rules a session's requests are planned for: a provider's prompt cache, or a local engine's
    prefix cache (repairs and session pinning only)."""

    ANTHROPIC = "anthropic"
    OPENAI = "openai"
    ENGINE = "engine"


class Engine(StrEnum):
    """A self-hosted inference engine. ``other`` is an OpenAI-compatible server agentcache has no rules for."""

    SGLANG = "sglang"
    LLAMA_CPP = "llama.cpp"
    VLLM = "vllm"
    OTHER = "other"


#: Accepted spellings of each engine (lower case).
_ENGINE_ALIASES: dict[str, Engine] = {
    "sglang": Engine.SGLANG,
    "llama.cpp": Engine.LLAMA_CPP,
    "llama": Engine.LLAMA_CPP,
    "llamacpp": Engine.LLAMA_CPP,
    "llama-cpp": Engine.LLAMA_CPP,
    "llama_cpp": Engine.LLAMA_CPP,
    "vllm": Engine.VLLM,
    "other": Engine.OTHER,
}


def engine_aliases() -> str:
    """The accepted spellings other than the canonical ones, for help and error text
    (``llama, llamacpp, llama-cpp, llama_cpp``)."""
    return ", ".join(k for k, e in _ENGINE_ALIASES.items() if k != e.value)


def parse_engine(name: str) -> Engine:
    """The engine named ``name`` (canonical spelling or an alias such as ``llama``; case and surrounding blanks
    ignored). The one place engine names are normalised: the CLI, the proxy config, ``serve`` and the settings'
    ``target`` all call it. Raises ConfigError, listing the choices, for anything else."""
    engine = _ENGINE_ALIASES.get(name.strip().lower())
    if engine is None:
        choices = ", ".join(e.value for e in Engine)
        raise ConfigError(f"unknown engine {name!r}; expected one of {choices} (aliases: {engine_aliases()})")
    return engine


class Breakdown(StrEnum):
    """A breakdown table of an audit of agents' logs (``audit --by``): calls grouped per day (UTC), project
    (working directory), model, client (the agent CLI) or session."""

    DAY = "day"
    PROJECT = "project"
    MODEL = "model"
    CLIENT = "client"
    SESSION = "session"
