"""Volatile system text: the suggested cache-friendly form, and the opt-in move.

A line of the system prompt that changes between requests only in volatile tokens (a clock, a date,
a UUID: :mod:`agentcache.model._volatile`) breaks the cached prefix at that line on every request. The
cache-friendly form keeps the stable text in the prefix and gives the changing line after the last
breakpoint, in the newest user turn.

:func:`move_volatile` does that move, for Anthropic Messages bodies, once a line has been *seen*
changing in this session (``VolatileMemory.patterns``). It changes what the model is told (the line
moves from the system prompt to the user turn where it was current), so it is **off by default**
(setting ``move_volatile``). History stays verbatim: a line moved into a user turn is re-inserted into
that same turn, with the value it had then, on every later request.
"""

from __future__ import annotations

from collections.abc import Mapping
from dataclasses import dataclass, field
from typing import Any

from agentcache.model._volatile import VolatileSpan, mask

MOVED_PREFIX = "[moved from the system prompt by agentcache] "


def suggestion(span: VolatileSpan, where: str) -> str:
    """A one-line suggestion for a ``system.volatile`` break at ``where``."""
    kinds = ", ".join(span.kinds)
    return (
        f"{where} changes only in a {kinds} value ({span.text!r}): keep the stable text in the cached prefix "
        "and give the current value after the last cache breakpoint (e.g. in the newest user turn), or "
        "freeze it per session"
    )


@dataclass(frozen=True, slots=True)
class VolatileMemory:
    """Per session: masked lines seen changing, the system lines last seen, and the moved text per
    message index (immutable: :func:`move_volatile` returns the next one)."""

    patterns: frozenset[str] = frozenset()
    last_lines: tuple[tuple[str, ...], ...] = ()
    moved: Mapping[int, str] = field(default_factory=dict)


def _system_texts(system: Any) -> list[str]:
    if isinstance(system, str):
        return [system]
    if isinstance(system, list):
        return [b.get("text", "") if isinstance(b, dict) else "" for b in system]
    return []


def learn(memory: VolatileMemory, body: Mapping[str, Any]) -> VolatileMemory:
    """``memory`` after seeing ``body``'s system prompt: the lines that changed only in volatile tokens
    are added to the patterns."""
    lines = tuple(tuple(t.split("\n")) for t in _system_texts(body.get("system")))
    patterns = set(memory.patterns)
    for old_block, new_block in zip(memory.last_lines, lines, strict=False):
        for old, new in zip(old_block, new_block, strict=False):
            if old != new and mask(old) == mask(new):
                patterns.add(mask(new))
    return VolatileMemory(frozenset(patterns), lines, memory.moved)


def move_volatile(body: dict[str, Any], memory: VolatileMemory) -> tuple[dict[str, Any], VolatileMemory]:
    """``(body, memory)``: ``body`` with the known-volatile system lines moved to the newest user turn (a new
    body; the same object when there is nothing to move) and the memory after it. Pure."""
    memory = learn(memory, body)
    if not memory.patterns:
        return body, memory
    system = body.get("system")
    removed: list[str] = []

    def strip(text: str) -> str:
        keep: list[str] = []
        for line in text.split("\n"):
            (removed if mask(line) in memory.patterns else keep).append(line)
        return "\n".join(keep)

    out = dict(body)
    if isinstance(system, str):
        out["system"] = strip(system)
    elif isinstance(system, list):
        out["system"] = [
            {**b, "text": strip(b["text"])} if isinstance(b, dict) and isinstance(b.get("text"), str) else b
            for b in system
        ]
    messages = [dict(m) for m in body.get("messages") or []]
    users = [i for i, m in enumerate(messages) if m.get("role") == "user"]
    moved = dict(memory.moved)
    if removed and users and users[-1] not in moved:
        moved[users[-1]] = MOVED_PREFIX + "\n".join(removed)
    for i, text in sorted(moved.items()):
        if i < len(messages):
            content = messages[i].get("content")
            blocks = [{"type": "text", "text": content}] if isinstance(content, str) else list(content or [])
            messages[i]["content"] = [*blocks, {"type": "text", "text": text}]
    out["messages"] = messages
    return out, VolatileMemory(memory.patterns, memory.last_lines, moved)
