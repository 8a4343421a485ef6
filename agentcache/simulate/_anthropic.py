"""A deterministic model of Anthropic's prompt cache (Messages API).

Modelled rules (platform.claude.com/docs/en/build-with-claude/prompt-caching; numbers in
``agentcache/data/models.toml``):

* a request may carry at most ``max_breakpoints`` (4) markers, counting a top-level
  ``cache_control`` (automatic caching: a breakpoint on the last cacheable block); more, a marker on
  an empty text block or a thinking block, or a 1h marker after a 5m one is rejected (HTTP 400);
* each breakpoint looks back ``lookback_blocks`` content blocks for the deepest entry an *earlier*
  request wrote, whose TTL is still alive; a hit refreshes that entry's TTL;
* each breakpoint past the read point whose prefix reaches the model's minimum cacheable length
  writes an entry; ``cache_creation`` counts tokens between the read point and the deepest
  breakpoint, each segment priced by its breakpoint's TTL, 1.25× (5m) or 2× (1h) (the "mixing TTLs"
  billing rule); reads cost 0.1×; tokens after the last breakpoint are plain input. Breakpoints at
  or before the read point write nothing; their existing entries count as used and are refreshed;
* the cache scope is one model (one workspace): sessions share entries.

Concurrency (:class:`~agentcache.simulate.Concurrency`, given): an entry becomes readable only at its writer's
first byte (its start + TTFT), so requests that overlap do not read each other's writes (the miss cause
``write.in_flight``); with ``coalesce`` a request that would read an entry still being written waits for it (at
most ``hold`` seconds; ``SimResult.held_s``) and reads it, as agentcache's coalescer does. Without it, an entry is
readable as soon as the writing request starts (recorded order breaks ties).

Simplifications, documented: token counts are tiktoken estimates; blocks are the matching unit.
"""

from __future__ import annotations

from dataclasses import dataclass, field
from itertools import accumulate

from ..model import _causes as C
from ..model._canonical import CanonicalRequest, Marker
from ..model._rules import AnthropicRules, anthropic_rules
from ._base import Concurrency, ModelScopes, SeenIndex, SimResult, SimUsage

_NO_MARKER_KINDS = frozenset({"thinking", "redacted_thinking"})
#: Hold times a coalescing simulator keeps (for the distribution; the rest are only counted in results).
MAX_HOLDS = 100_000


@dataclass(slots=True)
class _Entry:
    expires: float
    ttl: float
    readable: float = 0.0  # the writer's first byte: reads hit from then on


@dataclass(slots=True)
class _Scope:
    entries: dict[bytes, _Entry] = field(default_factory=dict)
    seen: SeenIndex = field(default_factory=SeenIndex)
    #: Entries written on a block that is not its message's first, by the chain hash of the block before it (the
    #: same message's): when that entry expires. A request that stops matching right there, where its message
    #: ends, had the marker on a trailing block its client dropped (``markers.invalid``).
    trailing: dict[bytes, float] = field(default_factory=dict)


def markers_valid(req: CanonicalRequest, rules: AnthropicRules) -> bool:
    """True when Anthropic would accept ``req``'s markers (count, allowed blocks, TTL order)."""
    marks = req.markers()
    if len(marks) + (1 if req.top_marker else 0) > rules.max_breakpoints:
        return False
    for i, m in marks:
        b = req.blocks[i]
        if b.empty or b.kind in _NO_MARKER_KINDS or m.ttl not in ("5m", "1h"):
            return False
    ttls = [m.ttl for _, m in breakpoints(req)]
    return "5m" not in ttls or "1h" not in ttls[ttls.index("5m") :]


def last_cacheable(req: CanonicalRequest) -> int | None:
    """Index of the last block a marker may sit on (not an option, empty or thinking block)."""
    for i in range(len(req.blocks) - 1, -1, -1):
        b = req.blocks[i]
        if not (b.is_option or b.empty or b.kind in _NO_MARKER_KINDS):
            return i
    return None


def breakpoints(req: CanonicalRequest) -> list[tuple[int, Marker]]:
    """Effective breakpoints ``(block index, Marker)`` in prefix order, the top-level one included."""
    marks = dict(req.markers())
    if req.top_marker is not None:
        last = last_cacheable(req)
        if last is not None and last not in marks:
            marks[last] = req.top_marker
    return sorted(marks.items())


