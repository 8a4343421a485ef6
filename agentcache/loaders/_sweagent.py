"""SWE-agent ``.traj`` files (v1, a JSON object).

Shape: ``{"environment", "trajectory": [step, ...], "history": [message, ...], "info", "replay_config"?}``.
A step is ``{"action", "observation", "response", "thought", "state", "execution_time", "messages"?}``; a
message is ``{"role", "content", "agent", "message_type", "thought"?, "action"?, "tool_calls"?,
"tool_call_ids"?}``.

Function-calling form (steps carry ``messages``, the exact list sent for that call): one request per step.
Older form: one request per assistant message of ``history``, holding the messages before it. Either way the
messages are reduced to the wire form SWE-agent sends (``_history_to_messages``): only ``role``, ``content``,
``tool_calls``, ``tool_call_id``, ``name`` and ``cache_control`` are kept, in their recorded order, and a
tool message's ``tool_call_ids: [id, ...]`` becomes ``tool_call_id: id``. Content (a string or a list of
``{"type": "text", "text"}`` parts) is kept as is. Body: ``{"model": <replay_config agent.model.name, or
"unknown">, "messages": [...]}``; api ``openai.chat``; one session per file, named by the file stem.
"""

from __future__ import annotations

import json
from pathlib import Path
from typing import Any

from agentcache._exceptions import InputError
from agentcache.loaders._common import Loaded, problem, session_id
from agentcache.loaders._record import Record

WIRE_KEYS = frozenset({"role", "content", "tool_calls", "tool_call_id", "name", "cache_control"})


def model_name(doc: dict[str, Any]) -> str:
    """``replay_config.agent.model.name`` (``replay_config`` may be a JSON string), else ``"unknown"``."""
    config: Any = doc.get("replay_config")
    if isinstance(config, str):
        try:
            config = json.loads(config)
        except json.JSONDecodeError:
            return "unknown"
    agent = config.get("agent") if isinstance(config, dict) else None
    model = agent.get("model") if isinstance(agent, dict) else None
    name = model.get("name") if isinstance(model, dict) else None
    return name if isinstance(name, str) and name else "unknown"


def wire_message(msg: dict[str, Any]) -> dict[str, Any]:
    """The message as SWE-agent puts it on the wire (see module docstring)."""
    out: dict[str, Any] = {}
    for key, value in msg.items():
        if key in WIRE_KEYS:
            out[key] = value
        elif key == "tool_call_ids" and msg.get("role") == "tool" and "tool_call_id" not in msg and value:
            out["tool_call_id"] = value[0] if isinstance(value, list) else value
    return out


def _messages(raw: Any, what: str) -> list[dict[str, Any]]:
    """Validated wire messages of a list; raises ``ValueError`` naming ``what`` when malformed."""
    if not isinstance(raw, list):
        raise ValueError(f"{what} is not a list")
    for j, msg in enumerate(raw):
        if not isinstance(msg, dict) or not isinstance(msg.get("role"), str):
            raise ValueError(f"{what}[{j}] is not a message with a role")
    return [wire_message(m) for m in raw]


def load_sweagent(path: Path, doc: Any) -> Loaded:
    """Records for a parsed ``.traj`` object; malformed steps become errors (``record`` = step index)."""
    src = str(path)
    if not isinstance(doc, dict):
        raise InputError("SWE-agent .traj must be a JSON object", source=src)
    steps = doc.get("trajectory")
    model = model_name(doc)
    session = session_id(path)
    records: list[Record] = []
    errors: list[InputError] = []
    if isinstance(steps, list) and any(isinstance(s, dict) and "messages" in s for s in steps):
        for i, step in enumerate(steps):
            try:
                if not isinstance(step, dict):
                    raise ValueError("step is not an object")
                msgs = _messages(step.get("messages"), "messages")
            except Exception as exc:  # one bad step costs that step only
                errors.append(InputError(problem(exc), source=src, record=i))
                continue
            body = {"model": model, "messages": msgs}
            records.append(Record(session=session, api="openai.chat", body=body, source=src, index=i))
        return records, errors
    try:
        history = _messages(doc.get("history"), "history")
    except ValueError as exc:
        raise InputError(f"no per-step messages and no usable history: {exc}", source=src) from exc
    for i, msg in enumerate(history):
        if msg["role"] == "assistant":
            body = {"model": model, "messages": history[:i]}
            records.append(Record(session=session, api="openai.chat", body=body, source=src, index=len(records)))
    return records, errors
