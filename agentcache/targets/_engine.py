"""A local engine (SGLang, llama.cpp, vLLM, or another OpenAI-compatible server): its prefix cache reuses
whatever was computed before, so agentcache only repairs (re-sends the bytes sent before) and pins sessions.

No provider markers are added and the client's own markers stay exactly where it put them; no
``prompt_cache_key`` is added; there is no TTL to bridge and no price. Session pinning on SGLang (a stable
``session_id`` per generation, ``POST /close_session`` on close) is done by :class:`agentcache.SGLangSink`, which
the proxy and ``replay`` register for an SGLang target.
"""

from __future__ import annotations

from ..engine import EngineSimulator
from ..model._canonical import CanonicalRequest
from ..model._fields import StorageTier
from ..model._plan import WirePlan
from ..model._types import Engine, TargetKind
from ..model._usage import CacheUsage
from ..simulate import Concurrency, Simulator
from ._base import PlanInput, Target, TargetPlan

__all__ = ["EngineTarget"]


class EngineTarget(Target):
    """A self-hosted engine (see the module docstring). ``engine``: which one (``other`` when unknown)."""

    kind = TargetKind.ENGINE

    def __init__(self, engine: Engine = Engine.OTHER, model: str | None = None) -> None:
        super().__init__(model)
        self.engine = engine

    def plan(self, inp: PlanInput) -> TargetPlan:
        """Nothing of its own. When a repair re-sent an earlier form of some unit, the client's current markers
        are written back as it sent them (their raw values), so the earlier form's markers do not come back."""
        if not inp.repaired:
            return TargetPlan()
        marks = tuple((inp.request.blocks[i].path, m) for i, m in inp.request.markers())
        return TargetPlan(WirePlan(markers=marks))

    def storage_tier(self, plan: TargetPlan, planned: CanonicalRequest, usage: CacheUsage | None) -> StorageTier:
        """Engine storage; the tiers the read tokens came from when the engine reports them (SGLang HiCache)."""
        return StorageTier("engine", None, dict(usage.tiers) if usage is not None else {})

    def simulator(self, model: str | None = None, concurrency: Concurrency | None = None) -> Simulator:
        """:class:`~agentcache.engine.EngineSimulator` (a shared, unbounded prefix cache)."""
        return EngineSimulator(model or self.model)