class AnthropicSimulator:
    """Replays canonical requests, in time order, through one shared model of Anthropic's cache.

    ``run(req, now)`` returns a :class:`SimResult`; ``now`` is in seconds and must not decrease.
    ``model`` overrides every request's model for pricing and scope. ``concurrency``: model overlapping
    requests (see the module docstring); None: an entry is readable as soon as its writer starts.
    ``holds``: the seconds of every hold so far (a coalescing simulator; at most :data:`MAX_HOLDS` kept).
    """

    provider = "anthropic"

    def __init__(self, model: str | None = None, concurrency: Concurrency | None = None):
        self._model = model
        self._scopes: ModelScopes[_Scope] = ModelScopes(_Scope)
        self.concurrency = concurrency
        self.holds: list[float] = []

    def run(self, req: CanonicalRequest, now: float, first_byte: float | None = None) -> SimResult:
        """Simulate one request started at ``now`` (see module docstring). ``first_byte``: seconds from its
        start to its first response byte when recorded (else the concurrency's TTFT)."""
        conc = self.concurrency
        ttft = (first_byte if first_byte is not None else conc.ttft) if conc is not None else 0.0
        hold_limit = conc.hold if conc is not None and conc.coalesce else -1.0
        model = self._model or req.model
        rules = anthropic_rules(model)
        scope = self._scopes.get(model)
        m_blocks = scope.seen.depth(req)
        matched = req.tokens_before(m_blocks)
        prompt = req.tokens
        if not markers_valid(req, rules):
            usage = SimUsage(prompt, 0, 0, prompt, rules.cost(prompt, 0, 0, 0))
            return SimResult(usage, matched, C.MARKERS_INVALID, None, rejected=True)

        ordinal = _ordinals(req)
        bps = [(i, rules.ttl_1h_seconds if m.ttl == "1h" else rules.ttl_5m_seconds) for i, m in breakpoints(req)]
        hits: list[int] = []
        wait = 0.0
        for b, _ in bps:
            e = b
            while e >= 0 and ordinal[b] - ordinal[e] <= rules.lookback_blocks:
                ent = scope.entries.get(req.chain[e])
                if ent is not None and ent.expires > now and not req.blocks[e].is_option:
                    if ent.readable <= now:
                        hits.append(e)
                        break
                    if ent.readable - now <= hold_limit:  # coalesced: wait for the writer's first byte
                        wait = max(wait, ent.readable - now)
                        hits.append(e)
                        break
                e -= 1
        if wait > 0:
            if len(self.holds) < MAX_HOLDS:
                self.holds.append(wait)
            now += wait  # the request is sent when the writer answered
        read_idx = max(hits, default=-1)
        read = req.tokens_before(read_idx + 1)
        cause, where = (None, None)
        if read < matched:
            cause, where = self._attribute(req, scope, rules, bps, ordinal, read_idx, m_blocks, matched, now)

        # Mutate only after attribution, which needs the state the request found.
        for e in hits:
            ent = scope.entries[req.chain[e]]
            ent.expires = now + ent.ttl
        write5 = write1h = 0
        covered = read_idx
        for b, ttl in bps:
            ent = scope.entries.get(req.chain[b])
            if b <= read_idx:
                # Already read: nothing is written here (Anthropic bills writes only past the highest
                # hit); an entry that exists was used, so its TTL is refreshed.
                if ent is not None and ent.expires > now:
                    ent.expires = max(ent.expires, now + ent.ttl)
                continue
            if req.tokens_before(b + 1) < rules.min_cacheable_tokens:
                continue
            seg = req.tokens_before(b + 1) - req.tokens_before(covered + 1)
            if ttl >= rules.ttl_1h_seconds:
                write1h += seg
            else:
                write5 += seg
            covered = b
            readable = now + ttft
            if ent is not None and ent.expires > now:  # a concurrent writer of the same entry answers first
                readable = min(readable, ent.readable)
            scope.entries[req.chain[b]] = _Entry(now + ttl, ttl, readable)
            if b and req.blocks[b].message is not None and req.blocks[b - 1].message == req.blocks[b].message:
                scope.trailing[req.chain[b - 1]] = now + ttl
        scope.seen.add(req)
        uncached = prompt - read - write5 - write1h
        usage = SimUsage(prompt, read, write5 + write1h, uncached, rules.cost(uncached, read, write5, write1h), write1h)
        return SimResult(usage, matched, cause, where, held_s=wait)

    @staticmethod
    def _attribute(
        req: CanonicalRequest,
        scope: _Scope,
        rules: AnthropicRules,
        bps: list[tuple[int, float]],
        ordinal: list[int],
        read_idx: int,
        m_blocks: int,
        matched: int,
        now: float,
    ) -> tuple[str, str | None]:
        if matched < rules.min_cacheable_tokens:
            return C.BELOW_MINIMUM, None
        if not bps:
            return C.MARKERS_MISSING, None
        alive = -1
        for i in range(read_idx + 1, m_blocks):
            ent = scope.entries.get(req.chain[i])
            if ent is None:
                continue
            if ent.expires <= now:
                return C.TTL_EXPIRED, req.blocks[i].path
            if ent.readable > now:  # written by a request that has not started its response yet
                return C.WRITE_IN_FLIGHT, req.blocks[i].path
            alive = i
        if alive > read_idx:
            beyond = [b for b, _ in bps if b >= alive]
            if beyond:
                return C.LOOKBACK_EXCEEDED, req.blocks[beyond[0]].path
            return C.MARKERS_MISSING, req.blocks[alive].path
        last = req.blocks[m_blocks - 1]
        ends = m_blocks == len(req.blocks) or req.blocks[m_blocks].message != last.message
        if ends and last.message is not None and scope.trailing.get(req.chain[m_blocks - 1], 0.0) > now:
            return C.MARKERS_INVALID, last.path  # the marker sat on a block of this message the client dropped
        start = ordinal[read_idx] if read_idx >= 0 else -1
        if ordinal[m_blocks - 1] - start > rules.lookback_blocks:
            return C.LOOKBACK_EXCEEDED, req.blocks[m_blocks - 1].path
        return C.MARKERS_MISSING, req.blocks[m_blocks - 1].path


def _ordinals(req: CanonicalRequest) -> list[int]:
    """Content-block ordinal of every block (option blocks share their successor's ordinal)."""
    counted = accumulate([b.section != "option" for b in req.blocks], initial=0)  # one pass, in C
    out = list(counted)
    out.pop()
    return out
