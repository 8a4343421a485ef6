"""OpenAI Chat Completions (``POST /v1/chat/completions``) ⇄ canonical model.

OpenAI caches the longest previously seen prefix automatically (platform.openai.com/docs/guides/
prompt-caching): tools and messages in order; ``prompt_cache_key`` partitions the cache (a routing
hint, kept outside the block chain). System and developer messages form the ``system`` section.
Request shape: ``openai.types.chat.CompletionCreateParams``.
"""

from __future__ import annotations

from typing import Any, ClassVar

from agentcache._exceptions import InputError
from agentcache.model._build import BlockCache, Builder
from agentcache.model._canonical import Block, CanonicalRequest, Marker, dumps
from agentcache.model._causes import Section
from agentcache.model._plan import MarkerSpec, WirePlan
from agentcache.model._tokens import TokenCounter

from ._base import SYSTEM_ROLES, Wire
from ._wire import (
    apply_common,
    as_text_block,
    content_units,
    require_content,
    require_dict,
    require_list,
    wanted_items,
    write_markers,
)

API = "openai.chat"
#: Options rendered with the tool definitions, ahead of the messages.
TOOL_LEVEL_OPTIONS = ("tool_choice", "parallel_tool_calls", "response_format")


def retention_of(body: dict[str, Any]) -> str | None:
    """``prompt_cache_retention`` (deprecated) or ``prompt_cache_options.ttl``/``mode``, if given."""
    opts = body.get("prompt_cache_options")
    if isinstance(opts, dict):
        return str(opts.get("ttl") or opts.get("mode") or "") or None
    value = body.get("prompt_cache_retention")
    return str(value) if value else None


def cache_mode_of(body: dict[str, Any]) -> str:
    """``prompt_cache_options.mode``: ``implicit`` (default) or ``explicit``."""
    opts = body.get("prompt_cache_options")
    return str(opts.get("mode") or "implicit") if isinstance(opts, dict) else "implicit"


def canonicalize(
    body: dict[str, Any], counter: TokenCounter | None = None, cache: BlockCache | None = None
) -> CanonicalRequest:
    """Canonical request of a Chat Completions body. ``cache``: the session's block cache (unchanged
    units re-use their blocks). Raises InputError if malformed."""
    body = require_dict(body, API)
    messages = body.get("messages")
    if not isinstance(messages, list):
        raise InputError("openai.chat body needs a 'messages' list")
    b = Builder(API, str(body.get("model", "")), counter, cache)
    b.option("model", body.get("model"))
    tools = require_list(body.get("tools"), "tools")
    if (key := b.reuse("tools", tools)) is not None:
        for i, tool in enumerate(tools):
            fn = tool.get("function")
            name = fn.get("name") if isinstance(fn, dict) else tool.get("name")
            b.add(f"tools[{i}]", "tool", tool, name=name)
        b.store(key)
    for opt in TOOL_LEVEL_OPTIONS:
        if opt in body:
            b.option(opt, body[opt])
    done = b.reuse_items("messages", messages)
    for i in range(done, len(messages)):
        msg = messages[i]
        if (key := b.reuse(i, msg)) is None:
            continue
        if not isinstance(msg, dict) or "role" not in msg:
            raise InputError(f"messages[{i}] is not a message object with a role")
        section: Section = "system" if msg["role"] in SYSTEM_ROLES else "message"
        env = dumps({k: v for k, v in msg.items() if k not in ("content", "tool_calls")})
        content = msg.get("content")
        require_content(content, f"messages[{i}].content")
        calls = require_list(msg.get("tool_calls"), f"messages[{i}].tool_calls")
        if isinstance(content, list) and content:
            for j, part in enumerate(content):
                b.add(f"messages[{i}].content[{j}]", section, part, env=env, message=i)
        elif content not in (None, "") or not calls:
            b.add(f"messages[{i}].content", section, content, env=env, message=i)
        for j, call in enumerate(calls):
            b.add(f"messages[{i}].tool_calls[{j}]", section, call, env=env, message=i)
        b.store(key)
    return b.build(
        cache_key=body.get("prompt_cache_key"), retention=retention_of(body), extra={"cache_mode": cache_mode_of(body)}
    )


def breakpoint_value(ttl: str) -> dict[str, str]:
    """The ``prompt_cache_breakpoint`` object for a marker (TTL left to ``prompt_cache_options``)."""
    return {"mode": "explicit"}


def set_markers(
    body: dict[str, Any], markers: tuple[tuple[str, MarkerSpec], ...], marked: frozenset[int] | None = None
) -> dict[str, Any]:
    """A copy of ``body`` whose ``prompt_cache_breakpoint`` parts are exactly ``markers`` (gpt-5.6+)."""
    key = "prompt_cache_breakpoint"
    wanted = wanted_items(markers, "messages")
    units = content_units(body.get("messages"), "messages", key, wanted, strings=True, marked=marked)
    return write_markers(body, units, markers, "prompt_cache_breakpoint", breakpoint_value, API)


def apply(body: dict[str, Any], plan: WirePlan) -> dict[str, Any]:
    """A new body with ``plan`` applied."""
    return apply_common(body, plan, set_markers)


def reshaped(block: Block, marker: Marker | None) -> Block:
    """The canonical block of string unit ``block`` after a marker turned it into a text block (see
    :func:`~agentcache.adapters._wire.as_text_block`)."""
    return as_text_block(block, API, marker)


class OpenAIChat(Wire):
    """The OpenAI Chat Completions API's facts (see :class:`~agentcache.adapters._base.Wire`, whose defaults are
    this API's: ``usage.prompt_tokens``, the ``[DONE]`` sentinel, OpenAI's error documents, ``messages`` less the
    system/developer ones as the conversation)."""

    api: ClassVar[str] = API
    route: ClassVar[str] = "/v1/chat/completions"
    replay_name: ClassVar[str | None] = "openai"
    sdk: ClassVar[str] = "openai"
    sdk_path: ClassVar[str] = "/chat/completions"
    sdk_resource: ClassVar[tuple[str, ...]] = ("chat", "completions")

    # body ⇄ canonical model: this module's functions
    canonicalize = staticmethod(canonicalize)
    apply = staticmethod(apply)
    reshaped = staticmethod(reshaped)


WIRE = OpenAIChat()
