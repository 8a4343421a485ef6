"""A deterministic model of OpenAI's automatic prompt cache.

Modelled rules (platform.openai.com/docs/guides/prompt-caching; numbers in
``agentcache/data/models.toml``): prompts of at least ``min_cacheable_tokens`` (1024) are cached
automatically; a hit is the longest cached prefix, counted in ``hit_increment_tokens`` (128) steps
above the minimum; requests are routed by a hash of their first ~256 tokens joined with
``prompt_cache_key``, and only requests routed alike share entries; an entry lives
``in_memory_ttl_seconds`` after its last use (``extended_ttl_seconds`` with 24h retention).
No write surcharge.

Overflow ("requests for the same prefix and key above roughly ``requests_per_minute_per_key`` (15) per minute
may overflow to additional machines, reducing cache effectiveness", same page) is modelled only when the
simulator is told its times are real (``overflow=True``; the audit does so when every record has a time): the
first 15 requests of a partition within any 60 s land on its first machine, the next 15 on a second, and so
on, each machine with its own entries. Without times a burst cannot be told from a day of traffic, so nothing
overflows and hit rates are upper bounds. A read lost to overflow has no cause name (docs/design.md lists none).

Models with breakpoints (gpt-5.6 and later, ``OpenAIRules.breakpoints``) are matched exactly at a
breakpoint instead: each request writes at most 4 (in ``implicit`` mode one implicit breakpoint at the
end of the newest message plus the latest 3 explicit ``prompt_cache_breakpoint`` parts; in
``explicit`` mode the latest 4 explicit ones), entries live 30 minutes from their last use, and a
hit is the deepest entry on the request's path, with no lookback limit and no 128-token rounding.

Each rule is a component with a veto (:mod:`agentcache.simulate._components_openai`): the read is the deepest
block they accept, capped by the minimum and the 128-token steps; a shorter read than the matched prefix is
explained by the first component, in their documented order, that refuses.
"""

from __future__ import annotations

import json
from collections import deque
from dataclasses import dataclass, field

from ..model._bounded import bounded
from ..model._canonical import CanonicalRequest
from ..model._rules import openai_rules
from ._base import ModelScopes, SeenIndex, SimResult, SimUsage
from ._components import Refusal, capped, deepest, first_refusal, validators
from ._components_openai import OPENAI, OPENAI_BREAKPOINTS, OpenAIProbe, RoutingKey, cached_tokens

__all__ = ["OpenAISimulator", "cached_tokens", "partition_key", "routing_hash"]

_EXTENDED = ("24h", "extended")
_ROUTING = RoutingKey()
_NONE = Refusal(None, None)


