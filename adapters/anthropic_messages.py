"""Anthropic Messages API (``POST /v1/messages``) ⇄ canonical model.

Prefix order tools → system → messages, per "Prompt caching" in the Anthropic docs
(platform.claude.com/docs/en/build-with-claude/prompt-caching, "What invalidates the cache": a change
of ``tool_choice`` or of thinking parameters invalidates message blocks but keeps tools and system;
so those options sit between system and messages). Markers are ``cache_control`` on tools, system
blocks and message content blocks, plus an optional top-level ``cache_control`` (automatic caching).
Request shape: ``anthropic.types.MessageCreateParams``.
"""

from __future__ import annotations

import json
from collections.abc import Callable, Mapping
from typing import TYPE_CHECKING, Any, ClassVar

from agentcache._exceptions import InputError
from agentcache.model._build import BlockCache, Builder
from agentcache.model._canonical import Block, CanonicalRequest, Marker, dumps
from agentcache.model._plan import KEEP, MarkerSpec, WirePlan
from agentcache.model._tokens import TokenCounter
from agentcache.model._usage_read import UsageForm, as_dict, read_field

from ._base import ErrorStyle, Wire
from ._convert import anthropic_to_chat, chat_to_anthropic
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

if TYPE_CHECKING:
    from agentcache.model._usage_stream import UsageAccumulator

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


def merge_anthropic_usage(base: Mapping[str, Any] | None, delta: Any) -> dict[str, Any]:
    """Anthropic stream usage: ``message_start``'s ``usage`` updated with the non-null fields of a
    ``message_delta``'s cumulative ``usage`` (as the SDK's own accumulator does)."""
    out = dict(base or {})
    for k, v in (as_dict(delta) or {}).items():
        if v is not None:
            out[k] = v
    return out


#: Anthropic error ``type`` per status code (the Messages API errors page).
ERROR_TYPES: dict[int, str] = {
    400: "invalid_request_error",
    401: "authentication_error",
    403: "permission_error",
    404: "not_found_error",
    413: "request_too_large",
    429: "rate_limit_error",
    500: "api_error",
    502: "api_error",
    503: "overloaded_error",
    504: "timeout_error",
}


class AnthropicMessages(Wire):
    """The Anthropic Messages API's facts (see :class:`~agentcache.adapters._base.Wire`): ``usage.input_tokens``
    is the uncached remainder; a stream ends at ``message_stop`` (Messages "Streaming"); errors are
    ``{"type": "error", "error": {"type", "message"}}``; the conversation is every message, ``system`` a field."""

    api: ClassVar[str] = API
    route: ClassVar[str] = "/v1/messages"
    replay_name: ClassVar[str | None] = "anthropic"
    sdk: ClassVar[str] = "anthropic"
    sdk_path: ClassVar[str] = "/v1/messages"
    sdk_resource: ClassVar[tuple[str, ...]] = ("messages",)
    sdk_methods: ClassVar[tuple[str, ...]] = ("create", "stream")
    usage_form: ClassVar[UsageForm] = "anthropic"
    terminal_events: ClassVar[frozenset[str]] = frozenset({"message_stop"})
    moves_volatile: ClassVar[bool] = True
    keeps_warm: ClassVar[bool] = True
    error_style: ClassVar[ErrorStyle] = "anthropic"

    # body ⇄ canonical model: this module's functions
    canonicalize = staticmethod(canonicalize)
    apply = staticmethod(apply)
    reshaped = staticmethod(reshaped)

    def replay_headers(self, api_key: str | None) -> dict[str, str]:
        """``anthropic-version`` and, with a key, ``x-api-key``."""
        headers = {"anthropic-version": "2023-06-01"}
        if api_key:
            headers["x-api-key"] = api_key
        return headers

    def replay_body(
        self, body: dict[str, Any], max_tokens: int, *, want_ids: bool, token_ids: Callable[[dict[str, Any]], list[int]]
    ) -> dict[str, Any]:
        """Streamed, ``max_tokens`` (usage is always in the stream; no token ids)."""
        body.pop("max_completion_tokens", None)
        body["max_tokens"] = max_tokens
        body["stream"] = True
        return body

    def stream_error(self, event: Mapping[str, Any]) -> bool:
        """An ``error`` event."""
        return event.get("type") == "error"

    def first_output(self, event: Mapping[str, Any]) -> bool:
        """A ``content_block_delta``, or the start of a ``tool_use`` block."""
        if event.get("type") == "content_block_delta":
            return True
        return (
            event.get("type") == "content_block_start" and (event.get("content_block") or {}).get("type") == "tool_use"
        )

    def generated(self, event: Mapping[str, Any]) -> tuple[str, list[int]]:
        """A ``content_block_delta``'s text (or tool input JSON); no ids."""
        delta = event.get("delta") if event.get("type") == "content_block_delta" else None
        if isinstance(delta, dict):
            return str(delta.get("text") or delta.get("partial_json") or ""), []
        return "", []

    def to_chat(self, body: dict[str, Any]) -> dict[str, Any]:
        """See :func:`~agentcache.adapters._convert.anthropic_to_chat`."""
        return anthropic_to_chat(body)

    def from_chat(self, chat: dict[str, Any]) -> dict[str, Any]:
        """See :func:`~agentcache.adapters._convert.chat_to_anthropic`."""
        return chat_to_anthropic(chat)

    def stream_event(self, acc: UsageAccumulator, kind: Any, event: Any) -> None:
        """``message_start.message.usage``, updated by each ``message_delta.usage`` (cumulative; non-null fields
        win: :func:`merge_anthropic_usage`), and the message's ``id`` and ``diagnostics``."""
        if kind == "message_start":
            message = read_field(event, "message")
            acc.usage_fields = merge_anthropic_usage(None, read_field(message, "usage"))
            acc.note(message, "diagnostics")
        elif kind == "message_delta":
            acc.usage_fields = merge_anthropic_usage(acc.usage_fields, read_field(event, "usage"))
            acc.note(event, "diagnostics")

    def usage_doc(self, prompt: int, read: int, write: int = 0, output: int | None = None) -> dict[str, Any]:
        """``input_tokens`` is the uncached remainder, beside ``cache_read_input_tokens`` and
        ``cache_creation_input_tokens``."""
        out: dict[str, Any] = {"input_tokens": max(prompt - read - write, 0), "cache_read_input_tokens": read}
        out["cache_creation_input_tokens"] = write
        if output is not None:
            out["output_tokens"] = output
        return out

    def error_body(self, status: int, message: str) -> bytes:
        """``{"type": "error", "error": {"type": ..., "message": ...}}`` (:data:`ERROR_TYPES`)."""
        kind = ERROR_TYPES.get(status, "api_error" if status >= 500 else "invalid_request_error")
        return json.dumps({"type": "error", "error": {"type": kind, "message": message}}).encode()

    def conversation(self, body: Mapping[str, Any]) -> list[Any]:
        """Every message (the system prompt is the ``system`` field). Raises InputError without a list."""
        items = body.get("messages")
        if not isinstance(items, list):
            raise InputError(f"{API} body needs a list of messages")
        return items

    def routing_key(self, body: Mapping[str, Any]) -> Any:
        """None: the API has no routing key (a ``prompt_cache_key`` in the body is not the client's)."""
        return None

    def prefix_units(self, body: Mapping[str, Any]) -> list[Any]:
        """``tools`` and ``system``."""
        return [body.get("tools"), body.get("system")]


WIRE = AnthropicMessages()
