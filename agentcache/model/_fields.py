"""The four fields of the cache contract and the lifecycle event that carries them (docs/design.md, "The four
fields"): ``prefix_identity`` (:class:`PrefixIdentity`), ``reuse_boundary`` (:class:`ReuseBoundary`),
``session_signal`` (:class:`SessionSignal`) and ``storage_tier`` (:class:`StorageTier`), one :class:`TurnReport`
per request, and :class:`LifecycleEvent` for ``open``, ``turn``, ``retry``, ``fork`` and ``close``. Plain frozen
records: every door builds and reads the same ones.
"""

from __future__ import annotations

from collections.abc import Mapping
from dataclasses import asdict, dataclass, field
from typing import Any, Literal

from ._canonical import CanonicalRequest, static_end
from ._provider import ProviderMiss
from ._usage import CacheUsage

__all__ = [
    "BYTES_ESTIMATE",
    "ENGINE_TOKENIZER",
    "EVENTS",
    "PROVIDER_TOKENIZER",
    "TIKTOKEN_ESTIMATE",
    "EventName",
    "LifecycleEvent",
    "PrefixIdentity",
    "ReuseBoundary",
    "SessionSignal",
    "StorageTier",
    "TurnReport",
]

EventName = Literal["open", "turn", "retry", "fork", "close"]
EVENTS: tuple[EventName, ...] = ("open", "turn", "retry", "fork", "close")


@dataclass(frozen=True, slots=True)
class PrefixIdentity:
    """Which prefix a request has, as radix-tree path names (blake2b-128 chain hashes, hex).

    ``static``: the chain hash through the last options/tools/system block (the prefix family that
    sessions of one agent share; None when the request has none). ``head``: the chain hash of the
    whole request. ``blocks``/``tokens``: its length in canonical blocks and estimated tokens.
    """

    static: str | None
    head: str | None
    blocks: int
    tokens: int

    @classmethod
    def of(cls, req: CanonicalRequest) -> PrefixIdentity:
        """The identity of canonical request ``req``."""
        end = static_end(req)
        return cls(
            req.chain[end - 1].hex() if end else None,
            req.chain[-1].hex() if req.chain else None,
            len(req.blocks),
            req.tokens,
        )


#: ``ReuseBoundary.token_source``: counts from tiktoken ``o200k_base``, or ``ceil(utf8 bytes / 4)`` without it.
TIKTOKEN_ESTIMATE = "tiktoken-estimate"
BYTES_ESTIMATE = "bytes-estimate"
#: ``ReuseBoundary.reported_source``: the engine's tokenizer (llama.cpp, SGLang) or the provider's.
ENGINE_TOKENIZER = "engine-tokenizer"
PROVIDER_TOKENIZER = "provider-tokenizer"


@dataclass(frozen=True, slots=True)
class ReuseBoundary:
    """How deep the request can be served from cache, and which counter each number comes from.

    ``matched_blocks``/``matched_tokens``: the prefix of what is sent (after agentcache's repairs) shared with
    what this session last sent — the reuse agentcache expects, counted by ``token_source``
    (``tiktoken-estimate``, or ``bytes-estimate`` without tiktoken). ``reported_tokens``: what the upstream
    reported reading, counted by ``reported_source`` (``engine-tokenizer`` or ``provider-tokenizer``; both
    None before the response, or when not reported).
    ``cause``/``where``: the break of the client's own request against its previous one (a name from
    :mod:`agentcache.model._causes`, the first divergent unit); None/None for an append-only turn.
    ``tokens_lost``: previously sent tokens that must be processed again *after* the repairs (what was sent
    against what was sent before); ``tokens_lost_unrepaired``: what the client's request as it came would
    have lost; ``repaired``: agentcache repaired the cause (then ``tokens_lost`` < ``tokens_lost_unrepaired``
    is the saving). Both in ``token_source`` tokens.
    """

    matched_blocks: int
    matched_tokens: int
    reported_tokens: int | None = None
    cause: str | None = None
    where: str | None = None
    tokens_lost: int = 0
    tokens_lost_unrepaired: int = 0
    repaired: bool = False
    token_source: str = TIKTOKEN_ESTIMATE
    reported_source: str | None = None


