"""A local engine's prefix cache, as a first model: one radix tree shared by every session of the engine, every
prefix ever sent still resident (no capacity limit, no eviction), reused at block granularity, free of charge.

It is the bound on what a self-hosted engine with a large enough KV cache reuses; capacity, eviction, page size
and the model's own tokenizer and chat template are not modelled (tokens are tiktoken estimates).
"""

from __future__ import annotations

from ..model._canonical import CanonicalRequest
from ..simulate._base import SeenIndex, SimResult, SimUsage

__all__ = ["EngineSimulator"]


class EngineSimulator:
    """Replays canonical requests through one shared, unbounded prefix cache (see the module docstring)."""

    provider = "engine"

    def __init__(self, model: str | None = None) -> None:
        self._seen = SeenIndex()

    def run(self, req: CanonicalRequest, now: float) -> SimResult:
        """Simulate one request: every block of its longest previously sent prefix is read."""
        depth = self._seen.depth(req)
        read = req.tokens_before(depth)
        self._seen.add(req)
        return SimResult(SimUsage(req.tokens, read, 0, req.tokens - read, 0.0), read)

    @property
    def prefixes(self) -> int:
        """Prefixes the cache holds (its memory grows with them)."""
        return len(self._seen)
