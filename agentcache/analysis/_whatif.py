"""The ``agentcache`` arm on reported usage: what a session's calls would have cost with agentcache's TTL policy
and keep-warm applied to the recorded pauses.

Without request bodies nothing can be repaired, but two of agentcache's levers depend only on time and size, and
the log has both (Anthropic prompt caching; platform.claude.com/docs/en/build-with-claude/prompt-caching):

* **TTL policy** (:func:`agentcache.policies.choose_ttl`): before each call, the session's pauses so far decide 5m
  or 1h for what the call writes; a 1h write costs 2× the base input price instead of 1.25×, and its entry
  survives pauses up to an hour. A client's own 1h TTL is kept (markers in = markers out), never shortened.
* **keep-warm** (:func:`agentcache.policies.expected_pause`, :func:`agentcache.policies.plan_keep_warm`, as the
  proxy's keep-warm plans it after each turn): when the session has paused longer than the TTL before, refresh
  requests read the cached prefix (0.1×) every ``interval`` seconds, at most ``count`` times, so the entry is alive
  when the next call comes. Refreshes sent into a pause longer than planned are paid and lost.

A call the client lost to ``ttl.expired`` (:mod:`agentcache.analysis._inferred`) whose entry the policies keep
alive reads those tokens instead (``saved_by``: ``keep_warm`` or ``ttl``). Every decision uses only what was known
before the call (past pauses, never the pause to come), so the arm is what agentcache would have done, and it can
cost more than the client where a policy does not pay. Calls on other caches (OpenAI's automatic cache, engines)
keep their reported usage: agentcache has no time-only lever there.
"""

from __future__ import annotations

import itertools
from collections.abc import Sequence
from dataclasses import dataclass

from ..loaders import UsageRecord
from ..model._causes import TTL_EXPIRED
from ..model._rules import AnthropicRules, anthropic_rules
from ..model._usage import CacheUsage, served_by
from ..policies import KeepWarmDecision, choose_ttl, expected_pause, plan_keep_warm
from ..simulate import SimUsage
from ..targets import cost_usd
from ._inferred import CallLoss, cached_after, read_instead

__all__ = ["WhatIf", "priced", "what_if"]


@dataclass(frozen=True, slots=True)
class WhatIf:
    """One call under agentcache's policies. ``usage``: its tokens and USD. ``refreshes``: keep-warm requests sent
    in the pause before it, and ``refresh``: their tokens and USD summed (None when none). ``ttl``: the TTL its
    writes would use (``5m``/``1h``; None off Anthropic). ``saved_by``: ``keep_warm`` or ``ttl`` when it reads what
    the client had to write again after a pause, else None."""

    usage: SimUsage
    refreshes: int = 0
    refresh: SimUsage | None = None
    ttl: str | None = None
    saved_by: str | None = None


def priced(usage: CacheUsage, model: str) -> SimUsage:
    """Reported ``usage`` with its input-side USD at ``model``'s prices on the cache that served it
    (:func:`agentcache.targets.cost_usd`; 0 where agentcache has no prices, such as an engine)."""
    return SimUsage.of(usage, cost_usd(usage, served_by(usage), model) or 0.0)


