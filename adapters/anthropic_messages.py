"""Anthropic Messages API (``POST /v1/messages``) ⇄ canonical model.

Prefix order tools → system → messages, per "Prompt caching" in the Anthropic docs
(platform.claude.com/docs/en/build-with-claude/prompt-caching, "What invalidates the cache": a change
of ``tool_choice`` or of thinking parameters invalidates message blocks but keeps tools and system;
so those options sit between system and messages). Markers are ``cache_control`` on tools, system
blocks and message content blocks, plus an optional top-level ``cache_control`` (automatic caching).
Request shape: ``anthropic.types.MessageCreateParams``.
"""

from __future__ import annotations

from typing import Any

from agentcache._exceptions import InputError
from agentcache.model._build import BlockCache, Builder
from agentcache.model._canonical import Block, CanonicalRequest, Marker, dumps
from agentcache.model._plan import KEEP, MarkerSpec, WirePlan
from agentcache.model._tokens import TokenCounter

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

API = "anthropic.messages"
#: Options that invalidate message blocks but not tools/system.
MESSAGE_LEVEL_OPTIONS = ("tool_choice", "thinking")


def canonicalize(
    body: dict[str, Any], counter: TokenCounter | None = None, cache: BlockCache | None = None
) -> CanonicalRequest:
    """Canonical request of an Anthropic Messages body. ``cache``: the session's block cache (unchanged
    units re-use their blocks). Raises InputError if malformed."""
    body = require_dict(body, API)
    messages = body.get("messages")
    if not isinstance(messages, list):
        raise InputError("anthropic.messages body needs a 'messages' list")
    b = Builder(API, str(body.get("model", "")), counter, cache)
    b.option("model", body.get("model"))
    tools = require_list(body.get("tools"), "tools")
    if (key := b.reuse("tools", tools)) is not None:
        for i, tool in enumerate(tools):
            b.add(f"tools[{i}]", "tool", tool, name=tool.get("name"))
        b.store(key)
    system = body.get("system")
    require_content(system, "system")
    if (key := b.reuse("system", system)) is not None:
        if isinstance(system, str):
            if system:
                b.add("system", "system", system)
        elif isinstance(system, list):
            for i, blk in enumerate(system):
                b.add(f"system[{i}]", "system", blk)
        b.store(key)
    for opt in MESSAGE_LEVEL_OPTIONS:
        if opt in body:
            b.option(opt, body[opt])
    done = b.reuse_items("messages", messages)
    for i in range(done, len(messages)):
        msg = messages[i]
        if (key := b.reuse(i, msg)) is None:
            continue
        if not isinstance(msg, dict) or "role" not in msg:
            raise InputError(f"messages[{i}] is not a message object with a role")
        # The message's other keys (Claude Code's ``output_config``) are part of its meaning: in its envelope.
        env = dumps({"role": msg["role"], **{k: v for k, v in msg.items() if k not in ("role", "content")}})
        content = msg.get("content")
        require_content(content, f"messages[{i}].content")
        if isinstance(content, list) and content:
            for j, blk in enumerate(content):
                b.add(f"messages[{i}].content[{j}]", "message", blk, env=env, message=i)
        else:
            b.add(f"messages[{i}].content", "message", content, env=env, message=i)
        b.store(key)
    top = body.get("cache_control")
    top_marker = Marker(str(top.get("ttl", "5m")), top) if isinstance(top, dict) else None
    return b.build(top_marker=top_marker)


def _cache_control(ttl: str) -> dict[str, str]:
    return {"type": "ephemeral"} if ttl == "5m" else {"type": "ephemeral", "ttl": ttl}


def set_markers(
    body: dict[str, Any], markers: tuple[tuple[str, MarkerSpec], ...], marked: frozenset[int] | None = None
) -> dict[str, Any]:
    """A copy of ``body`` whose block markers are exactly ``markers`` (``(path, ttl)`` pairs)."""
    key = "cache_control"
    tools_wanted = wanted_items(markers, "tools")
    units: list[tuple[str, Any]] = [
        (f"tools[{i}]", t)
        for i, t in enumerate(body.get("tools") or [])
        if i in tools_wanted or (isinstance(t, dict) and key in t)
    ]
    system = body.get("system")
    if isinstance(system, list):
        units += [(f"system[{i}]", blk) for i, blk in enumerate(system)]
    elif isinstance(system, str) and system:
        units.append(("system", system))
    units += content_units(
        body.get("messages"), "messages", key, wanted_items(markers, "messages"), strings=False, marked=marked
    )
    return write_markers(body, units, markers, key, _cache_control, API)


def apply(body: dict[str, Any], plan: WirePlan) -> dict[str, Any]:
    """A new body with ``plan`` applied (``body`` is not mutated). ``plan.diagnostics`` becomes
    ``diagnostics.previous_message_id`` (Anthropic cache diagnostics) unless the client sent ``diagnostics``."""
    out = apply_common(body, plan, set_markers)
    if plan.diagnostics is not KEEP and "diagnostics" not in out:
        out["diagnostics"] = {"previous_message_id": plan.diagnostics}
    return out


def reshaped(block: Block, marker: Marker | None) -> Block:
    """The canonical block of string unit ``block`` after a marker turned it into a text block (see
    :func:`~agentcache.adapters._wire.as_text_block`)."""
    return as_text_block(block, API, marker)
