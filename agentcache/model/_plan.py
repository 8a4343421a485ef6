"""Decisions to apply onto a wire body, expressed in the wire's own paths: the vocabulary between the repairs and
policies that decide and the adapters that carry decisions out (as SGLang's radix tree emits action records that
its controller executes)."""

from __future__ import annotations

from collections.abc import Mapping
from dataclasses import dataclass, field
from typing import Any

from ._canonical import Marker

__all__ = ["KEEP", "MarkerSpec", "WirePlan"]

#: Sentinel: leave a field as the client sent it.
KEEP: Any = type("_Keep", (), {"__repr__": lambda self: "KEEP"})()

#: A marker to write: a TTL (``"5m"``, ``"1h"``, ``"30m"``) or a :class:`Marker`, whose ``raw`` wire value (a
#: client's own marker) is written as it was sent.
MarkerSpec = str | Marker


@dataclass(frozen=True, slots=True)
class WirePlan:
    """What to change on a wire body. Every change preserves meaning (docs/design.md, repair rule).

    ``replace``: unit path → JSON value previously sent for it (``"tools[3]"``, ``"system"``,
    ``"messages[5]"``...), applied before reordering.
    ``tool_order``: new order of the body's tools as indices into its ``tools`` list, or None.
    ``cache_key``: a new ``prompt_cache_key`` value, or KEEP.
    ``markers``: when not None, exactly these ``(path, marker)`` carry a cache marker afterwards and every
    other block marker is removed; paths name blocks of the body *after* replace and reorder.
    ``top_marker``: True keeps/sets a top-level ``cache_control``, False removes it, None leaves it.
    ``marked``: the message indices (after replace) whose units may carry a marker before the markers are
    written, when known (the marker writer then visits only those and the ones ``markers`` names, instead of
    every message); None: visit every message.
    ``diagnostics``: ask the provider why this request missed its cache, against the response id given (None: opt
    in without one, on a session's first request), or KEEP. The adapter writes it where the API takes it
    (Anthropic ``diagnostics.previous_message_id``, OpenAI Responses ``prompt_cache_options.
    comparison_response_id``) unless the client set that field itself. ``headers``: ``(name, value)`` headers
    the door adds to the request (a value joins the client's own comma-separated list, as ``anthropic-beta``).
    """

    replace: Mapping[str, Any] = field(default_factory=dict)
    tool_order: tuple[int, ...] | None = None
    cache_key: Any = KEEP
    markers: tuple[tuple[str, MarkerSpec], ...] | None = None
    top_marker: bool | None = None
    marked: frozenset[int] | None = None
    diagnostics: Any = KEEP
    headers: tuple[tuple[str, str], ...] = ()

    @property
    def empty(self) -> bool:
        """True when applying the plan would change nothing."""
        return (
            not self.replace
            and self.tool_order is None
            and self.cache_key is KEEP
            and self.markers is None
            and self.top_marker is None
            and self.diagnostics is KEEP
            and not self.headers
        )

    def merged(self, other: WirePlan) -> WirePlan:
        """One plan doing both: ``other``'s fields win where it sets them (its ``replace`` entries are added)."""
        if other.empty:
            return self
        if self.empty:
            return other
        return WirePlan(
            {**self.replace, **other.replace},
            other.tool_order if other.tool_order is not None else self.tool_order,
            other.cache_key if other.cache_key is not KEEP else self.cache_key,
            other.markers if other.markers is not None else self.markers,
            other.top_marker if other.top_marker is not None else self.top_marker,
            other.marked if other.marked is not None else self.marked,
            other.diagnostics if other.diagnostics is not KEEP else self.diagnostics,
            (*self.headers, *other.headers),
        )