@dataclass(frozen=True, slots=True)
class SessionSignal:
    """Who sent it. ``generation``: incarnation of ``session_id`` (0 first); ``attempt``: failed
    tries of the current turn so far (0 on the first try); ``parent``: the forking session, for a
    subagent; ``lineage``: the root session id, shared by a whole subagent tree; ``turn``: turns
    committed in this generation before this one."""

    session_id: str
    generation: int
    attempt: int
    parent: str | None
    lineage: str
    turn: int = 0


@dataclass(frozen=True, slots=True)
class StorageTier:
    """Where the reused prefix lives and for how long. ``kind``: ``provider`` or ``engine``.
    ``ttl``: provider retention of the entries written/refreshed (Anthropic ``5m``/``1h`` as planned;
    OpenAI ``in_memory``, ``24h`` or the requested ``prompt_cache_options`` TTL); None for an engine.
    ``tiers``: the engine tiers the read tokens came from (SGLang ``device``/``host``/``storage``)."""

    kind: str
    ttl: str | None = None
    tiers: Mapping[str, int] = field(default_factory=dict)


@dataclass(frozen=True, slots=True)
class TurnReport:
    """One wrapped request: the four fields, normalised ``usage`` (None when the response carried
    none), its input-side ``cost_usd`` (None when unknown), the causes agentcache ``repairs``-ed, the
    block paths given a cache marker (``markers``), ``api``/``model``, ``duration_s`` from send to
    the end of the response (or stream), and ``provider_miss``: the provider's own cache-miss reason beside
    agentcache's cause, when the response carried one (setting ``provider_diagnostics``, or recorded traffic)."""

    api: str
    model: str
    prefix_identity: PrefixIdentity
    reuse_boundary: ReuseBoundary
    session_signal: SessionSignal
    storage_tier: StorageTier
    usage: CacheUsage | None = None
    cost_usd: float | None = None
    repairs: tuple[str, ...] = ()
    markers: tuple[str, ...] = ()
    duration_s: float | None = None
    provider_miss: ProviderMiss | None = None

    def to_dict(self) -> dict[str, Any]:
        """JSON-ready dict (no prompt text)."""
        out = asdict(self)
        out["usage"] = self.usage.to_dict() if self.usage is not None else None
        out["storage_tier"]["tiers"] = dict(self.storage_tier.tiers)
        out["repairs"], out["markers"] = list(self.repairs), list(self.markers)
        return out


@dataclass(frozen=True, slots=True)
class LifecycleEvent:
    """One lifecycle signal. ``event``: one of :data:`EVENTS`; ``at``: wall-clock seconds.
    ``reason``: why (``open``: ``new``/``restart``/``resumed``; ``close``: ``closed``/``idle``/
    ``evicted``/``restart``/``shutdown``; ``retry``: the exception class name). ``report``: the turn
    report (``turn`` events). The four fields are None where they do not apply (no request yet)."""

    event: EventName
    session_signal: SessionSignal
    at: float
    reason: str | None = None
    prefix_identity: PrefixIdentity | None = None
    reuse_boundary: ReuseBoundary | None = None
    storage_tier: StorageTier | None = None
    report: TurnReport | None = None

    def log_fields(self) -> dict[str, Any]:
        """The structlog key/values: the four fields (flat dicts), reason, usage and cost for turns."""
        out: dict[str, Any] = {"reason": self.reason}
        for name in ("prefix_identity", "reuse_boundary", "session_signal", "storage_tier"):
            out[name] = _flat(getattr(self, name))
        if self.report is not None:
            out["usage"] = self.report.usage.to_dict() if self.report.usage is not None else None
            out["cost_usd"] = self.report.cost_usd
            out["repairs"] = list(self.report.repairs)
        return out


def _flat(value: Any) -> dict[str, Any] | None:
    """A field record as a plain dict (shallow; mappings copied): cheaper than ``asdict`` per event."""
    if value is None:
        return None
    out = {k: getattr(value, k) for k in value.__dataclass_fields__}
    return {k: dict(v) if isinstance(v, Mapping) else v for k, v in out.items()}
