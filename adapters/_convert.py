"""Wire bodies through OpenAI Chat Completions, the pivot of replay's conversions: Anthropic Messages ⇄ Chat,
Responses → Chat (each wire's :meth:`~agentcache.adapters.Wire.to_chat` / :meth:`~agentcache.adapters.Wire.from_chat`
call them).

Conversions are deterministic (the same recorded prefix gives the same converted prefix, so engine prefix caches
see what they would have seen) and never mutate their input. Cache markers (``cache_control``) are dropped: the
replayed endpoint is not the recorded provider. Wire shapes: Anthropic "Messages API" (``tool_use`` /
``tool_result`` blocks, ``input_schema``), OpenAI "Chat Completions" (``tool_calls`` with JSON-string
``arguments``, ``role: tool`` messages), OpenAI "Responses" (``function_call`` / ``function_call_output`` items).
"""

from __future__ import annotations

import json
from typing import Any

__all__ = ["DEFAULT_MAX_TOKENS", "anthropic_to_chat", "chat_to_anthropic", "responses_to_chat", "text_of"]

#: ``max_tokens`` for Anthropic bodies that were recorded without one (it is required there).
DEFAULT_MAX_TOKENS = 1024
_OPTIONS = ("temperature", "top_p", "metadata")


def text_of(content: Any) -> str:
    """The text of a string or a list of text parts/blocks."""
    if isinstance(content, str):
        return content
    if isinstance(content, list):
        return "".join(str(p.get("text", "")) for p in content if isinstance(p, dict) and "text" in p)
    return "" if content is None else json.dumps(content, sort_keys=True)


def _args(arguments: Any) -> Any:
    """Tool-call arguments as a JSON value (a string that is not JSON stays a string under ``_raw``)."""
    if isinstance(arguments, str):
        try:
            return json.loads(arguments) if arguments.strip() else {}
        except json.JSONDecodeError:
            return {"_raw": arguments}
    return arguments if arguments is not None else {}


# -- OpenAI Chat → Anthropic Messages ---------------------------------------------------------------------------


def _chat_part_to_block(part: Any) -> dict[str, Any] | None:
    if not isinstance(part, dict):
        return None
    if part.get("type") == "text":
        return {"type": "text", "text": str(part.get("text", ""))}
    if part.get("type") == "image_url":
        url = str((part.get("image_url") or {}).get("url", ""))
        if url.startswith("data:") and ";base64," in url:
            media, data = url[5:].split(";base64,", 1)
            return {"type": "image", "source": {"type": "base64", "media_type": media, "data": data}}
        return {"type": "image", "source": {"type": "url", "url": url}}
    return None


def _blocks(content: Any) -> list[dict[str, Any]]:
    if isinstance(content, str):
        return [{"type": "text", "text": content}] if content else []
    if isinstance(content, list):
        return [b for b in (_chat_part_to_block(p) for p in content) if b is not None]
    return []


def chat_to_anthropic(body: dict[str, Any]) -> dict[str, Any]:
    """An OpenAI Chat Completions body as an Anthropic Messages body."""
    system: list[str] = []
    messages: list[dict[str, Any]] = []

    def push(role: str, blocks: list[dict[str, Any]]) -> None:
        if messages and messages[-1]["role"] == role:
            messages[-1]["content"].extend(blocks)
        else:
            messages.append({"role": role, "content": list(blocks)})

    for msg in body.get("messages") or []:
        role = msg.get("role")
        if role in ("system", "developer"):
            system.append(text_of(msg.get("content")))
        elif role == "user":
            push("user", _blocks(msg.get("content")) or [{"type": "text", "text": "(empty)"}])
        elif role == "assistant":
            blocks = _blocks(msg.get("content"))
            for call in msg.get("tool_calls") or []:
                fn = call.get("function") or {}
                blocks.append(
                    {
                        "type": "tool_use",
                        "id": call.get("id"),
                        "name": fn.get("name"),
                        "input": _args(fn.get("arguments")),
                    }
                )
            push("assistant", blocks or [{"type": "text", "text": "(empty)"}])
        elif role == "tool":
            result = {
                "type": "tool_result",
                "tool_use_id": msg.get("tool_call_id"),
                "content": text_of(msg.get("content")),
            }
            push("user", [result])
    out: dict[str, Any] = {"model": body.get("model", ""), "max_tokens": DEFAULT_MAX_TOKENS}
    if system:
        out["system"] = "\n\n".join(system)
    out["messages"] = messages
    tools = [t.get("function", t) for t in body.get("tools") or [] if isinstance(t, dict)]
    if tools:
        out["tools"] = [
            {"name": t.get("name"), "description": t.get("description", ""), "input_schema": t.get("parameters") or {}}
            for t in tools
        ]
    choice = body.get("tool_choice")
    if choice is not None and tools:
        if isinstance(choice, dict):
            out["tool_choice"] = {"type": "tool", "name": (choice.get("function") or {}).get("name")}
        else:
            out["tool_choice"] = {"type": {"required": "any"}.get(choice, choice)}
    for key in _OPTIONS:
        if key in body:
            out[key] = body[key]
    limit = body.get("max_completion_tokens", body.get("max_tokens"))
    if limit is not None:
        out["max_tokens"] = limit
    if body.get("stop") is not None:
        stop = body["stop"]
        out["stop_sequences"] = [stop] if isinstance(stop, str) else list(stop)
    return out


