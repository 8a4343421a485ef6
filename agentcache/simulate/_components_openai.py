"""OpenAI's prompt-cache rules as components with a veto (see :mod:`agentcache.simulate._components`).

Automatic caching (:data:`OPENAI`): the request walks down the routed machine's entries from its first block while
they hold it (:class:`RoutingKey`, the tree); the boundary is the deepest of those :class:`LastUseTTL` accepts;
then :class:`MinimumLength` and :class:`Granularity` cap the tokens read. Breakpoint models
(:data:`OPENAI_BREAKPOINTS`): the boundary is the deepest block with an entry :class:`ExpiryTTL` accepts, capped by
the minimum. A read short of the matched prefix is explained at the ``request`` site, first refusal in that order.
"""

from __future__ import annotations

from dataclasses import dataclass

from ..model import _causes as C
from ..model._canonical import CanonicalRequest
from ..model._rules import OpenAIRules
from ._components import Component, MinimumLength, Refusal, Rule, Site, Validator

__all__ = [
    "OPENAI",
    "OPENAI_BREAKPOINTS",
    "ExpiryTTL",
    "Granularity",
    "LastUseTTL",
    "OpenAIBreakpoints",
    "OpenAIProbe",
    "RoutingKey",
    "cached_tokens",
]


@dataclass(slots=True)
class OpenAIProbe:
    """One OpenAI request against the machine its routing partition landed on, at ``now`` (seconds). ``part``:
    that machine's entries by chain hash (automatic: the last use; breakpoint models: the expiry); ``ttl``: the
    seconds an automatic entry lives after its last use. ``present``: leading blocks the machine holds
    (automatic); ``depth``: the boundary, in blocks; ``m_blocks``, ``matched``: the matched prefix in blocks and
    tokens."""

    req: CanonicalRequest
    rules: OpenAIRules
    part: dict[bytes, float]
    now: float
    ttl: float
    m_blocks: int
    matched: int
    present: int = 0
    depth: int = 0

    @property
    def minimum(self) -> int:
        """The model's minimum cacheable prefix, tokens."""
        return self.rules.min_cacheable_tokens


def cached_tokens(tokens: int, rules: OpenAIRules) -> int:
    """Tokens OpenAI reports as cached for a ``tokens``-long cached prefix (0 below the minimum)."""
    if tokens < rules.min_cacheable_tokens:
        return 0
    step = rules.hit_increment_tokens
    return rules.min_cacheable_tokens + (tokens - rules.min_cacheable_tokens) // step * step


class RoutingKey(Rule[OpenAIProbe]):
    """``cache_key.changed``: only requests routed alike (the hash of the first ~256 tokens joined with
    ``prompt_cache_key``) share entries; the machine a request lands on must hold its prefix. Refuses a request
    with a key whose matched prefix the machine lacks (automatic: part of it; breakpoint models: all of it)."""

    cause = C.CACHE_KEY_CHANGED

    @staticmethod
    def held(probe: OpenAIProbe) -> int:
        """Leading blocks of the request the machine holds (automatic caching writes every prefix of a request)."""
        part, n = probe.part, 0
        for h in probe.req.chain:
            if h not in part:
                break
            n += 1
        return n

    def validator(self, probe: OpenAIProbe) -> Validator:
        part, chain = probe.part, probe.req.chain
        return lambda i: chain[i] in part

    def refusal(self, probe: OpenAIProbe, site: Site, i: int) -> Refusal | None:
        req = probe.req
        if site != "request" or not req.cache_key:
            return None
        if probe.rules.breakpoints:
            lacks = not any(h in probe.part for h in req.chain[: probe.m_blocks])
        else:
            lacks = probe.present < probe.m_blocks
        return self.refuse("prompt_cache_key") if lacks else None


class LastUseTTL(Rule[OpenAIProbe]):
    """``ttl.expired`` (automatic caching): an entry lives ``ttl`` seconds after its last use. Refuses a request
    whose machine holds blocks past the boundary that expired (at the first of them)."""

    cause = C.TTL_EXPIRED

    def validator(self, probe: OpenAIProbe) -> Validator:
        part, chain, now, ttl = probe.part, probe.req.chain, probe.now, probe.ttl

        def fresh(i: int) -> bool:
            last = part.get(chain[i])
            return last is not None and now - last <= ttl

        return fresh

    def refusal(self, probe: OpenAIProbe, site: Site, i: int) -> Refusal | None:
        if site == "request" and probe.present > probe.depth:
            return self.refuse(probe.req.blocks[probe.depth].path)
        return None


class ExpiryTTL(Rule[OpenAIProbe]):
    """``ttl.expired`` (breakpoint models): an entry lives until its expiry (30 minutes from its last use). Refuses
    a request with an expired entry deeper than the boundary."""

    cause = C.TTL_EXPIRED

    def validator(self, probe: OpenAIProbe) -> Validator:
        part, chain, now = probe.part, probe.req.chain, probe.now

        def alive(i: int) -> bool:
            expires = part.get(chain[i])
            return expires is not None and expires > now

        return alive

    def refusal(self, probe: OpenAIProbe, site: Site, i: int) -> Refusal | None:
        if site != "request":
            return None
        part, now = probe.part, probe.now
        chain = probe.req.chain
        for j in range(probe.depth, len(chain)):
            expires = part.get(chain[j])
            if expires is not None and expires <= now:
                return self.refuse(None)
        return None


class Granularity(Rule[OpenAIProbe]):
    """OpenAI reports hits in ``hit_increment_tokens`` (128) steps above the minimum (:func:`cached_tokens`). The
    tokens it rounds away have no cause name (docs/design.md lists none)."""

    def tokens(self, probe: OpenAIProbe, tokens: int) -> int:
        return cached_tokens(tokens, probe.rules)


class OpenAIBreakpoints(Rule[OpenAIProbe]):
    """``markers.missing`` (breakpoint models): a hit is an entry a breakpoint wrote; refuses any request the
    components before it accept (no breakpoint wrote where this request could read)."""

    cause = C.MARKERS_MISSING

    def refusal(self, probe: OpenAIProbe, site: Site, i: int) -> Refusal | None:
        return self.refuse(None) if site == "request" else None


#: Automatic caching's components in the order a loss is explained (the first refusal is the cause).
OPENAI: tuple[Component[OpenAIProbe], ...] = (MinimumLength("tokens"), RoutingKey(), LastUseTTL(), Granularity())
#: Breakpoint models' components, in the same order.
OPENAI_BREAKPOINTS: tuple[Component[OpenAIProbe], ...] = (
    MinimumLength("tokens"),
    RoutingKey(),
    ExpiryTTL(),
    OpenAIBreakpoints(),
)
