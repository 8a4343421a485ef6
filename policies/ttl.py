"""TTL choice (5m or 1h) and keep-warm decisions for Anthropic cache entries.

The decision compares expected input cost over the next turn, in units of base-price input tokens,
with ``P`` = tokens already cached (read this turn) and ``T`` = new tokens this turn writes:

* 5m: ``w5·T + p5·w5·(P+T) + (1−p5)·r·(P+T)``: if the next gap exceeds 5 minutes (probability
  ``p5``) the whole prefix is written again;
* 1h: ``w1·T + p1·w1·(P+T) + (1−p1)·r·(P+T)``.

``w5``, ``w1``, ``r`` are the write/read multipliers of ``AnthropicRules`` (1.25, 2, 0.1: platform.claude.com/
docs/en/about-claude/pricing, "5-minute cache writes 1.25x base input, 1-hour cache writes 2x, cache hits
0.1x"; the numbers live in ``models.toml``). A hit
refreshes the TTL, so only the new tail pays the 1h premium. ``p`` is estimated from the session's
observed gaps with a weak prior (``(n_long + 0.1) / (n + 2.1)``); with no timing information (recorded
traffic without timestamps) no gap is assumed to be long and 5m is kept.

Subagents: a subagent's first request has no gaps of its own, and what decides whether its new entries are read
again is when its lineage's next subagent comes. So its gaps are the lineage's subagent launches (``source``
``siblings``: seconds between the first requests of the lineage's subagents, this one included). Siblings
launched together (gaps of seconds) keep 5m; 1h is chosen only when the launches are observed more than 5
minutes apart and the expected rewrites pay for the 2× write — not for every subagent, the trap of
claude-code#74318, where a blanket 1h TTL for subagents cost 8.6% more than 5m.

A keep-warm request (a prefill-only request that reads the prefix, refreshing its TTL) is worth
sending when ``k·r·(P+T) < (w5 − r)·(P+T)`` for the ``k`` refreshes needed to bridge the expected gap.
"""

from __future__ import annotations

import functools
import itertools
import math
from collections.abc import Sequence
from dataclasses import dataclass

from agentcache.model._rules import AnthropicRules

_PRIOR_LONG, _PRIOR_N = 0.1, 2.1
_DECAY = 0.85


@dataclass(frozen=True, slots=True)
class TTLDecision:
    """The chosen TTL and why. Costs are in base-price input tokens (multiply by the model's USD/token)."""

    ttl: str
    p_long_5m: float
    p_long_1h: float
    prefix_tokens: int
    new_tokens: int
    expected_cost_5m: float
    expected_cost_1h: float
    reason: str


@dataclass(frozen=True, slots=True)
class KeepWarmDecision:
    """Send ``count`` prefill-only requests, the first at ``first_at`` seconds after the last request
    and then every ``interval`` seconds, when that is cheaper than rewriting the prefix."""

    send: bool
    first_at: float
    interval: float
    count: int
    cost_keep_warm: float
    cost_expire: float
    reason: str


def long_gap_probability(gaps: Sequence[float], limit: float, decay: float = _DECAY) -> float:
    """Estimated probability that the next gap exceeds ``limit`` seconds: recent gaps weigh more
    (weight ``decay**age``), so a session whose long pauses are over soon stops paying for 1h."""
    weights, total = _weights(len(gaps), decay)
    n_long = sum(w for w, g in zip(weights, gaps, strict=True) if g > limit)
    return (n_long + _PRIOR_LONG) / (total + _PRIOR_N)


@functools.lru_cache(maxsize=64)
def _weights(n: int, decay: float) -> tuple[tuple[float, ...], float]:
    """The weights of ``n`` gaps, oldest first, and their sum: the same for every turn with ``n`` gaps (a session
    keeps its last 32), so computed once, not twice a turn."""
    weights = tuple(decay**age for age in range(n - 1, -1, -1))
    return weights, sum(weights)


def choose_ttl(
    gaps: Sequence[float] | None,
    prefix_tokens: int,
    new_tokens: int,
    rules: AnthropicRules,
    pinned: str = "auto",
    source: str = "session",
) -> TTLDecision:
    """Pick 5m or 1h for the markers this turn writes. ``gaps``: the session's past inter-request gaps
    in seconds, or None when the traffic carries no timestamps. ``pinned``: ``auto``, ``5m`` or ``1h``.
    ``source``: whose gaps they are, for the reason (``session``, or ``siblings``: see the module docstring)."""
    if gaps is None or pinned != "auto":
        ttl = pinned if pinned != "auto" else "5m"
        why = f"pinned to {ttl} by settings" if pinned != "auto" else "no timing information: 5m"
        return TTLDecision(ttl, 0.0, 0.0, prefix_tokens, new_tokens, 0.0, 0.0, why)
    p5 = long_gap_probability(gaps, rules.ttl_5m_seconds)
    p1 = long_gap_probability(gaps, rules.ttl_1h_seconds)
    whole = prefix_tokens + new_tokens
    w5, w1, r = rules.write_5m_multiplier, rules.write_1h_multiplier, rules.read_multiplier
    c5 = w5 * new_tokens + p5 * w5 * whole + (1 - p5) * r * whole
    c1 = w1 * new_tokens + p1 * w1 * whole + (1 - p1) * r * whole
    ttl = "1h" if c1 < c5 else "5m"
    kind = "sibling launch gaps" if source == "siblings" else "gaps"
    reason = (
        f"{len(gaps)} {kind} seen, P(gap>5m)={p5:.2f}: expected cost 5m={c5:,.0f} vs 1h={c1:,.0f} "
        f"token-equivalents over the next turn ({prefix_tokens:,} cached + {new_tokens:,} new)"
    )
    return TTLDecision(ttl, p5, p1, prefix_tokens, new_tokens, c5, c1, reason)


def expected_pause(times: Sequence[float], rules: AnthropicRules) -> float | None:
    """The pause keep-warm plans for after a session's last request: the median of its past gaps (``times``: its
    requests' times in seconds) longer than the 5m TTL; None when it has had no such pause (nothing to expect)."""
    long = sorted(b - a for a, b in itertools.pairwise(times) if b - a > rules.ttl_5m_seconds)
    return long[len(long) // 2] if long else None


def plan_keep_warm(
    expected_gap: float, ttl_seconds: float, prefix_tokens: int, rules: AnthropicRules, margin: float = 30.0
) -> KeepWarmDecision:
    """Whether to keep an entry of ``prefix_tokens`` alive across an ``expected_gap`` (seconds)."""
    interval = max(ttl_seconds - margin, 1.0)
    count = max(0, math.ceil(expected_gap / interval) - 1)
    keep = count * rules.read_multiplier * prefix_tokens
    expire = (rules.write_5m_multiplier - rules.read_multiplier) * prefix_tokens
    if count == 0:
        return KeepWarmDecision(False, 0.0, interval, 0, 0.0, 0.0, "the entry outlives the expected gap")
    send = keep < expire
    reason = f"{count} refreshes cost {keep:,.0f} vs rewriting {expire:,.0f} token-equivalents"
    return KeepWarmDecision(send, interval, interval, count if send else 0, keep, expire, reason)
