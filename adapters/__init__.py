"""Wire-format adapters: a wire body in, a :class:`~agentcache.CanonicalRequest` out, and decisions
(:class:`~agentcache.model._plan.WirePlan`) applied back onto a copy of the wire body.

One module per wire format; each exposes ``API``, ``canonicalize(body)`` and ``apply(body, plan)``, and ``WIRE``,
its :class:`~agentcache.adapters._base.Wire`: every fact of that API (usage, error bodies, conversation items...),
reached by :func:`wire_for`. Nothing outside this package branches on the API.
"""

from __future__ import annotations

from types import ModuleType
from typing import Any

from agentcache._exceptions import ConfigError
from agentcache.model._build import BlockCache
from agentcache.model._canonical import Block, CanonicalRequest, Marker
from agentcache.model._plan import WirePlan
from agentcache.model._tokens import TokenCounter

from . import anthropic_messages, openai_chat, openai_responses, sglang_generate
from ._base import Endpoint, ErrorStyle, Wire

#: Every wire, in the order routes and tables list them.
WIRES: tuple[Wire, ...] = (anthropic_messages.WIRE, openai_chat.WIRE, openai_responses.WIRE)
_WIRES: dict[str, Wire] = {w.api: w for w in WIRES}
#: What replay can send, in the order ``agentcache replay --api`` lists them.
REPLAY_ENDPOINTS: tuple[Endpoint, ...] = (openai_chat.WIRE, anthropic_messages.WIRE, sglang_generate.ENDPOINT)
_ENDPOINTS: dict[str, Endpoint] = {e.api: e for e in REPLAY_ENDPOINTS}
_ROUTES: dict[str, Wire] = {w.route: w for w in WIRES}
#: The wire whose error documents each error style is (Responses' are Chat's).
_ERROR_WIRES: dict[str, Wire] = {w.error_style: w for w in reversed(WIRES)}

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


def wire_for(api: str) -> Wire:
    """The :class:`~agentcache.adapters._base.Wire` of ``api`` (``anthropic.messages``, ``openai.chat``,
    ``openai.responses``). Raises ConfigError for an unknown api."""
    try:
        return _WIRES[api]
    except KeyError:
        raise ConfigError(f"unknown api {api!r}; expected one of {sorted(_WIRES)}") from None


def endpoint_for(api: str) -> Endpoint:
    """The :class:`~agentcache.adapters._base.Endpoint` replay sends ``api`` requests through (``openai.chat``,
    ``anthropic.messages``, ``sglang.generate``). Raises ConfigError for another."""
    try:
        return _ENDPOINTS[api]
    except KeyError:
        raise ConfigError(f"cannot send {api!r} requests; expected one of {sorted(_ENDPOINTS)}") from None


def find_wire(api: str) -> Wire | None:
    """The wire of ``api``, else None."""
    return _WIRES.get(api)


def usage_wire(api: str) -> Wire:
    """The wire whose responses' usage ``api``'s are read as: its own, else Chat's (the format
    OpenAI-compatible servers answer in, SGLang's ``/generate`` replayed as Chat included)."""
    return _WIRES.get(api, openai_chat.WIRE)


def wire_for_route(path: str) -> Wire | None:
    """The wire whose proxy route is ``path`` (a trailing ``/`` ignored), else None."""
    return _ROUTES.get(path.rstrip("/") or "/")


def error_wire(style: ErrorStyle) -> Wire:
    """The wire whose error documents are in ``style`` (``anthropic`` / ``openai``)."""
    return _ERROR_WIRES[style]


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


__all__ = [
    "REPLAY_ENDPOINTS",
    "WIRES",
    "Endpoint",
    "ErrorStyle",
    "Wire",
    "WirePlan",
    "adapter_for",
    "apply",
    "canonicalize",
    "endpoint_for",
    "error_wire",
    "find_wire",
    "reshaped",
    "usage_wire",
    "wire_for",
    "wire_for_route",
]
