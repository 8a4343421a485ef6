"""Shared shapes of the provider cache simulators."""

from __future__ import annotations

from collections import OrderedDict
from collections.abc import Callable, Iterator
from dataclasses import dataclass
from typing import Any, Generic, Protocol, TypeVar

from ..model._bounded import bounded
from ..model._canonical import CanonicalRequest
from ..model._rules import normalize_model

S = TypeVar("S")

#: Distinct models one simulator keeps a cache scope for. ``model`` is chosen by the client, so beyond this many
#: the least recently used model's scope is dropped (its cache starts over if the model comes back: a brief
#: under-count of reuse, never a scope pinned for the process's life); model names are kept bounded.
MAX_MODEL_SCOPES = 32


@dataclass(frozen=True, slots=True)
class SimUsage:
    """Simulated usage of one request, in tokens, with its input-side cost in USD.

    ``prompt_tokens = cache_read_tokens + cache_write_tokens + uncached_tokens``;
    ``cache_write_1h_tokens`` is the part of ``cache_write_tokens`` written with a 1h TTL.
    """

    prompt_tokens: int
    cache_read_tokens: int
    cache_write_tokens: int
    uncached_tokens: int
    cost_usd: float
    cache_write_1h_tokens: int = 0

    @classmethod
    def of(cls, usage: Any, cost_usd: float) -> SimUsage:
        """Reported usage (a :class:`~agentcache.model._usage.CacheUsage`: the same token fields) at ``cost_usd``."""
        return cls(
            usage.prompt_tokens,
            usage.cache_read_tokens,
            usage.cache_write_tokens,
            usage.uncached_tokens,
            cost_usd,
            usage.cache_write_1h_tokens,
        )


@dataclass(frozen=True, slots=True)
class SimResult:
    """One simulated request.

    ``matched_tokens``: the longest prefix of this request already sent earlier in the cache scope
    (content only, whatever the cache mechanics). ``loss_cause``: the miss cause when fewer tokens were
    read than matched (``markers.missing``, ``lookback.exceeded``, ``ttl.expired``...), else None;
    ``loss_where``: the block path it concerns, when one applies. ``rejected``: the provider would
    refuse the request (e.g. five cache markers): nothing is cached and the client must resend it, so
    it is counted as fully uncached. ``held_s``: seconds a coalescing simulator held the request for a
    concurrent writer's first byte (0 otherwise).
    """

    usage: SimUsage
    matched_tokens: int
    loss_cause: str | None = None
    loss_where: str | None = None
    rejected: bool = False
    held_s: float = 0.0


@dataclass(frozen=True, slots=True)
class Concurrency:
    """How a simulator models requests that overlap in time. A provider cache entry is readable once the request
    writing it has started its response (Anthropic prompt caching: "the cache entry becomes available after the
    first response begins"; docs/design.md, provider rules), so requests sent together cannot read each other.

    ``ttft``: seconds from a request's start to its first response byte, where the records give none (a
    request's own recorded first-byte delay wins). ``coalesce``: model agentcache's coalescer
    (:mod:`agentcache.session._coalesce`): a request that would read an entry still being written waits for it,
    at most ``hold`` seconds, and then reads it.
    """

    ttft: float = 1.0
    coalesce: bool = False
    hold: float = 3.0


class SeenIndex:
    """Every prefix (chain hash) sent in one cache scope; answers "how deep does this request match"."""

    __slots__ = ("_seen",)

    def __init__(self) -> None:
        self._seen: set[bytes] = set()

    def depth(self, req: CanonicalRequest) -> int:
        """Number of leading blocks of ``req`` some earlier request in the scope also sent."""
        # Membership is monotone along a chain (every sent prefix was added), so binary search.
        lo, hi = 0, len(req.chain)
        while lo < hi:
            mid = (lo + hi + 1) // 2
            if req.chain[mid - 1] in self._seen:
                lo = mid
            else:
                hi = mid - 1
        return lo

    def add(self, req: CanonicalRequest) -> None:
        """Record every prefix of ``req``."""
        self._seen.update(req.chain)

    def __len__(self) -> int:
        return len(self._seen)


class Simulator(Protocol):
    """A deterministic model of one cache: ``run(req, now)`` replays one canonical request at ``now`` (seconds,
    non-decreasing) through the shared cache and returns what it read, wrote and missed."""

    provider: str

    def run(self, req: CanonicalRequest, now: float) -> SimResult: ...


class ModelScopes(Generic[S]):
    """A simulator's per-model cache scopes, at most ``limit`` of them, least recently used dropped first (see
    :data:`MAX_MODEL_SCOPES`). ``get(model)`` returns the scope of ``model`` (normalised: ``normalize_model``, and
    :func:`~agentcache.model._bounded.bounded`), created by ``factory``."""

    __slots__ = ("_factory", "_scopes", "limit")

    def __init__(self, factory: Callable[[], S], limit: int = MAX_MODEL_SCOPES) -> None:
        self._factory = factory
        self._scopes: OrderedDict[str, S] = OrderedDict()
        self.limit = max(1, limit)

    def get(self, model: str) -> S:
        """The scope of ``model`` (see the class docstring)."""
        key = normalize_model(bounded(model))
        scope = self._scopes.get(key)
        if scope is None:
            scope = self._scopes[key] = self._factory()
            while len(self._scopes) > self.limit:
                self._scopes.popitem(last=False)
        else:
            self._scopes.move_to_end(key)
        return scope

    def values(self) -> Iterator[S]:
        """The scopes (the ledger sizes them)."""
        return iter(self._scopes.values())

    def __len__(self) -> int:
        return len(self._scopes)
