"""Anthropic breakpoint placement: where the (at most four) ``cache_control`` markers go.

Candidates, in priority order; the first ``max_breakpoints`` that qualify are used:

1. **tail**: the last cacheable block, skipping trailing blocks this session's client is known not
   to resend (``PlanHints.ephemeral_tail``); it writes the entry the next turn reads;
2. **client**: the client's own valid markers on this request, newest first (``markers="merge"``):
   they outrank every marker agentcache would add itself (``req`` carries the client's current
   markers only; a form re-sent from history never brings its old ones);
3. **sibling**: the end of the prefix a subagent's first request shares with its sibling's (learned per
   lineage: ``PlanHints.sibling_at``), when they diverge inside the messages: the sibling subagents then read
   one entry for their shared task context instead of each writing it (claude-code#82739, #50213);
4. **read**: the deepest entry the session's previous request wrote that this request still shares,
   when the tail is more than ``lookback_blocks - 1`` content blocks past it (a long fan-out turn);
5. **rewrite**: the last block before the message the client is expected to rewrite next turn
   (``PlanHints.rewrite_at``, learned from a sliding window that elides old tool outputs), so the
   entry written there is still read after the rewrite;
6. **system**: the last block of the static prefix (tools, then system), shared by every session;
7. **tools**: the last tool, so tools stay cached when the system text is volatile;
8. **stable**: the block before the first static block that changed since the last turn, else the
   system block before the last one.

Extra markers cost no write tokens (one write covers read point → deepest breakpoint); they only use
slots. Never on an option, empty text or thinking block, nor on the string content of a ``role:
"system"`` message inside ``messages`` (a marker would turn it into a block list, a form the Messages API
documents for user and assistant turns; Claude Code sends these as strings); none of agentcache's own
below the model's minimum cacheable length (a marker there caches nothing; a client's own marker there is
kept). 1h markers always precede 5m ones (an earlier 5m marker is raised to 1h). The plan is a pure
function of its inputs, so planning an already planned request gives the same plan.
"""

from __future__ import annotations

from collections.abc import Mapping
from dataclasses import dataclass, field

from agentcache.model._canonical import CanonicalRequest, Marker, common_prefix, static_end
from agentcache.model._rules import AnthropicRules

_NO_MARKER_KINDS = frozenset({"thinking", "redacted_thinking"})
_SYSTEM_MESSAGE_ENV = b'{"role":"system"'  # an envelope's start: the role comes first, other keys may follow


@dataclass(frozen=True, slots=True)
class PlanHints:
    """What the session's history says about the next request.

    ``ephemeral_tail``: trailing content blocks the client sends once and drops next turn.
    ``rewrite_at``: the message index the client is expected to rewrite next turn, or None.
    ``ttl``: the TTL for markers agentcache places (from :mod:`agentcache.policies.ttl`).
    ``mode``: ``merge`` keeps the client's valid markers where slots allow; ``own`` ignores them.
    ``sibling_at``: blocks this request (a subagent's first) shares with its sibling's, or None.
    """

    ephemeral_tail: int = 0
    rewrite_at: int | None = None
    ttl: str = "5m"
    mode: str = "merge"
    sibling_at: int | None = None


@dataclass(frozen=True, slots=True)
class BreakpointPlan:
    """Markers to place: block index → :class:`Marker`, and the reason for each (``tail``, ``read``,
    ``rewrite``, ``client``, ``sibling``, ``system``, ``tools``, ``stable``). ``top`` is a top-level marker (this
    planner never uses one: explicit markers are strictly more precise)."""

    markers: Mapping[int, Marker] = field(default_factory=dict)
    reasons: Mapping[int, str] = field(default_factory=dict)
    top: Marker | None = None


def eligible(req: CanonicalRequest, i: int) -> bool:
    """True when a marker may sit on block ``i``."""
    b = req.blocks[i]
    if b.is_option or b.empty or b.kind in _NO_MARKER_KINDS:
        return False
    # A role "system" message's string content keeps the client's shape (see the module docstring).
    n = len(_SYSTEM_MESSAGE_ENV)
    system = b.env[:n] == _SYSTEM_MESSAGE_ENV and b.env[n : n + 1] in (b"}", b",")
    return not (b.section == "message" and system and b.data[:1] == b'"')


def _last_eligible(req: CanonicalRequest, end: int, start: int = 0) -> int | None:
    """The last eligible block index in ``[start, end)``, or None."""
    return next((i for i in range(end - 1, start - 1, -1) if eligible(req, i)), None)


def _tail_end(req: CanonicalRequest, skip: int) -> int:
    """Block index bound that leaves out the last ``skip`` content blocks."""
    end = len(req.blocks)
    while skip > 0 and end > 0:
        end -= 1
        if not req.blocks[end].is_option:
            skip -= 1
    return end


