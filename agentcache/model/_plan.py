"""Decisions to apply onto a wire body, expressed in the wire's own paths."""

from __future__ import annotations

from collections.abc import Mapping
from dataclasses import dataclass, field
from typing import Any

#: Sentinel: leave a field as the client sent it.
KEEP: Any = type("_Keep", (), {"__repr__": lambda self: "KEEP"})()


@dataclass(frozen=True, slots=True)
class WirePlan:
    """What to change on a wire body. Every change preserves meaning (design.md, repair rule).

    ``replace``: unit path → JSON value previously sent for it (``"tools[3]"``, ``"system"``,
    ``"messages[5].content"``, ``"messages[2].tool_calls"``...), applied before reordering.
    ``tool_order``: new order of the body's tools as indices into its ``tools`` list, or None.
    ``cache_key``: a new ``prompt_cache_key`` value, or KEEP.
    ``markers``: when not None, exactly these ``(path, ttl)`` carry a cache marker afterwards and every
    other block marker is removed; paths name blocks of the body *after* replace and reorder.
    ``top_marker``: True keeps/sets a top-level ``cache_control``, False removes it, None leaves it.
    """

    replace: Mapping[str, Any] = field(default_factory=dict)
    tool_order: tuple[int, ...] | None = None
    cache_key: Any = KEEP
    markers: tuple[tuple[str, str], ...] | None = None
    top_marker: bool | None = None

    @property
    def empty(self) -> bool:
        """True when applying the plan would change nothing."""
        return (
            not self.replace
            and self.tool_order is None
            and self.cache_key is KEEP
            and self.markers is None
            and self.top_marker is None
        )
