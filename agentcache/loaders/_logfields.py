"""What the readers of agents' own logs share: reading a log's times and token counts, putting reported counts
back into the wire shape of the API that served them, and naming a subagent's session.

A reader never interprets usage itself: it maps the counts an agent logged onto the usage object of the API the
call went to (:func:`wire_usage`) and lets the core's one usage parser
(:func:`agentcache.model._usage.normalize_usage`) normalise them.
"""

from __future__ import annotations

from collections.abc import Mapping
from datetime import UTC, datetime
from typing import Any

from agentcache.adapters import usage_wire
from agentcache.model._usage import CacheUsage, normalize_usage

__all__ = ["get_dict", "get_str", "lineage", "tokens", "unix_seconds", "usage_of", "wire_usage"]


def unix_seconds(value: Any) -> float | None:
    """An ISO 8601 timestamp (``2026-12-01T22:40:48.823Z``; no zone means UTC) as unix seconds, or None when
    ``value`` is not one."""
    if not isinstance(value, str) or not value:
        return None
    try:
        stamp = datetime.fromisoformat(value)
    except ValueError:
        return None
    if stamp.tzinfo is None:
        stamp = stamp.replace(tzinfo=UTC)
    return stamp.timestamp()


def tokens(value: Any) -> int:
    """A logged token count: a non-negative int (an integral float is accepted; an absent count is 0). Raises
    ``ValueError`` for anything else, so the record that holds it is reported, not miscounted."""
    if value is None:
        return 0
    if isinstance(value, float) and value.is_integer():
        value = int(value)
    if isinstance(value, bool) or not isinstance(value, int) or value < 0:
        raise ValueError(f"token count is not a count: {value!r}")
    return value


def wire_usage(api: str, prompt: int, read: int, write: int = 0, output: int | None = None) -> dict[str, Any]:
    """The usage object ``api`` would have returned for a call of ``prompt`` tokens in all, ``read`` of them read
    from the cache and ``write`` written to it (field names from :mod:`agentcache.model._usage`): Anthropic's
    ``input_tokens`` is the uncached remainder, OpenAI's the whole prompt: the wire's
    :meth:`~agentcache.adapters.Wire.usage_doc`; another api writes Chat's)."""
    return usage_wire(api).usage_doc(prompt, read, write, output)


def usage_of(api: str, prompt: int, read: int, write: int = 0, output: int | None = None) -> CacheUsage:
    """:func:`wire_usage` read by the core's usage parser. Raises ``ValueError`` when the counts are not a usage
    (more read than the whole prompt)."""
    if read + write > prompt:
        raise ValueError(f"cache tokens ({read} read, {write} written) exceed the prompt ({prompt})")
    usage = normalize_usage(wire_usage(api, prompt, read, write, output), api)
    if usage is None:  # the parser reads every shape wire_usage writes; kept as a guard
        raise ValueError("no usage")
    return usage


def lineage(chain: list[str]) -> tuple[str, str | None]:
    """``(session, parent)`` of a conversation from its chain of ids, root first (``[root, ..., parent, own]``).
    A root conversation is its own id; a subagent's is ``<root>/<own id>``, and its parent is the session name of
    the conversation that spawned it (the root, or ``<root>/<parent id>`` deeper down)."""
    own = chain[-1]
    if len(chain) == 1:
        return own, None
    root = chain[0]
    parent = root if len(chain) == 2 else f"{root}/{chain[-2]}"
    return f"{root}/{own}", parent


def get_dict(obj: Mapping[str, Any], key: str) -> dict[str, Any]:
    """``obj[key]`` when it is an object, else an empty dict (logs leave optional objects out or null)."""
    value = obj.get(key)
    return value if isinstance(value, dict) else {}


def get_str(obj: Mapping[str, Any], key: str) -> str | None:
    """``obj[key]`` when it is a non-empty string, else None."""
    value = obj.get(key)
    return value if isinstance(value, str) and value else None
