"""OpenHands event streams (best-effort reconstruction).

Shape: a JSON list of events ``{"id", "timestamp": ISO-8601, "source": "user"|"agent"|"environment",
"message", "action": str, "args": {...}}`` or ``{..., "observation": str, "content": str, "extras": {...},
"cause": id}``, optionally with ``"tool_call_metadata": {"function_name", "tool_call_id", "model_response",
"total_calls_in_response"}``. ``model_response`` is the raw LiteLLM (OpenAI-form) response of the LLM call
that produced the action, including its recorded ``usage``.

The request messages are not stored, so each one is rebuilt in event order: a placeholder system message,
user (and agent) ``message`` actions, each earlier LLM response as an assistant message with its
``tool_calls``, and each tool observation as a ``tool`` message. One ``openai.chat`` request per distinct
``model_response`` on an action (several actions of one response share one request):
``{"model": model_response["model"], "messages": [...]}``; ``usage`` = ``model_response["usage"]`` as
recorded; ``at`` = seconds since the first request's event. One session per file, named by the file stem.
"""

from __future__ import annotations

from datetime import UTC, datetime
from pathlib import Path
from typing import Any

from agentcache._exceptions import InputError
from agentcache.loaders._common import Loaded, problem, session_id
from agentcache.loaders._record import Record

SYSTEM_PLACEHOLDER = "OpenHands system prompt (not recorded)"


def _timestamp(event: dict[str, Any]) -> float | None:
    """The event's timestamp in POSIX seconds (naive = UTC), or None when absent or unparseable."""
    raw = event.get("timestamp")
    if not isinstance(raw, str):
        return None
    try:
        stamp = datetime.fromisoformat(raw)
    except ValueError:
        return None
    return (stamp if stamp.tzinfo else stamp.replace(tzinfo=UTC)).timestamp()


def _assistant(response: dict[str, Any]) -> dict[str, Any]:
    """The assistant message of a LiteLLM response, in wire form; ValueError when it has none."""
    choices = response.get("choices")
    if not isinstance(choices, list) or not choices or not isinstance(choices[0], dict):
        raise ValueError("model_response has no choices")
    msg = choices[0].get("message")
    if not isinstance(msg, dict):
        raise ValueError("model_response choice has no message")
    out: dict[str, Any] = {"role": "assistant", "content": msg.get("content") or ""}
    calls = [c for c in msg.get("tool_calls") or [] if isinstance(c, dict)]
    if calls:
        out["tool_calls"] = [
            {"id": c.get("id"), "type": c.get("type", "function"), "function": c.get("function")} for c in calls
        ]
    return out


def _observation_text(event: dict[str, Any]) -> str:
    """An observation's text as the agent sees it: content wrapped in the command metadata prefix/suffix."""
    text = event.get("content")
    text = text if isinstance(text, str) else str(event.get("message", ""))
    extras = event.get("extras")
    meta = extras.get("metadata") if isinstance(extras, dict) else None
    if isinstance(meta, dict):
        prefix, suffix = meta.get("prefix"), meta.get("suffix")
        text = (prefix if isinstance(prefix, str) else "") + text + (suffix if isinstance(suffix, str) else "")
    return text


def load_openhands(path: Path, doc: Any) -> Loaded:
    """Records for a parsed OpenHands event list; bad events become errors (``record`` = event index)."""
    src = str(path)
    if not isinstance(doc, list):
        raise InputError("OpenHands trajectory must be a JSON list of events", source=src)
    session = session_id(path)
    messages: list[dict[str, Any]] = [{"role": "system", "content": SYSTEM_PLACEHOLDER}]
    seen: set[str] = set()
    pending: list[tuple[int, dict[str, Any], dict[str, Any], float | None]] = []
    errors: list[InputError] = []
    for i, event in enumerate(doc):
        if not isinstance(event, dict):
            errors.append(InputError("event is not an object", source=src, record=i))
            continue
        meta = event.get("tool_call_metadata")
        meta = meta if isinstance(meta, dict) else {}
        response = meta.get("model_response")
        if "action" in event and isinstance(response, dict):
            key = str(response.get("id", f"event-{i}"))
            if key in seen:
                continue
            try:
                reply = _assistant(response)
            except Exception as exc:  # one bad step costs that step only
                errors.append(InputError(problem(exc), source=src, record=i))
                continue
            seen.add(key)
            body = {"model": str(response.get("model", "unknown")), "messages": list(messages)}
            pending.append((i, body, response, _timestamp(event)))
            messages.append(reply)
        elif event.get("action") == "message" and event.get("source") in ("user", "agent"):
            args = event.get("args")
            content = args.get("content") if isinstance(args, dict) else None
            role = "user" if event["source"] == "user" else "assistant"
            messages.append({"role": role, "content": content if isinstance(content, str) else ""})
        elif "observation" in event and isinstance(meta.get("tool_call_id"), str):
            tool: dict[str, Any] = {"role": "tool", "tool_call_id": meta["tool_call_id"]}
            if isinstance(meta.get("function_name"), str):
                tool["name"] = meta["function_name"]
            tool["content"] = _observation_text(event)
            messages.append(tool)
    start = next((ts for _, _, _, ts in pending if ts is not None), None)
    records = [
        Record(
            session=session,
            api="openai.chat",
            body=body,
            at=None if ts is None or start is None else round(ts - start, 6),
            usage=usage if isinstance(usage := response.get("usage"), dict) else None,
            source=src,
            index=i,
        )
        for i, body, response, ts in pending
    ]
    return records, errors