@dataclass(slots=True)
class _Partition:
    """One routing partition (prefix hash + key): its machines' entries (chain hash → last use or expiry) and its
    request times of the last minute (for overflow)."""

    machines: list[dict[bytes, float]] = field(default_factory=lambda: [{}])
    times: deque[float] = field(default_factory=deque)

    def machine(self, now: float, rpm: float | None) -> dict[bytes, float]:
        """The entries of the machine a request at ``now`` lands on (the first one unless ``rpm`` overflows)."""
        if rpm is None:
            return self.machines[0]
        while self.times and self.times[0] <= now - 60.0:
            self.times.popleft()
        index = int(len(self.times) // rpm)
        self.times.append(now)
        while len(self.machines) <= index:
            self.machines.append({})
        return self.machines[index]


@dataclass(slots=True)
class _Scope:
    partitions: dict[tuple[bytes, str], _Partition] = field(default_factory=dict)
    seen: SeenIndex = field(default_factory=SeenIndex)


def routing_hash(req: CanonicalRequest, prefix_tokens: int) -> bytes:
    """Chain hash at the block holding the ``prefix_tokens``-th token (the routing prefix)."""
    for i, total in enumerate(req.cum_tokens):
        if total >= prefix_tokens:
            return req.chain[i]
    return req.chain[-1] if req.chain else b""


def partition_key(cache_key: object) -> str:
    """The partition a ``prompt_cache_key`` routes to: the string itself, ``""`` when absent; a value that is no
    string (a list or an object: the API rejects it, but the simulator must not fail on it) as its JSON text;
    either :func:`~agentcache.model._bounded.bounded` (a client chooses it)."""
    if cache_key is None or isinstance(cache_key, str):
        return bounded(cache_key or "")
    return bounded(json.dumps(cache_key, sort_keys=True, default=repr))


class OpenAISimulator:
    """Replays canonical requests, in time order, through one model of OpenAI's prompt cache. ``overflow``: the
    times given to :meth:`run` are real, so a partition above its per-minute rate overflows (module docstring)."""

    provider = "openai"

    def __init__(self, model: str | None = None, overflow: bool = False):
        self._model = model
        self.overflow = overflow
        self._scopes: ModelScopes[_Scope] = ModelScopes(_Scope)

    def run(self, req: CanonicalRequest, now: float) -> SimResult:
        """Simulate one request; ``now`` in seconds, non-decreasing."""
        model = self._model or req.model
        rules = openai_rules(model)
        scope = self._scopes.get(model)
        m_blocks = scope.seen.depth(req)
        matched = req.tokens_before(m_blocks)
        key = (routing_hash(req, rules.routing_prefix_tokens), partition_key(req.cache_key))
        partition = scope.partitions.get(key)
        if partition is None:
            partition = scope.partitions[key] = _Partition()
        part = partition.machine(now, rules.requests_per_minute_per_key if self.overflow else None)
        ttl = rules.extended_ttl_seconds if (req.retention or "") in _EXTENDED else rules.in_memory_ttl_seconds
        probe = OpenAIProbe(req, rules, part, now, ttl, m_blocks, matched)
        if rules.breakpoints:
            return self._run_breakpoints(probe, scope)
        # The machine's entries are the tree: the request walks down it while it holds the prefix (SGLang's raw
        # match); the boundary is the deepest block of that walk every component accepts.
        probe.present = _ROUTING.held(probe)
        probe.depth = deepest(range(probe.present - 1, -1, -1), validators(OPENAI, probe)) + 1
        prompt = req.tokens
        read = capped(OPENAI, probe, req.tokens_before(probe.depth))
        cause, where = (first_refusal(OPENAI, probe, "request") or _NONE) if read < matched else _NONE
        for h in req.chain:
            part[h] = now
        scope.seen.add(req)
        uncached = prompt - read
        return SimResult(SimUsage(prompt, read, 0, uncached, rules.cost(uncached, read)), matched, cause, where)

    @staticmethod
    def _run_breakpoints(probe: OpenAIProbe, scope: _Scope) -> SimResult:
        req, rules, part, now = probe.req, probe.rules, probe.part, probe.now
        explicit = [i for i, _ in req.markers()]
        mode = str(req.extra.get("cache_mode") or "implicit")
        if mode == "explicit":
            written = explicit[-rules.max_breakpoints_written :]
        else:
            last = max((i for i, b in enumerate(req.blocks) if b.message is not None), default=None)
            written = explicit[-rules.max_explicit_with_implicit :] + ([last] if last is not None else [])
        # No lookback limit: the deepest block on the request's path every component accepts.
        read_idx = deepest(range(len(req.chain) - 1, -1, -1), validators(OPENAI_BREAKPOINTS, probe))
        probe.depth = read_idx + 1
        prompt = req.tokens
        read = capped(OPENAI_BREAKPOINTS, probe, req.tokens_before(probe.depth))
        cause, where = _NONE
        if read < probe.matched:
            cause, where = first_refusal(OPENAI_BREAKPOINTS, probe, "request") or _NONE
        if read_idx >= 0:
            part[req.chain[read_idx]] = now + rules.breakpoint_ttl_seconds
        for i in written:
            if i > read_idx or req.chain[i] not in part:
                part[req.chain[i]] = now + rules.breakpoint_ttl_seconds
        scope.seen.add(req)
        uncached = prompt - read
        usage = SimUsage(prompt, read, 0, uncached, rules.cost(uncached, read))
        return SimResult(usage, probe.matched, cause, where)
