"""The target strategy: everything that depends on whose cache a session's requests are planned for.

A :class:`Target` is chosen once per session (:func:`agentcache.targets.resolve_target`) and owns, for that
target, the cache rules, the planning of markers and routing keys, the storage tier a report names, the cost of
reported usage, the simulator the reports replay requests through, and keep-warm. The session pipeline calls
these hooks and never compares target names itself: the shape of SGLang's per-component hooks behind one radix
tree (``unified_cache/components/base.py``), where only the essential hooks are abstract and the rest default to
doing nothing.
"""

from __future__ import annotations

from abc import ABC, abstractmethod
from collections.abc import Mapping
from dataclasses import dataclass, field
from typing import Any, ClassVar

from .._config import Settings
from ..model._canonical import CanonicalRequest, Marker
from ..model._fields import StorageTier
from ..model._plan import WirePlan
from ..model._types import Api, Engine, TargetKind
from ..model._usage import CacheUsage
from ..policies import KeepWarmDecision, KeyPlanner, TTLDecision
from ..simulate import Concurrency, Simulator

__all__ = ["PlanInput", "Target", "TargetPlan"]


@dataclass(frozen=True, slots=True)
class PlanInput:
    """What a target plans from. ``request``: the request after repairs, carrying only the client's markers.
    ``sent``: what the session sent last (None for its first request). ``times``: the session's past request
    times (seconds), ``timed`` False once a request came without one, ``now`` this request's time (None:
    unknown). ``ephemeral_tail``/``rewrite_at``: what the session's history says about its client
    (:class:`~agentcache.policies.PlanHints`). ``routing_key``: the key the session (or its lineage) already
    carries. ``keys``: the cache scope's key planner. ``repaired``: the repairs re-sent an earlier form of some
    unit (so markers must be written even where the target adds none). ``previous_response``: the id of the
    response to the session's last request, when it arrived (for provider diagnostics). ``sibling_at``: a
    subagent's first request shares this many blocks with its sibling's (their shared prefix), or None.
    ``spawns``: for a subagent's first request, the times of its lineage's earlier subagents' first requests
    (seconds; the TTL policy's gaps for it)."""

    api: Api
    request: CanonicalRequest
    sent: CanonicalRequest | None
    settings: Settings
    now: float | None = None
    times: tuple[float, ...] = ()
    timed: bool = True
    ephemeral_tail: int = 0
    rewrite_at: int | None = None
    routing_key: str | None = None
    lineage: str = ""
    keys: KeyPlanner | None = None
    repaired: bool = False
    previous_response: str | None = None
    sibling_at: int | None = None
    spawns: tuple[float, ...] = ()


@dataclass(frozen=True, slots=True)
class TargetPlan:
    """A target's decisions for one request. ``wire``: the changes on the wire body (markers, top-level marker,
    routing key). ``markers``: block index → marker of the planned request, or None when the request keeps the
    markers it has; ``top``: its top-level marker (Anthropic automatic caching) when ``markers`` is set.
    ``paths``/``reasons``: the marked blocks' paths and why each was chosen. ``ttl``: the TTL decision
    (Anthropic). ``reshapes``: writing the markers turns a string unit into a text block, so the sent body must be
    read again. ``routing_key``: the ``prompt_cache_key`` this request carries because agentcache chose it;
    ``family``: the routing family it was chosen for (:func:`~agentcache.targets.family_of`; the key planner counts
    the request on commit)."""

    wire: WirePlan = field(default_factory=WirePlan)
    markers: Mapping[int, Marker] | None = None
    top: Marker | None = None
    paths: tuple[str, ...] = ()
    reasons: tuple[str, ...] = ()
    ttl: TTLDecision | None = None
    reshapes: bool = False
    routing_key: str | None = None
    family: str | None = None


class Target(ABC):
    """Whose cache a session plans for. Subclasses: :class:`~agentcache.targets.AnthropicTarget`,
    :class:`~agentcache.targets.OpenAITarget`, :class:`~agentcache.targets.EngineTarget`. ``model``: rules and
    prices as this model instead of each request's own."""

    kind: ClassVar[TargetKind]
    engine: Engine | None = None

    def __init__(self, model: str | None = None) -> None:
        self.model = model

    @property
    def name(self) -> str:
        """``anthropic``, ``openai`` or ``engine`` (the value reports and metrics carry)."""
        return self.kind.value

    @abstractmethod
    def plan(self, inp: PlanInput) -> TargetPlan:
        """The target's markers and routing key for one repaired request (pure)."""

    @abstractmethod
    def storage_tier(self, plan: TargetPlan, planned: CanonicalRequest, usage: CacheUsage | None) -> StorageTier:
        """Where the reused prefix of a request planned with ``plan`` lives, and for how long."""

    def diagnostics(self, inp: PlanInput) -> WirePlan:
        """The request edit that asks the provider why the request missed its cache (setting
        ``provider_diagnostics``), or an empty plan when the target has no such feature."""
        return WirePlan()

    def cost(self, usage: CacheUsage, model: str | None) -> float | None:
        """Input-side USD of reported ``usage`` for ``model``; None when unpriced (an engine). A provider prices a
        model its table does not know as its default model (``agentcache/data/models.toml``)."""
        return None

    def simulator(self, model: str | None = None, concurrency: Concurrency | None = None) -> Simulator | None:
        """A fresh simulator of this target's cache (for reports), or None. ``concurrency``: model overlapping
        requests (:class:`~agentcache.simulate.Concurrency`; Anthropic only, ignored elsewhere)."""
        return None

    def keep_warm(
        self, sent: CanonicalRequest, times: tuple[float, ...], expected_gap: float | None
    ) -> KeepWarmDecision | None:
        """Whether prefill-only requests should keep ``sent``'s prefix cached across the next pause."""
        return None

    def keep_warm_body(self, sent_body: Mapping[str, Any]) -> dict[str, Any] | None:
        """The last sent body as a keep-warm request, or None when the target has none."""
        return None

    def __repr__(self) -> str:
        model = f", model={self.model!r}" if self.model else ""
        engine = f"{self.engine.value!r}" if self.engine is not None else ""
        return f"{type(self).__name__}({engine}{model})"

    def __eq__(self, other: object) -> bool:
        return type(other) is type(self) and vars(other) == vars(self)

    def __hash__(self) -> int:
        return hash((type(self), self.engine, self.model))
