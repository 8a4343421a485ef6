"""OpenAI Responses API (``POST /v1/responses``) ⇄ canonical model.

``instructions`` is the system section; ``input`` is a string or a list of items (messages with
``role``, and typed items such as ``function_call``/``function_call_output``/``reasoning``), each item
one unit unless it is a message with a list ``content``. Request shape:
``openai.types.responses.ResponseCreateParams``; caching as in openai_chat.
"""

from __future__ import annotations

from collections.abc import Mapping
from typing import TYPE_CHECKING, Any, ClassVar

from agentcache._exceptions import InputError
from agentcache.model._build import BlockCache, Builder
from agentcache.model._canonical import Block, CanonicalRequest, Marker, dumps
from agentcache.model._causes import Section
from agentcache.model._plan import MarkerSpec, WirePlan
from agentcache.model._tokens import TokenCounter
from agentcache.model._usage_read import UsageForm, as_dict, read_field

from ._base import SYSTEM_ROLES, Wire
from ._convert import responses_to_chat
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
from .openai_chat import breakpoint_value, cache_mode_of, retention_of

if TYPE_CHECKING:
    from agentcache.model._usage_stream import UsageAccumulator

API = "openai.responses"
TOOL_LEVEL_OPTIONS = ("tool_choice", "parallel_tool_calls", "text")


def canonicalize(
    body: dict[str, Any], counter: TokenCounter | None = None, cache: BlockCache | None = None
) -> CanonicalRequest:
    """Canonical request of a Responses body. ``cache``: the session's block cache (unchanged items
    re-use their blocks). Raises InputError if malformed."""
    body = require_dict(body, API)
    b = Builder(API, str(body.get("model", "")), counter, cache)
    b.option("model", body.get("model"))
    for i, tool in enumerate(require_list(body.get("tools"), "tools")):
        b.add(f"tools[{i}]", "tool", tool, name=tool.get("name"))
    for opt in TOOL_LEVEL_OPTIONS:
        if opt in body:
            b.option(opt, body[opt])
    if body.get("instructions"):
        b.add("instructions", "system", body["instructions"])
    items = body.get("input")
    if isinstance(items, str):
        b.add("input", "message", items, env=dumps({"role": "user"}), message=0)
    elif isinstance(items, list):
        done = b.reuse_items("input", items)
        for i in range(done, len(items)):
            item = items[i]
            if (key := b.reuse(i, item)) is None:
                continue
            if not isinstance(item, dict):
                raise InputError(f"input[{i}] is not an object")
            role = item.get("role")
            section: Section = "system" if role in SYSTEM_ROLES else "message"
            env = dumps({k: v for k, v in item.items() if k != "content"}) if role else b""
            content = item.get("content")
            require_content(content, f"input[{i}].content")
            if role and isinstance(content, list) and content:
                for j, part in enumerate(content):
                    b.add(f"input[{i}].content[{j}]", section, part, env=env, message=i)
            elif role:
                b.add(f"input[{i}].content", section, content, env=env, message=i)
            else:
                b.add(f"input[{i}]", "message", item, message=i)
            b.store(key)
    elif items is not None:
        raise InputError("openai.responses 'input' must be a string or a list")
    return b.build(
        cache_key=body.get("prompt_cache_key"),
        retention=retention_of(body),
        extra={"previous_response_id": body.get("previous_response_id"), "cache_mode": cache_mode_of(body)},
    )


def set_markers(
    body: dict[str, Any], markers: tuple[tuple[str, MarkerSpec], ...], marked: frozenset[int] | None = None
) -> dict[str, Any]:
    """A copy of ``body`` whose ``prompt_cache_breakpoint`` parts are exactly ``markers`` (gpt-5.6+)."""
    key = "prompt_cache_breakpoint"
    wanted = wanted_items(markers, "input")
    units = content_units(body.get("input"), "input", key, wanted, strings=True, roles_only=True, marked=marked)
    return write_markers(body, units, markers, "prompt_cache_breakpoint", breakpoint_value, API)


def apply(body: dict[str, Any], plan: WirePlan) -> dict[str, Any]:
    """A new body with ``plan`` applied. A ``plan.diagnostics`` response id becomes
    ``prompt_cache_options.comparison_response_id`` (OpenAI prompt cache diagnostics), beside the client's own
    options, unless the client set one."""
    out = apply_common(body, plan, set_markers)
    if isinstance(plan.diagnostics, str):
        opts = out.get("prompt_cache_options")
        if opts is None or (isinstance(opts, dict) and "comparison_response_id" not in opts):
            out["prompt_cache_options"] = {**(opts or {}), "comparison_response_id": plan.diagnostics}
    return out


def reshaped(block: Block, marker: Marker | None) -> Block:
    """The canonical block of string unit ``block`` after a marker turned it into a text block (see
    :func:`~agentcache.adapters._wire.as_text_block`)."""
    return as_text_block(block, API, marker)


class OpenAIResponses(Wire):
    """The OpenAI Responses API's facts (see :class:`~agentcache.adapters._base.Wire`): ``usage.input_tokens`` is
    the whole prompt; a stream ends at ``response.completed`` / ``incomplete`` / ``failed`` ("Streaming events");
    the conversation is ``input`` (a string is one user message) less the system/developer messages."""

    api: ClassVar[str] = API
    route: ClassVar[str] = "/v1/responses"
    sdk: ClassVar[str] = "openai"
    sdk_path: ClassVar[str] = "/responses"
    sdk_resource: ClassVar[tuple[str, ...]] = ("responses",)
    items_field: ClassVar[str] = "input"
    usage_form: ClassVar[UsageForm] = "responses"
    terminal_events: ClassVar[frozenset[str]] = frozenset(
        {"response.completed", "response.incomplete", "response.failed"}
    )

    # body ⇄ canonical model: this module's functions
    canonicalize = staticmethod(canonicalize)
    apply = staticmethod(apply)
    reshaped = staticmethod(reshaped)

    #: Replay sends Chat or Messages; nothing is converted to Responses.
    replay_target: ClassVar[bool] = False

    def to_chat(self, body: dict[str, Any]) -> dict[str, Any]:
        """See :func:`~agentcache.adapters._convert.responses_to_chat`."""
        return responses_to_chat(body)

    def from_chat(self, chat: dict[str, Any]) -> dict[str, Any]:
        """Not supported (:attr:`replay_target` is false). Raises InputError."""
        raise InputError(f"cannot convert openai.chat requests to {API}")

    def stream_event(self, acc: UsageAccumulator, kind: Any, event: Any) -> None:
        """``.response.usage`` of the event carrying it, and the response's ``id`` and
        ``prompt_cache_diagnostics``."""
        response = read_field(event, "response")
        acc.usage_fields = as_dict(read_field(response, "usage")) or acc.usage_fields
        acc.note(response, "prompt_cache_diagnostics")

    def usage_doc(self, prompt: int, read: int, write: int = 0, output: int | None = None) -> dict[str, Any]:
        """``input_tokens`` is the whole prompt; the cache counts in ``input_tokens_details``."""
        out: dict[str, Any] = {
            "input_tokens": prompt,
            "input_tokens_details": {"cached_tokens": read, "cache_write_tokens": write},
        }
        if output is not None:
            out["output_tokens"] = output
        return out

    def conversation(self, body: Mapping[str, Any]) -> list[Any]:
        """``input`` less its system/developer messages; a string ``input`` is one item."""
        items = body.get("input")
        return [items] if isinstance(items, str) else super().conversation(body)


WIRE = OpenAIResponses()
