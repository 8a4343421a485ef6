"""The one session core behind every door: :class:`Sessions` (the manager), :class:`Session`, :class:`Turn`, the
per-session :class:`SessionPipeline`, lifecycle events and sinks, and the stores (in memory, Redis)."""

from __future__ import annotations

from ._clients import CLIENTS, ClientDeclaration, Declared, declared_by
from ._identity import LOCAL_TENANT, Checkpoints, Identity, checkpoints_of, conversation_of, new_session_id
from ._lifecycle import Sink, annotate, emit
from ._metrics import TOKEN_SOURCES, PrometheusSink, model_label, provider_label
from ._pipeline import Learned, PipelineState, Prepared, ScopeMemory, SessionPipeline
from ._session import UNSET, Session
from ._sessions import DEFAULT_IDLE_TIMEOUT, Lineage, SessionClosedError, Sessions
from ._sinks import SGLangSink
from ._store import AsyncSessionStore, MemoryStore, Opened, SessionStore, StoreUnavailable, Tombstone
from ._turn import Turn, TurnState, TurnStateError, build_report

__all__ = [
    "CLIENTS",
    "DEFAULT_IDLE_TIMEOUT",
    "LOCAL_TENANT",
    "TOKEN_SOURCES",
    "UNSET",
    "AsyncSessionStore",
    "Checkpoints",
    "ClientDeclaration",
    "Declared",
    "Identity",
    "Learned",
    "Lineage",
    "MemoryStore",
    "Opened",
    "PipelineState",
    "Prepared",
    "PrometheusSink",
    "SGLangSink",
    "ScopeMemory",
    "Session",
    "SessionClosedError",
    "SessionPipeline",
    "SessionStore",
    "Sessions",
    "Sink",
    "StoreUnavailable",
    "Tombstone",
    "Turn",
    "TurnState",
    "TurnStateError",
    "annotate",
    "build_report",
    "checkpoints_of",
    "conversation_of",
    "declared_by",
    "emit",
    "model_label",
    "new_session_id",
    "provider_label",
]
