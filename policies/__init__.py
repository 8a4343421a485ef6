"""Pure decisions over the canonical model (``agentcache.policies``).

Policies import only the core model; they return frozen decisions that adapters apply to the wire.
"""

from __future__ import annotations

from .breakpoints import BreakpointPlan, plan_breakpoints

__all__ = ["BreakpointPlan", "plan_breakpoints"]