def plan_breakpoints(
    req: CanonicalRequest,
    prev: CanonicalRequest | None,
    rules: AnthropicRules,
    hints: PlanHints | None = None,
) -> BreakpointPlan:
    """Plan markers for ``req`` given the session's previous *sent* request ``prev`` (or None).

    Returns at most ``rules.max_breakpoints`` markers that Anthropic accepts.
    """
    hints = hints or PlanHints()
    end = static_end(req)
    shared = common_prefix(prev, req) if prev is not None else len(req.blocks)
    tail = _last_eligible(req, _tail_end(req, hints.ephemeral_tail)) or _last_eligible(req, len(req.blocks))
    candidates: list[tuple[int | None, str]] = [(tail, "tail")]
    client = dict(req.markers()) if hints.mode == "merge" else {}
    candidates += [(i, "client") for i in sorted(client, reverse=True) if eligible(req, i)]
    if hints.sibling_at is not None and end < hints.sibling_at <= len(req.blocks):
        candidates.append((_last_eligible(req, hints.sibling_at, end), "sibling"))
    if prev is not None and tail is not None:
        prev_marks = [i for i, _ in prev.markers() if i < shared]
        if prev_marks:
            read = max(prev_marks)
            gap = sum(1 for b in req.blocks[read + 1 : tail + 1] if not b.is_option)
            if gap > rules.lookback_blocks - 1:
                candidates.append((read, "read"))
    if hints.rewrite_at is not None and tail is not None:
        before = [i for i, b in enumerate(req.blocks) if b.message is not None and b.message < hints.rewrite_at]
        if before:
            candidates.append((_last_eligible(req, before[-1] + 1), "rewrite"))
    system = _last_eligible(req, end)
    candidates.append((system, "system"))
    last_tool = max((i for i, b in enumerate(req.head) if b.section == "tool"), default=None)
    candidates.append((last_tool if last_tool is not None and eligible(req, last_tool) else None, "tools"))
    if shared < end:  # the static prefix changed since the last turn: keep what precedes the change
        candidates.append((_last_eligible(req, shared), "stable"))
    elif system is not None:
        candidates.append((_last_eligible(req, system, (last_tool or -1) + 1), "stable"))

    chosen: dict[int, str] = {}
    for i, why in candidates:
        if len(chosen) == rules.max_breakpoints:
            break
        if i is None or i in chosen:
            continue
        # A client's marker stays even below the minimum (it caches nothing there, but it is the client's).
        if why != "client" and req.tokens_before(i + 1) < rules.min_cacheable_tokens:
            continue
        chosen[i] = why
    ttls = {
        i: (client[i].ttl if why == "client" and client[i].ttl in ("5m", "1h") else hints.ttl)
        for i, why in chosen.items()
    }
    # 1h entries must precede 5m ones: raise any 5m marker that sits before a 1h marker.
    seen_1h = False
    for i in sorted(ttls, reverse=True):
        seen_1h = seen_1h or ttls[i] == "1h"
        if seen_1h:
            ttls[i] = "1h"
    markers = {
        i: (client[i] if chosen[i] == "client" and client[i].ttl == ttls[i] else Marker(ttls[i]))
        for i in sorted(chosen)
    }
    return BreakpointPlan(markers, dict(sorted(chosen.items())))


def plan_openai_breakpoints(req: CanonicalRequest, hints: PlanHints, max_explicit: int) -> BreakpointPlan:
    """Explicit ``prompt_cache_breakpoint`` parts for OpenAI models that take them (gpt-5.6+).

    In implicit mode OpenAI already writes a breakpoint at the end of the newest message, and matching
    has no lookback limit, so only what the implicit breakpoint cannot give is marked: the end of the
    static prefix (the last system/developer content part, shared by every session of the agent) and
    the block before the client's next expected rewrite. Only message content parts take a breakpoint.
    """

    def ok(i: int) -> bool:
        b = req.blocks[i]
        return b.message is not None and ".content" in b.path and not b.empty

    chosen: dict[int, str] = {}
    if hints.rewrite_at is not None:
        before = [i for i, b in enumerate(req.blocks) if b.message is not None and b.message < hints.rewrite_at]
        pick = next((i for i in reversed(before) if ok(i)), None)
        if pick is not None:
            chosen[pick] = "rewrite"
    system = next((i for i in range(static_end(req) - 1, -1, -1) if ok(i)), None)
    if system is not None and system not in chosen:
        chosen[system] = "system"
    keep = sorted(chosen)[-max_explicit:] if max_explicit else []
    return BreakpointPlan({i: Marker("30m") for i in keep}, {i: chosen[i] for i in keep})
