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

Each rule is a component with a veto (:mod:`agentcache.simulate._components`): a breakpoint reads the deepest
block of its lookback window that every component accepts, and a shorter read than the matched prefix is
explained by the first component, in their documented order, that refuses.

Simplifications, documented: token counts are tiktoken estimates; blocks are the matching unit.
"""

from __future__ import annotations

from dataclasses import dataclass, field

from ..model import _causes as C
from ..model._canonical import CanonicalRequest
from ..model._rules import anthropic_rules
from ._base import Concurrency, ModelScopes, SeenIndex, SimResult, SimUsage
from ._components import (
    ANTHROPIC_CHECKS,
    AnthropicProbe,
    Entry,
    Lookback,
    MarkerRules,
    MinimumLength,
    breakpoints,
    deepest,
    explain_anthropic,
    last_cacheable,
    markers_valid,
    validators,
)

__all__ = ["MAX_HOLDS", "AnthropicSimulator", "breakpoints", "last_cacheable", "markers_valid"]

#: Hold times a coalescing simulator keeps (for the distribution; the rest are only counted in results).
MAX_HOLDS = 100_000


@dataclass(slots=True)
class _Scope:
    entries: dict[bytes, Entry] = field(default_factory=dict)
    seen: SeenIndex = field(default_factory=SeenIndex)
    #: Entries written on a block that is not its message's first, by the chain hash of the block before it (the
    #: same message's): when that entry expires. A request that stops matching right there, where its message
    #: ends, had the marker on a trailing block its client dropped (``markers.invalid``).
    trailing: dict[bytes, float] = field(default_factory=dict)


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
        model = self._model or req.model
        rules = anthropic_rules(model)
        scope = self._scopes.get(model)
        m_blocks = scope.seen.depth(req)
        matched = req.tokens_before(m_blocks)
        prompt = req.tokens
        marks = breakpoints(req)
        if MarkerRules.rejects(req, rules, marks):  # the provider answers 400: nothing read or written
            usage = SimUsage(prompt, 0, 0, prompt, rules.cost(prompt, 0, 0, 0))
            return SimResult(usage, matched, C.MARKERS_INVALID, None, rejected=True)

        hold = conc.hold if conc is not None and conc.coalesce else -1.0
        bps = [(i, rules.ttl_1h_seconds if m.ttl == "1h" else rules.ttl_5m_seconds) for i, m in marks]
        probe = AnthropicProbe(req, rules, scope.entries, scope.trailing, now, hold, bps)
        hits: list[int] = []
        wait = 0.0
        if bps:  # each breakpoint reads the deepest block of its lookback window every component accepts
            checks = validators(ANTHROPIC_CHECKS, probe)
            hits = [h for w in Lookback.windows(probe) if (h := deepest(w, checks)) >= 0]
            wait = max([scope.entries[req.chain[e]].readable - now for e in hits], default=0.0)
        if wait > 0:  # coalesced: the request is sent when the writer answered
            if len(self.holds) < MAX_HOLDS:
                self.holds.append(wait)
            now += wait
        else:
            wait = 0.0
        probe.now, probe.read_idx, probe.m_blocks, probe.matched = now, max(hits, default=-1), m_blocks, matched
        read = req.tokens_before(probe.read_idx + 1)
        cause, where = explain_anthropic(probe) if read < matched else (None, None)
        # Mutate only after the explanation, which needs the state the request found.
        write5, write1h = self._write(probe, scope, hits, ttft) if bps else (0, 0)  # only breakpoints write
        scope.seen.add(req)
        uncached = prompt - read - write5 - write1h
        usage = SimUsage(prompt, read, write5 + write1h, uncached, rules.cost(uncached, read, write5, write1h), write1h)
        return SimResult(usage, matched, cause, where, held_s=wait)

    @staticmethod
    def _write(probe: AnthropicProbe, scope: _Scope, hits: list[int], ttft: float) -> tuple[int, int]:
        """Refresh the entries read, write one past the read point at every breakpoint long enough; returns the
        tokens written ``(5m, 1h)``."""
        req, rules, now, read_idx = probe.req, probe.rules, probe.now, probe.read_idx
        for e in hits:
            hit = scope.entries[req.chain[e]]
            hit.expires = now + hit.ttl
        long_enough = MinimumLength.reaches(probe)  # the rule that vetoes reads also vetoes writes
        write5 = write1h = 0
        covered = read_idx
        for b, ttl in probe.bps:
            ent = scope.entries.get(req.chain[b])
            if b <= read_idx:
                # Already read: nothing is written here (Anthropic bills writes only past the highest
                # hit); an entry that exists was used, so its TTL is refreshed.
                if ent is not None and ent.expires > now:
                    ent.expires = max(ent.expires, now + ent.ttl)
                continue
            if not long_enough(b):
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
            scope.entries[req.chain[b]] = Entry(now + ttl, ttl, readable)
            if b and req.blocks[b].message is not None and req.blocks[b - 1].message == req.blocks[b].message:
                scope.trailing[req.chain[b - 1]] = now + ttl
        return write5, write1h
