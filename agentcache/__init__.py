"""agentcache: keep LLM agents' prompt prefixes cache-stable, prove it with numbers, explain every miss.

The public surface, in four doors over one core:

* ``wrap(client, session=...)``: the Anthropic and OpenAI SDK clients in an agent loop;
* ``agentcache proxy`` (``agentcache.proxy``): a drop-in HTTP proxy for agents you cannot change;
* ``agentcache serve`` (``agentcache.serve``): SGLang or llama.cpp with the proxy in front;
* ``audit(records)`` and ``agentcache replay`` (``agentcache.replay``): recorded traffic analysed and replayed.

All four drive the same session core (:class:`Sessions`, :class:`Session`, :class:`Turn`, :class:`SessionPipeline`
over a :class:`SessionStore`), resolve the same :class:`Target` per session and report the same four fields
(:class:`TurnReport`). The library logs through :mod:`logging` and prints nothing unless the host configures it.
"""

from __future__ import annotations

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

__version__ = "0.1.0"

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

# The public path in reprs and docs, not the file layout (as httpx does).
for _name in __all__:
    _obj = globals()[_name]
    if getattr(_obj, "__module__", "").startswith("agentcache.") and isinstance(_obj, type | type(audit)):
        _obj.__module__ = "agentcache"
del _name, _obj
