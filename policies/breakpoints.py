"""Anthropic breakpoint placement: where the (at most four) ``cache_control`` markers go.

**Markers in = markers out, by value** (docs/design.md, "Decided 2026-12-01 (round 3)"): every valid marker the
client set on this request is kept on its block exactly as sent: its ``ttl``, its ``scope``, anything else in it
(``markers="merge"``; ``req`` carries the client's current markers only, a form re-sent from history never brings
its old ones). Two exceptions, both markers that defeat the cache: a client that sets more than ``max_breakpoints``
(the API refuses such a request) loses its oldest ones, and one whose markers fill every slot while the newest sits
more than ``lookback_blocks - 1`` content blocks before the tail (frozen markers, case k10: no marker could read
the tail back) gives its oldest one's slot to agentcache's tail. agentcache's own markers take the free slots, in
priority order:

1. **tail**: the last cacheable block, skipping trailing blocks this session's client is known not
   to resend (``PlanHints.ephemeral_tail``); it writes the entry the next turn reads;
2. **sibling**: the end of the prefix a subagent's first request shares with its sibling's (learned per
   lineage: ``PlanHints.sibling_at``), when they diverge inside the messages: the sibling subagents then read
   one entry for their shared task context instead of each writing it (claude-code#82739, #50213). The *first*
   subagent gets no such marker, and none could help it: where its tool list leaves its parent's (Claude Code
   2.1.197: after 12 of the parent's 25 tools) no earlier request tells, the parent's entries end at its own marked
   depths, and its siblings read their whole static prefix from the first one's entries (docs/policies.md);
3. **read**: the deepest entry the session's previous request wrote that this request still shares,
   when the tail is more than ``lookback_blocks - 1`` content blocks past it (a long fan-out turn);
4. **rewrite**: the last block before the message the client is expected to rewrite next turn
   (``PlanHints.rewrite_at``, learned from a sliding window that elides old tool outputs), so the
   entry written there is still read after the rewrite;
5. **resent**: the block before the tail in the same message: if the client drops that trailing block next turn
   (a per-turn status block it sends once, anthropics/claude-code#96101, before agentcache has seen it do so),
   the entry there is still read; if not, it cost nothing (one write covers the read point to the deepest
   breakpoint). Planned whoever marks the tail (the client's marker is kept there), so planning a planned
   request adds none;
6. **system**: the last block of the static prefix (tools, then system), shared by every session;
7. **tools**: the last tool, so tools stay cached when the system text is volatile;
8. **stable**: the block before the first static block that changed since the last turn, else the
   system block before the last one.

Extra markers cost no write tokens; they only use slots. A request without tools (a person's turn, perhaps the last)
gets none of agentcache's own past the client's deepest marker and the static prefix (a write there is a bet on a
continuation), unless the client marks nothing and its session has sent before. Never on an option, empty text or
thinking block, nor on the string content of a ``role: "system"`` message inside ``messages`` (the client's shape is
kept: agentcache never turns it into a block list to carry a marker of its own); none of agentcache's own below the
model's minimum cacheable length (a marker there caches nothing; a client's own marker there is kept). 1h markers
always precede 5m ones: agentcache's own markers take the policy's TTL, lowered to 5m after a 5m marker and raised
to 1h before a 1h one, and never change a client's (unless the client's own put a 5m before a 1h, which the API
refuses: that 5m one is raised to 1h). The plan is a pure function of its inputs, so planning an already planned
request gives the same plan.
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
    """Markers to place: block index → :class:`Marker`, and the reason for each (``tail``, ``resent``, ``read``,
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

    Returns at most ``rules.max_breakpoints`` markers that Anthropic accepts: the client's own (kept by value),
    then agentcache's in the free slots (see the module docstring).
    """
    hints = hints or PlanHints()
    client = {i: m for i, m in req.markers() if eligible(req, i)} if hints.mode == "merge" else {}
    kept = sorted(client, reverse=True)[: rules.max_breakpoints]
    tail = _last_eligible(req, _tail_end(req, hints.ephemeral_tail)) or _last_eligible(req, len(req.blocks))
    if len(kept) == rules.max_breakpoints and tail is not None and tail > kept[0]:
        gap = sum(1 for b in req.blocks[kept[0] + 1 : tail + 1] if not b.is_option)
        if gap > rules.lookback_blocks - 1:  # frozen markers (case k10): the tail takes the shallowest one's slot
            kept.pop()
    chosen = {i: "client" for i in kept}
    bound = _own_bound(req, prev, kept)
    for i, why in _own_candidates(req, prev, rules, hints):
        if len(chosen) == rules.max_breakpoints:
            break
        if i is None or i in chosen or i > bound or req.tokens_before(i + 1) < rules.min_cacheable_tokens:
            continue
        chosen[i] = why
    return BreakpointPlan(_markers(chosen, client, hints.ttl), dict(sorted(chosen.items())))


def _own_bound(req: CanonicalRequest, prev: CanonicalRequest | None, client: list[int]) -> int:
    """The deepest block agentcache's own markers may take. A write past the deepest breakpoint costs 1.25×, paid
    back only when a later request reads it. A request without tools is a person's turn (a chat, a title): the next
    one may never come, or come after the entry expired. So there agentcache bets no write past the client's own
    deepest marker and the static prefix (which other sessions read), unless the client marks nothing and its session
    has sent before (a chat that goes on, left uncached by its client). On aider's one-shot ``--message`` chats such a
    tail cost 5-10% more than the client alone. An agent loop (tools): no bound."""
    if any(b.section == "tool" for b in req.head) or (prev is not None and not client):
        return len(req.blocks)
    return max([*client, static_end(req) - 1])


def _own_candidates(
    req: CanonicalRequest, prev: CanonicalRequest | None, rules: AnthropicRules, hints: PlanHints
) -> list[tuple[int | None, str]]:
    """agentcache's own candidate blocks in priority order (see the module docstring)."""
    end = static_end(req)
    shared = common_prefix(prev, req) if prev is not None else len(req.blocks)
    tail = _last_eligible(req, _tail_end(req, hints.ephemeral_tail)) or _last_eligible(req, len(req.blocks))
    candidates: list[tuple[int | None, str]] = [(tail, "tail")]
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
    candidates.append((_resent(req, tail), "resent"))
    system = _last_eligible(req, end)
    candidates.append((system, "system"))
    last_tool = max((i for i, b in enumerate(req.head) if b.section == "tool"), default=None)
    candidates.append((last_tool if last_tool is not None and eligible(req, last_tool) else None, "tools"))
    if shared < end:  # the static prefix changed since the last turn: keep what precedes the change
        candidates.append((_last_eligible(req, shared), "stable"))
    elif system is not None:
        candidates.append((_last_eligible(req, system, (last_tool or -1) + 1), "stable"))
    return candidates


def _resent(req: CanonicalRequest, tail: int | None) -> int | None:
    """The eligible block before ``tail`` in the same message, or None: what the next turn still carries if the
    client drops its newest message's trailing block (a per-turn status block, anthropics/claude-code#96101)."""
    if tail is None or req.blocks[tail].message is None:
        return None
    before = _last_eligible(req, tail)
    return before if before is not None and req.blocks[before].message == req.blocks[tail].message else None


def _markers(chosen: Mapping[int, str], client: Mapping[int, Marker], ttl: str) -> dict[int, Marker]:
    """The markers of the ``chosen`` blocks, in prefix order, 1h entries before 5m ones: a client's as it sent it
    (one of its own 5m markers before one of its 1h markers, which the API refuses, raised to 1h: the
    ``markers.invalid`` repair, its other keys kept); agentcache's own at ``ttl``, lowered to 5m after a 5m marker
    and raised to 1h before a 1h one."""
    order = sorted(chosen)
    ttls = {i: (client[i].ttl if chosen[i] == "client" else ttl) for i in order}
    raised: set[int] = set()
    seen_1h = False
    for i in reversed(order):  # the client's own order first: a 5m before a 1h is refused
        if chosen[i] == "client" and ttls[i] == "1h":
            seen_1h = True
        elif chosen[i] == "client" and seen_1h:
            ttls[i] = "1h"
            raised.add(i)
    seen_5m = False
    for i in order:  # an own marker after a 5m one cannot be 1h
        if chosen[i] != "client" and seen_5m:
            ttls[i] = "5m"
        seen_5m = seen_5m or ttls[i] != "1h"
    seen_1h = False
    for i in reversed(order):  # an own marker before a 1h one must be 1h
        if chosen[i] != "client" and seen_1h:
            ttls[i] = "1h"
        seen_1h = seen_1h or ttls[i] == "1h"
    out: dict[int, Marker] = {}
    for i in order:
        if chosen[i] != "client":
            out[i] = Marker(ttls[i])
        elif i in raised:
            raw = client[i].raw
            out[i] = Marker("1h", {**raw, "ttl": "1h"} if isinstance(raw, dict) else None)
        else:
            out[i] = client[i]
    return out


def plan_openai_breakpoints(req: CanonicalRequest, hints: PlanHints, max_explicit: int) -> BreakpointPlan:
    """Explicit ``prompt_cache_breakpoint`` parts for OpenAI models that take them (gpt-5.6+).

    The client's own breakpoints are kept as sent (markers in = markers out); agentcache adds its own only while
    fewer than ``max_explicit`` are set. In implicit mode OpenAI already writes a breakpoint at the end of the
    newest message, and matching has no lookback limit, so only what the implicit breakpoint cannot give is marked:
    the end of the static prefix (the last system/developer content part, shared by every session of the agent)
    and the block before the client's next expected rewrite. Only message content parts take a breakpoint, and
    agentcache never turns a system or developer message's string into a part list to carry one: OpenAI's own API
    takes text parts there (``ChatCompletionSystemMessageParam``), but a gateway or OpenAI-compatible server that
    the OpenAI target also covers may take only a string.
    """

    def ok(i: int) -> bool:
        b = req.blocks[i]
        return b.message is not None and ".content" in b.path and not b.empty

    def own(i: int) -> bool:
        return ok(i) and not (req.blocks[i].section == "system" and req.blocks[i].path.endswith(".content"))

    client = {i: m for i, m in req.markers() if ok(i)} if hints.mode == "merge" else {}
    chosen = dict.fromkeys(client, "client")
    candidates: list[tuple[int | None, str]] = []
    if hints.rewrite_at is not None:
        before = [i for i, b in enumerate(req.blocks) if b.message is not None and b.message < hints.rewrite_at]
        candidates.append((next((i for i in reversed(before) if own(i)), None), "rewrite"))
    candidates.append((next((i for i in range(static_end(req) - 1, -1, -1) if ok(i)), None), "system"))
    free = max(0, max_explicit - len(client))
    picks = [(i, why) for i, why in candidates if i is not None and i not in chosen and own(i)]
    for i, why in sorted(dict(picks).items())[-free:] if free else []:
        chosen[i] = why
    markers = {i: client[i] if why == "client" else Marker("30m") for i, why in sorted(chosen.items())}
    return BreakpointPlan(markers, {i: chosen[i] for i in markers})
