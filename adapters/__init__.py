"""Wire-format adapters: a wire body in, a :class:`~agentcache.CanonicalRequest` out, and decisions
(:class:`~agentcache.model._plan.WirePlan`) applied back onto a copy of the wire body.

One module per wire format; each exposes ``API``, ``canonicalize(body)`` and ``apply(body, plan)``.
"""

from __future__ import annotations

from types import ModuleType
from typing import Any

from agentcache._exceptions import ConfigError
from agentcache.model._build import BlockCache
from agentcache.model._canonical import Block, CanonicalRequest, Marker
from agentcache.model._plan import WirePlan
from agentcache.model._tokens import TokenCounter

from . import anthropic_messages, openai_chat, openai_responses

_ADAPTERS: dict[str, ModuleType] = {
    anthropic_messages.API: anthropic_messages,
    openai_chat.API: openai_chat,
    openai_responses.API: openai_responses,
}


def adapter_for(api: str) -> ModuleType:
    """The adapter module for ``api`` (``anthropic.messages``, ``openai.chat``, ``openai.responses``).

    Raises ConfigError for an unknown api.
    """
    try:
        return _ADAPTERS[api]
    except KeyError:
        raise ConfigError(f"unknown api {api!r}; expected one of {sorted(_ADAPTERS)}") from None


def canonicalize(
    api: str, body: dict[str, Any], counter: TokenCounter | None = None, cache: BlockCache | None = None
) -> CanonicalRequest:
    """Canonical request for a wire ``body`` of format ``api``. ``cache``: a session's
    :class:`~agentcache.model._canonical.BlockCache`, so unchanged messages re-use their blocks.
    Raises InputError on a malformed body."""
    mod = adapter_for(api)
    result: CanonicalRequest = mod.canonicalize(body, counter=counter, cache=cache)
    return result


def reshaped(api: str, block: Block, marker: Marker | None) -> Block:
    """The canonical block of the string unit ``block`` of ``api`` once a marker turned it into a text block."""
    result: Block = adapter_for(api).reshaped(block, marker)
    return result


def apply(api: str, body: dict[str, Any], plan: WirePlan) -> dict[str, Any]:
    """A new wire body with ``plan`` applied; ``body`` itself is never mutated."""
    mod = adapter_for(api)
    result: dict[str, Any] = mod.apply(body, plan)
    return result


__all__ = ["WirePlan", "adapter_for", "apply", "canonicalize", "reshaped"]
