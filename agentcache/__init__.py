"""agentcache: keep LLM agents' prompt prefixes cache-stable, prove it with numbers, explain every miss.

The public surface, in four doors over one core:

* ``wrap(client, session=...)``: the Anthropic and OpenAI SDK clients in an agent loop;
* ``agentcache proxy`` (``agentcache.proxy``): a drop-in HTTP proxy for agents you cannot change;
* ``agentcache serve`` (``agentcache.serve``): SGLang or llama.cpp with the proxy in front;
* ``audit(records)`` and ``agentcache replay`` (``agentcache.replay``): recorded traffic analysed and replayed.

All four drive the same session core (:class:`Sessions`, :class:`Session`, :class:`Turn`, :class:`SessionPipeline`
over a :class:`SessionStore`), resolve the same :class:`Target` per session and report the same four fields
(:class:`TurnReport`). The library logs through :mod:`logging` and prints nothing unless the host configures it.

Each public name is imported on first use (PEP 562), so ``import agentcache`` (and the command line, whose
modules live in this package) does not pay for the proxy, the analyses and the SDK glue it does not touch.
"""

from __future__ import annotations

import importlib
import types
from typing import TYPE_CHECKING, Any

if TYPE_CHECKING:  # what type checkers and readers see; at run time each name is imported on first use
    from ._audit import audit
    from ._config import Settings, configure, get_settings, load_settings, reset_settings
    from ._exceptions import AgentCacheError, ConfigError, InputError, InternalError, UnknownFormatError
    from ._wrap import wrap
    from .analysis._diagnose import Divergence, diagnose
    from .analysis._ledger import Ledger
    from .analysis._report import ArmMetrics, AuditReport, BreakRecord, MissRecord, SessionReport, TurnRecord
    from .model._canonical import Block, CanonicalRequest, Marker
    from .model._causes import Cause
    from .model._fields import LifecycleEvent, PrefixIdentity, ReuseBoundary, SessionSignal, StorageTier, TurnReport
    from .model._plan import WirePlan
    from .model._totals import UsageTotals
    from .model._types import Api, Engine, TargetKind
    from .model._usage import CacheUsage, normalize_usage
    from .model._usage_stream import UsageAccumulator
    from .session import (
        AsyncSessionStore,
        Identity,
        MemoryStore,
        Prepared,
        PrometheusSink,
        Session,
        SessionClosedError,
        SessionPipeline,
        Sessions,
        SessionStore,
        SGLangSink,
        StoreUnavailable,
        Tombstone,
        Turn,
    )
    from .session._redis import RedisStore
    from .targets import AnthropicTarget, EngineTarget, OpenAITarget, Target, cost_usd, resolve_target

__version__ = "0.1.0"  # the one place a release bumps (pyproject.toml reads it)

__all__ = [
    "AgentCacheError",
    "AnthropicTarget",
    "Api",
    "ArmMetrics",
    "AsyncSessionStore",
    "AuditReport",
    "Block",
    "BreakRecord",
    "CacheUsage",
    "CanonicalRequest",
    "Cause",
    "ConfigError",
    "Divergence",
    "Engine",
    "EngineTarget",
    "Identity",
    "InputError",
    "InternalError",
    "Ledger",
    "LifecycleEvent",
    "Marker",
    "MemoryStore",
    "MissRecord",
    "OpenAITarget",
    "PrefixIdentity",
    "Prepared",
    "PrometheusSink",
    "RedisStore",
    "ReuseBoundary",
    "SGLangSink",
    "Session",
    "SessionClosedError",
    "SessionPipeline",
    "SessionReport",
    "SessionSignal",
    "SessionStore",
    "Sessions",
    "Settings",
    "StorageTier",
    "StoreUnavailable",
    "Target",
    "TargetKind",
    "Tombstone",
    "Turn",
    "TurnRecord",
    "TurnReport",
    "UnknownFormatError",
    "UsageAccumulator",
    "UsageTotals",
    "WirePlan",
    "audit",
    "configure",
    "cost_usd",
    "diagnose",
    "get_settings",
    "load_settings",
    "normalize_usage",
    "reset_settings",
    "resolve_target",
    "wrap",
]

#: The module defining each public name, relative to this package.
_EXPORTS: dict[str, str] = {
    name: module
    for module, names in {
        "._audit": ("audit",),
        "._config": ("Settings", "configure", "get_settings", "load_settings", "reset_settings"),
        "._exceptions": ("AgentCacheError", "ConfigError", "InputError", "InternalError", "UnknownFormatError"),
        "._wrap": ("wrap",),
        ".analysis._diagnose": ("Divergence", "diagnose"),
        ".analysis._ledger": ("Ledger",),
        ".analysis._report": ("ArmMetrics", "AuditReport", "BreakRecord", "MissRecord", "SessionReport", "TurnRecord"),
        ".model._canonical": ("Block", "CanonicalRequest", "Marker"),
        ".model._causes": ("Cause",),
        ".model._fields": (
            "LifecycleEvent", "PrefixIdentity", "ReuseBoundary", "SessionSignal", "StorageTier", "TurnReport",
        ),
        ".model._plan": ("WirePlan",),
        ".model._totals": ("UsageTotals",),
        ".model._types": ("Api", "Engine", "TargetKind"),
        ".model._usage": ("CacheUsage", "normalize_usage"),
        ".model._usage_stream": ("UsageAccumulator",),
        ".session": (
            "AsyncSessionStore", "Identity", "MemoryStore", "Prepared", "PrometheusSink", "SGLangSink", "Session",
            "SessionClosedError", "SessionPipeline", "SessionStore", "Sessions", "StoreUnavailable", "Tombstone",
            "Turn",
        ),
        ".session._redis": ("RedisStore",),
        ".targets": ("AnthropicTarget", "EngineTarget", "OpenAITarget", "Target", "cost_usd", "resolve_target"),
    }.items()
    for name in names
}  # fmt: skip

if not TYPE_CHECKING:  # hidden from mypy, which would otherwise type every unknown attribute as Any

    def __getattr__(name: str) -> Any:
        """Import the public ``name`` on first use (PEP 562) and keep it in the module's namespace."""
        module = _EXPORTS.get(name)
        if module is None:
            raise AttributeError(f"module {__name__!r} has no attribute {name!r}")
        obj = getattr(importlib.import_module(module, __name__), name)
        # The public path in reprs and docs, not the file layout (as httpx does).
        if getattr(obj, "__module__", "").startswith("agentcache.") and isinstance(obj, type | types.FunctionType):
            obj.__module__ = __name__
        globals()[name] = obj
        return obj


def __dir__() -> list[str]:
    return sorted({*globals(), *__all__})
