"""Anthropic breakpoint placement: where the (at most four) ``cache_control`` markers go.

Placement, in slot order:

1. **anchor**: the last block of the static prefix (tools, then system), when it reaches the model's
   minimum cacheable length, so every session of the same agent reads it;
2. **read**: the deepest entry the session's previous request wrote that this request still shares,
   when the new tail is more than ``lookback_blocks - 1`` content blocks past it (a long fan-out turn),
   so the read does not depend on the lookback window;
3. **tail**: the last cacheable block, which writes the entry the next turn reads.

Never on an option, empty text or thinking block; never on a block whose prefix is below the minimum.
The plan is a pure function of the request and the previous one, so applying it twice changes nothing.
"""

from __future__ import annotations

from collections.abc import Mapping
from dataclasses import dataclass, field

from agentcache._canonical import CanonicalRequest, Marker, common_prefix
from agentcache._diagnose import static_end
from agentcache._pricing import AnthropicRules

_NO_MARKER_KINDS = frozenset({"thinking", "redacted_thinking"})


@dataclass(frozen=True, slots=True)
class BreakpointPlan:
    """Markers to place: block index → :class:`Marker`, with the reason for each (``anchor``,
    ``read``, ``tail``). ``top`` is a top-level marker (never used by this planner: explicit
    markers are strictly more precise)."""

    markers: Mapping[int, Marker] = field(default_factory=dict)
    reasons: Mapping[int, str] = field(default_factory=dict)
    top: Marker | None = None


def eligible(req: CanonicalRequest, i: int) -> bool:
    """True when a marker may sit on block ``i``."""
    b = req.blocks[i]
    return not (b.is_option or b.empty or b.kind in _NO_MARKER_KINDS)


def plan_breakpoints(
    req: CanonicalRequest,
    prev: CanonicalRequest | None,
    rules: AnthropicRules,
    ttl: str = "5m",
) -> BreakpointPlan:
    """Plan markers for ``req`` given the session's previous *sent* request ``prev`` (or None).

    Returns at most ``rules.max_breakpoints`` markers, all with ``ttl``.
    """
    marker = Marker(ttl)
    chosen: dict[int, str] = {}

    def ok(i: int) -> bool:
        return eligible(req, i) and req.tokens_before(i + 1) >= rules.min_cacheable_tokens

    anchor = next((i for i in range(static_end(req) - 1, -1, -1) if eligible(req, i)), None)
    if anchor is not None and ok(anchor):
        chosen[anchor] = "anchor"

    tail = next((i for i in range(len(req.blocks) - 1, -1, -1) if eligible(req, i)), None)
    if tail is not None and ok(tail):
        chosen[tail] = "tail"

    if prev is not None and tail is not None:
        shared = common_prefix(prev, req)
        prev_marks = [i for i, _ in prev.markers() if i < shared]
        if prev_marks:
            read = max(prev_marks)
            content_gap = sum(1 for b in req.blocks[read + 1 : tail + 1] if not b.is_option)
            if content_gap > rules.lookback_blocks - 1 and read not in chosen and ok(read):
                chosen[read] = "read"

    # Keep the deepest slots if the budget is short (anchor first to go: it is re-read the least).
    keep = sorted(chosen)[-rules.max_breakpoints :]
    return BreakpointPlan({i: marker for i in keep}, {i: chosen[i] for i in keep})