# -- Anthropic Messages → OpenAI Chat ---------------------------------------------------------------------------


def _block_to_part(block: dict[str, Any]) -> dict[str, Any] | None:
    if block.get("type") == "text":
        return {"type": "text", "text": str(block.get("text", ""))}
    if block.get("type") == "image":
        src = block.get("source") or {}
        url = src.get("url") if src.get("type") == "url" else f"data:{src.get('media_type')};base64,{src.get('data')}"
        return {"type": "image_url", "image_url": {"url": url}}
    return None


def _content(parts: list[dict[str, Any]]) -> str | list[dict[str, Any]]:
    if all(p.get("type") == "text" for p in parts):
        return "".join(p["text"] for p in parts)
    return parts


def anthropic_to_chat(body: dict[str, Any]) -> dict[str, Any]:
    """An Anthropic Messages body as an OpenAI Chat Completions body."""
    messages: list[dict[str, Any]] = []
    system = body.get("system")
    if system:
        messages.append({"role": "system", "content": text_of(system)})
    for msg in body.get("messages") or []:
        content = msg.get("content")
        blocks = [{"type": "text", "text": content}] if isinstance(content, str) else list(content or [])
        if msg.get("role") == "assistant":
            text = "".join(str(b.get("text", "")) for b in blocks if b.get("type") == "text")
            out: dict[str, Any] = {"role": "assistant", "content": text or None}
            calls = [
                {"id": b.get("id"), "type": "function",
                 "function": {"name": b.get("name"), "arguments": json.dumps(b.get("input", {}), ensure_ascii=False)}}
                for b in blocks if b.get("type") == "tool_use"
            ]  # fmt: skip
            if calls:
                out["tool_calls"] = calls
            messages.append(out)
            continue
        parts: list[dict[str, Any]] = []
        for b in blocks:
            if b.get("type") == "tool_result":
                messages.append(
                    {"role": "tool", "tool_call_id": b.get("tool_use_id"), "content": text_of(b.get("content"))}
                )
            else:
                part = _block_to_part(b)
                if part is not None:
                    parts.append(part)
        if parts:
            messages.append({"role": "user", "content": _content(parts)})
    chat: dict[str, Any] = {"model": body.get("model", ""), "messages": messages}
    if body.get("tools"):
        chat["tools"] = [
            {"type": "function", "function": {"name": t.get("name"), "description": t.get("description", ""),
                                              "parameters": t.get("input_schema") or {}}}
            for t in body["tools"] if isinstance(t, dict) and "name" in t
        ]  # fmt: skip
    choice = body.get("tool_choice")
    if isinstance(choice, dict) and chat.get("tools"):
        kind = choice.get("type")
        if kind == "tool":
            chat["tool_choice"] = {"type": "function", "function": {"name": choice.get("name")}}
        else:
            chat["tool_choice"] = {"any": "required"}.get(str(kind), str(kind))
    for key in ("temperature", "top_p"):
        if key in body:
            chat[key] = body[key]
    if "max_tokens" in body:
        chat["max_tokens"] = body["max_tokens"]
    if body.get("stop_sequences"):
        chat["stop"] = list(body["stop_sequences"])
    return chat


# -- OpenAI Responses → OpenAI Chat -----------------------------------------------------------------------------


def responses_to_chat(body: dict[str, Any]) -> dict[str, Any]:
    """An OpenAI Responses body as a Chat Completions body (messages, function calls and their outputs)."""
    messages: list[dict[str, Any]] = []
    if body.get("instructions"):
        messages.append({"role": "system", "content": text_of(body["instructions"])})
    items = body.get("input")
    for item in [{"role": "user", "content": items}] if isinstance(items, str) else items or []:
        kind = item.get("type", "message")
        if kind == "message":
            role = "system" if item.get("role") == "developer" else item.get("role", "user")
            content = item.get("content")
            text = content if isinstance(content, str) else "".join(str(p.get("text", "")) for p in content or [])
            messages.append({"role": role, "content": text})
        elif kind == "function_call":
            call = {"id": item.get("call_id"), "type": "function",
                    "function": {"name": item.get("name"), "arguments": item.get("arguments", "{}")}}  # fmt: skip
            if messages and messages[-1]["role"] == "assistant" and not messages[-1].get("content"):
                messages[-1].setdefault("tool_calls", []).append(call)
            else:
                messages.append({"role": "assistant", "content": None, "tool_calls": [call]})
        elif kind == "function_call_output":
            messages.append(
                {"role": "tool", "tool_call_id": item.get("call_id"), "content": text_of(item.get("output"))}
            )
    chat: dict[str, Any] = {"model": body.get("model", ""), "messages": messages}
    tools = [t for t in body.get("tools") or [] if isinstance(t, dict) and t.get("type") == "function"]
    if tools:
        chat["tools"] = [
            {"type": "function", "function": {k: t[k] for k in ("name", "description", "parameters") if k in t}}
            for t in tools
        ]
    if "max_output_tokens" in body:
        chat["max_tokens"] = body["max_output_tokens"]
    for key in ("temperature", "top_p"):
        if key in body:
            chat[key] = body[key]
    return chat
