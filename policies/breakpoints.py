"""Anthropic breakpoint placement: where the (at most four) ``cache_control`` markers go.

Candidates, in priority order (the first ``max_breakpoints`` that qualify are used):

1. **tail**: the last cacheable block; it writes the entry the next turn reads;
2. **read**: the deepest entry the session's previous request wrote that this request still shares,
   when the tail is more than ``lookback_blocks - 1`` content blocks past it (a long fan-out turn),
   so the read does not depend on the lookback window;
3. **system**: the last block of the static prefix (tools, then system), which every session of the
   same agent shares;
4. **tools**: the last tool, so tools stay cached when the system text is volatile;
5. **stable**: the block before the first static block that ever changed in this session (learned
   from the previous request), else the system block before the last one.

Extra markers cost nothing in write tokens (a write covers read point → deepest breakpoint once);
they only use slots. Never on an option, empty text or thinking block; never on a block whose prefix
is below the model's minimum. The plan is a pure function of the request and the previous one, so
applying it twice changes nothing.
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
    """Markers to place: block index → :class:`Marker`, with the reason for each (``tail``, ``read``,
    ``system``, ``tools``, ``stable``). ``top`` is a top-level marker (never used by this planner:
    explicit markers are strictly more precise)."""

    markers: Mapping[int, Marker] = field(default_factory=dict)
    reasons: Mapping[int, str] = field(default_factory=dict)
    top: Marker | None = None


def eligible(req: CanonicalRequest, i: int) -> bool:
    """True when a marker may sit on block ``i``."""
    b = req.blocks[i]
    return not (b.is_option or b.empty or b.kind in _NO_MARKER_KINDS)


def _last_eligible(req: CanonicalRequest, end: int, start: int = 0) -> int | None:
    """The last eligible block index in ``[start, end)``, or None."""
    return next((i for i in range(end - 1, start - 1, -1) if eligible(req, i)), None)


def plan_breakpoints(
    req: CanonicalRequest,
    prev: CanonicalRequest | None,
    rules: AnthropicRules,
    ttl: str = "5m",
) -> BreakpointPlan:
    """Plan markers for ``req`` given the session's previous *sent* request ``prev`` (or None).

    Returns at most ``rules.max_breakpoints`` markers, all with ``ttl``.
    """
    end = static_end(req)
    shared = common_prefix(prev, req) if prev is not None else len(req.blocks)
    tail = _last_eligible(req, len(req.blocks))
    candidates: list[tuple[int | None, str]] = [(tail, "tail")]
    if prev is not None and tail is not None:
        prev_marks = [i for i, _ in prev.markers() if i < shared]
        if prev_marks:
            read = max(prev_marks)
            gap = sum(1 for b in req.blocks[read + 1 : tail + 1] if not b.is_option)
            if gap > rules.lookback_blocks - 1:
                candidates.append((read, "read"))
    system = _last_eligible(req, end)
    candidates.append((system, "system"))
    last_tool = max((i for i, b in enumerate(req.blocks) if b.section == "tool"), default=None)
    candidates.append((last_tool if last_tool is not None and eligible(req, last_tool) else None, "tools"))
    if shared < end:  # the static prefix changed since the last turn: keep what precedes the change
        candidates.append((_last_eligible(req, shared), "stable"))
    elif system is not None:
        candidates.append((_last_eligible(req, system, (last_tool or -1) + 1), "stable"))

    chosen: dict[int, str] = {}
    for i, why in candidates:
        if len(chosen) == rules.max_breakpoints:
            break
        if i is None or i in chosen or req.tokens_before(i + 1) < rules.min_cacheable_tokens:
            continue
        chosen[i] = why
    marker = Marker(ttl)
    return BreakpointPlan({i: marker for i in sorted(chosen)}, dict(sorted(chosen.items())))
