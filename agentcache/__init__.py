"""agentcache: keep LLM agents' prompt prefixes cache-stable, prove it with numbers, explain every miss."""

from __future__ import annotations

from ._audit import audit
from ._exceptions import AgentCacheError, ConfigError, InputError, InternalError, UnknownFormatError
from ._wrap import wrap
from .analysis._diagnose import Divergence, diagnose
from .analysis._report import ArmMetrics, AuditReport, BreakRecord, MissRecord, SessionReport
from .model._canonical import Block, CanonicalRequest, Marker
from .model._fields import LifecycleEvent, PrefixIdentity, ReuseBoundary, SessionSignal, StorageTier, TurnReport
from .model._usage import CacheUsage, UsageTotals, cost_usd, normalize_usage
from .session import Session, SessionClosedError, Sessions, Tombstone
from .session._sinks import PrometheusSink, SGLangSink

__version__ = "0.1.0"

__all__ = [
    "AgentCacheError",
    "ArmMetrics",
    "AuditReport",
    "Block",
    "BreakRecord",
    "CacheUsage",
    "CanonicalRequest",
    "ConfigError",
    "Divergence",
    "InputError",
    "InternalError",
    "LifecycleEvent",
    "Marker",
    "MissRecord",
    "PrefixIdentity",
    "PrometheusSink",
    "ReuseBoundary",
    "SGLangSink",
    "Session",
    "SessionClosedError",
    "SessionReport",
    "SessionSignal",
    "Sessions",
    "StorageTier",
    "Tombstone",
    "TurnReport",
    "UnknownFormatError",
    "UsageTotals",
    "audit",
    "cost_usd",
    "diagnose",
    "normalize_usage",
    "wrap",
]
