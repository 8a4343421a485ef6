"""OpenAI ``prompt_cache_key`` strategies as audit arms (``audit --compare`` on OpenAI traffic).

OpenAI routes a request by a hash of its first ~256 tokens joined with ``prompt_cache_key``; only requests routed
alike share cache entries, and about 15 requests/min per prefix+key fit one machine before requests overflow to
others (platform.openai.com/docs/guides/prompt-caching, "How it works" and "Best practices"). So the key decides
what a request can reuse. Each strategy takes the request as the client sent it, drops the client's key and
markers and sets its own; none repairs anything:

* ``no_key``: no ``prompt_cache_key`` (routing by the prefix alone);
* ``conversation_key``: one key per conversation (the session id): a session finds its own history, never the
  prefix other sessions wrote;
* ``random_key``: a fresh key on every request (a bug real proxies shipped: a new UUID per call). Here a hash of
  the session and request index, so the audit is reproducible;
* ``lineage_keys``: agentcache's keys (:class:`~agentcache.policies.KeyPlanner`: the routing family plus a
  shard of the session lineage, sharded to stay under ``rpm_per_key``), chosen at a lineage's first request and
  kept, as the OpenAI target keeps them (:mod:`agentcache.targets._openai`);
* ``breakpoints``: ``lineage_keys`` plus the explicit ``prompt_cache_breakpoint`` parts agentcache plans
  (:func:`~agentcache.policies.breakpoints.plan_openai_breakpoints`), only offered when a request's model takes
  them (``[openai.breakpoints]`` in ``agentcache/data/models.toml``: gpt-5.6 and later); on another model the
  markers are not sent, as the provider would not read them.
"""

from __future__ import annotations

import hashlib
from collections.abc import Iterable

from ..model._canonical import CanonicalRequest, with_markers
from ..model._rules import openai_rules
from ..policies import KeyPlanner, PlanHints
from ..policies.breakpoints import plan_openai_breakpoints
from ..targets._openai import family_of

__all__ = ["KEY_STRATEGIES", "KeyArms", "key_strategies"]

#: The strategies every OpenAI comparison has; ``breakpoints`` joins them where a model takes breakpoints.
KEY_STRATEGIES = ("no_key", "conversation_key", "random_key", "lineage_keys")
BREAKPOINTS = "breakpoints"


def key_strategies(models: Iterable[str]) -> tuple[str, ...]:
    """The OpenAI strategies to compare for requests naming ``models``: :data:`KEY_STRATEGIES`, and
    ``breakpoints`` when any of the models takes explicit breakpoints (its row in ``models.toml``)."""
    takes = any(openai_rules(m).breakpoints for m in models)
    return (*KEY_STRATEGIES, BREAKPOINTS) if takes else KEY_STRATEGIES


def _random_key(session: str, request: int) -> str:
    return hashlib.blake2b(f"{session}\x00{request}".encode(), digest_size=8).hexdigest()


class KeyArms:
    """One cache scope's key strategies (see the module docstring). The ``lineage_keys`` and ``breakpoints`` arms
    each draw from their own :class:`~agentcache.policies.KeyPlanner` of ``rpm_per_key`` requests/min per key
    (setting ``openai_rpm_per_key``), which counts every request it keys; a lineage keeps the key of its first
    request (one remembered key per lineage and arm)."""

    def __init__(self, rpm_per_key: float = 15.0) -> None:
        self.rpm_per_key = rpm_per_key
        self._planners: dict[str, KeyPlanner] = {}
        self._keys: dict[tuple[str, str, str], str] = {}

    def apply(
        self, name: str, req: CanonicalRequest, session: str, request: int, lineage: str, at: float | None
    ) -> CanonicalRequest:
        """``req`` (the client's request) keyed by strategy ``name`` for request ``request`` (0-based) of
        ``session``, whose lineage root is ``lineage``, sent at ``at`` (seconds; None when unknown: the key
        planner then keeps one shard). Raises KeyError for an unknown name."""
        bare = with_markers(req, {})
        if name == "no_key":
            return bare.evolve(cache_key=None)
        if name == "conversation_key":
            return bare.evolve(cache_key=session)
        if name == "random_key":
            return bare.evolve(cache_key=_random_key(session, request))
        if name not in (KEY_STRATEGIES[-1], BREAKPOINTS):
            raise KeyError(name)
        planner = self._planners.get(name)
        if planner is None:
            planner = self._planners[name] = KeyPlanner(self.rpm_per_key)
        family = family_of(bare)
        key = self._keys.get((name, family, lineage))
        if key is None:
            key = self._keys[name, family, lineage] = planner.key(family, lineage, at)
        keyed = bare.evolve(cache_key=key)
        planner.record(family, at, lineage)
        rules = openai_rules(req.model)
        if name == KEY_STRATEGIES[-1] or not rules.breakpoints:
            return keyed
        plan = plan_openai_breakpoints(keyed, PlanHints(ttl="30m", mode="own"), rules.max_explicit_with_implicit)
        return with_markers(keyed, plan.markers)