def what_if(calls: Sequence[UsageRecord], losses: Sequence[CallLoss], ttl_policy: str = "auto") -> list[WhatIf]:
    """One :class:`WhatIf` per call of one session (``calls`` in time order, ``losses`` from
    :func:`~agentcache.analysis._inferred.infer_losses`). ``ttl_policy``: ``auto``, or ``5m``/``1h`` pinned (the
    ``ttl_policy`` setting)."""
    out: list[WhatIf] = []
    times: list[float] = []
    plan: _Plan | None = None
    ttl_s: float | None = None  # the TTL of the entry the previous call left, under the policies
    for call, loss in zip(calls, losses, strict=True):
        if served_by(call.usage) != "anthropic" or call.at is None:
            out.append(WhatIf(priced(call.usage, call.model)))
            continue
        rules = anthropic_rules(call.model)
        refreshes, refresh, touched = _refreshes(plan, times, call, rules)
        alive = ttl_s is not None and loss.gap is not None and call.at - touched <= ttl_s
        saved_by = None
        usage = call.usage
        if loss.cause == TTL_EXPIRED and alive:
            saved_by = "keep_warm" if refreshes else "ttl"
            usage = read_instead(usage, loss.lost)
        gaps = [b - a for a, b in itertools.pairwise([*times, call.at])] if times else None
        ttl = _ttl(call.usage, usage, gaps, rules, ttl_policy)
        out.append(WhatIf(_at_ttl(usage, ttl, call.model), refreshes, refresh, ttl, saved_by))
        times.append(call.at)
        ttl_s = rules.ttl_1h_seconds if ttl == "1h" else rules.ttl_5m_seconds
        plan = _plan(times, cached_after(call.usage), ttl_s, rules)
    return out


def _refreshes(
    plan: _Plan | None, times: list[float], call: UsageRecord, rules: AnthropicRules
) -> tuple[int, SimUsage | None, float]:
    """Keep-warm requests sent between the previous call and ``call`` (each reads the cached prefix), their usage,
    and when the entry was last touched (the previous call, or the last refresh)."""
    if not times or call.at is None:
        return 0, None, call.at or 0.0
    last = times[-1]
    if plan is None:
        return 0, None, last
    d, prefix = plan.decision, plan.prefix
    gap = call.at - last
    sent = 0 if gap <= d.first_at else min(d.count, int((gap - d.first_at) // d.interval) + 1)
    if sent == 0:
        return 0, None, last
    cost = rules.cost(0, prefix, 0, 0) * sent
    touched = last + d.first_at + (sent - 1) * d.interval
    return sent, SimUsage(prefix * sent, prefix * sent, 0, 0, cost), touched


@dataclass(frozen=True, slots=True)
class _Plan:
    """Keep-warm planned after a call: the policy's ``decision`` and the cached ``prefix`` (tokens) each refresh
    reads."""

    decision: KeepWarmDecision
    prefix: int


def _plan(times: list[float], prefix: int, ttl_s: float, rules: AnthropicRules) -> _Plan | None:
    """What keep-warm plans after the session's latest call (``times``): refreshes when past pauses make one
    expected and refreshing is cheaper than rewriting ``prefix`` tokens; else None."""
    expected = expected_pause(times, rules)
    if expected is None or prefix <= 0:
        return None
    decision = plan_keep_warm(expected, ttl_s, prefix, rules)
    return _Plan(decision, prefix) if decision.send else None


def _ttl(reported: CacheUsage, usage: CacheUsage, gaps: list[float] | None, rules: AnthropicRules, policy: str) -> str:
    """The TTL of the call's writes: the client's 1h kept (``reported`` all 1h); else the policy's choice from the
    pauses so far, for the prefix the call reads and the tokens it writes under the policies (``usage``)."""
    if reported.cache_write_tokens and reported.cache_write_1h_tokens == reported.cache_write_tokens:
        return "1h"
    return choose_ttl(gaps, usage.cache_read_tokens, usage.cache_write_tokens, rules, policy).ttl


def _at_ttl(usage: CacheUsage, ttl: str, model: str) -> SimUsage:
    """``usage`` priced with its writes at ``ttl`` (a 1h choice turns its 5m writes into 1h writes)."""
    w1h = usage.cache_write_tokens if ttl == "1h" else usage.cache_write_1h_tokens
    rules = anthropic_rules(model)
    five = usage.cache_write_tokens - w1h
    cost = rules.cost(usage.uncached_tokens, usage.cache_read_tokens, five, w1h)
    return SimUsage(
        usage.prompt_tokens, usage.cache_read_tokens, usage.cache_write_tokens, usage.uncached_tokens, cost, w1h
    )
