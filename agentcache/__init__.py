"""agentcache: keep LLM agents' prompt prefixes cache-stable, prove it with numbers, explain every miss."""

from __future__ import annotations

from ._audit import audit
from ._canonical import Block, CanonicalRequest, Marker
from ._diagnose import Divergence, diagnose
from ._exceptions import AgentCacheError, ConfigError, InputError, InternalError, UnknownFormatError
from ._report import ArmMetrics, AuditReport, BreakRecord, MissRecord, SessionReport

__version__ = "0.1.0"

__all__ = [
    "AgentCacheError",
    "ArmMetrics",
    "AuditReport",
    "Block",
    "BreakRecord",
    "CanonicalRequest",
    "ConfigError",
    "Divergence",
    "InputError",
    "InternalError",
    "Marker",
    "MissRecord",
    "SessionReport",
    "UnknownFormatError",
    "audit",
    "diagnose",
]
