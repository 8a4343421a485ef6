"""Usage totals over many requests: :class:`TokenTotals` (the four token counts, hit rate and cost) and
:class:`UsageTotals` (reported usage of a session or a lineage). The per-arm metrics of reports
(:class:`~agentcache.ArmMetrics`) share :class:`TokenTotals`."""

from __future__ import annotations

from dataclasses import dataclass
from typing import Any

from ._usage import CacheUsage

__all__ = ["TokenTotals", "UsageTotals"]


@dataclass(slots=True)
class TokenTotals:
    """Token counts summed over requests (tokens as in :class:`CacheUsage`), ``hit_rate =
    cache_read_tokens / prompt_tokens``, and ``cost_usd``. Shared by :class:`UsageTotals` (reported usage) and
    the audit's per-arm ``ArmMetrics`` (simulated usage)."""

    requests: int = 0
    prompt_tokens: int = 0
    cache_read_tokens: int = 0
    cache_write_tokens: int = 0
    uncached_tokens: int = 0
    cost_usd: float = 0.0

    def count(self, usage: CacheUsage | Any) -> None:
        """Add one request's token counts (anything with the four ``*_tokens`` fields of :class:`CacheUsage`)."""
        self.requests += 1
        self.prompt_tokens += usage.prompt_tokens
        self.cache_read_tokens += usage.cache_read_tokens
        self.cache_write_tokens += usage.cache_write_tokens
        self.uncached_tokens += usage.uncached_tokens

    @property
    def hit_rate(self) -> float:
        """Share of prompt tokens read from the cache (0..1)."""
        return self.cache_read_tokens / self.prompt_tokens if self.prompt_tokens else 0.0

    def to_dict(self) -> dict[str, Any]:
        """JSON-ready dict: ``requests``, the four token counts, ``hit_rate``, ``cost_usd``."""
        return {
            "requests": self.requests,
            "prompt_tokens": self.prompt_tokens,
            "cache_read_tokens": self.cache_read_tokens,
            "cache_write_tokens": self.cache_write_tokens,
            "uncached_tokens": self.uncached_tokens,
            "hit_rate": round(self.hit_rate, 6),
            "cost_usd": round(self.cost_usd, 6),
        }


@dataclass(slots=True)
class UsageTotals(TokenTotals):
    """Running totals of reported usage over requests (a session's, or a lineage's). ``cost_usd`` sums the
    requests whose cost is known, ``unpriced`` counts the others; ``output_tokens`` sums the reported ones."""

    output_tokens: int = 0
    unpriced: int = 0

    def add(self, usage: CacheUsage, cost: float | None) -> None:
        """Accumulate one request."""
        self.count(usage)
        self.output_tokens += usage.output_tokens or 0
        if cost is None:
            self.unpriced += 1
        else:
            self.cost_usd += cost

    def to_dict(self) -> dict[str, Any]:
        """JSON-ready dict: :meth:`TokenTotals.to_dict` plus ``output_tokens`` and ``unpriced``."""
        return {**TokenTotals.to_dict(self), "output_tokens": self.output_tokens, "unpriced": self.unpriced}
