"""The proxy's memory budget: ``max_state_mb`` shared out, once, among everything the proxy holds for its traffic.

Each part is bounded by its own share, in estimated bytes, and forgets its least recently used entries within it.
No part can take another's room: the sessions always keep theirs, so two sessions taking turns keep their
generation however much else comes and goes. Each estimate is its entries' count times a per-entry size measured
with a ``sys.getsizeof`` walk (the constants beside each structure; tests/test_memory_bounds.py measures them
again), and ``/metrics`` shows every part's estimate against its share (``agentcache_proxy_state_bytes{part}``,
``agentcache_proxy_state_budget_bytes{part}``).

============  =====  =====================================================================  ========================
part          share  holds                                                                  forgets first
============  =====  =====================================================================  ========================
sessions      45%    live sessions' pipeline state and their prefix-index entries           the least recently active
                     (:class:`~agentcache.session.MemoryStore`; with Redis, the local       session (closed, reason
                     copies)                                                                ``evicted``)
tombstones    5%     closed session ids, so a late response to them changes nothing        the oldest
report        25%    the live report (:mod:`agentcache.proxy._live`): per-session arms,     the oldest session and
                     simulated prefixes, break and miss records, static heads, names        record; the biggest
                                                                                            simulated cache restarts
scopes        10%    each tenant's cache-scope memory (OpenAI key planners' families, the   the least recently used
                     first tool sets) and the lineages (:class:`~agentcache.Sessions`)
parse_memo    7.5%   recent bodies' parses (:mod:`agentcache.model._parsememo`)             the least recently used
memos         7.5%   the process's token counts and meanings by block hash                  the least recently used
============  =====  =====================================================================  ========================

What is left out is small and fixed in size: the rule and path caches (a few hundred bounded names each), the
metrics (no client-chosen label), the coalescer's entries (one per prefix being written), allocator slack.
"""

from __future__ import annotations

from collections.abc import Callable
from dataclasses import dataclass

from ..model._equivalence import VALUE_MEMO_ENTRY_BYTES, bound_value_memo, value_memo_bytes
from ..model._tokens import MEMO_ENTRY_BYTES, default_counter

__all__ = ["SHARES", "Budget"]

#: Each part's share of ``max_state_mb`` (see the module docstring); they add up to 1.
SHARES: dict[str, float] = {
    "sessions": 0.45,
    "tombstones": 0.05,
    "report": 0.25,
    "scopes": 0.10,
    "parse_memo": 0.075,
    "memos": 0.075,
}
#: The parse memo's estimate is three bytes per character of body text it keeps (the text and its values).
PARSE_MEMO_BYTES_PER_CHAR = 3


@dataclass(frozen=True, slots=True)
class Budget:
    """``max_state_mb`` (``total`` bytes) shared out by :data:`SHARES`."""

    total: int

    @classmethod
    def of_mb(cls, mb: int) -> Budget:
        """The budget of ``mb`` MiB."""
        return cls(mb * 1024 * 1024)

    def share(self, part: str) -> int:
        """Bytes of ``part``'s share."""
        return int(self.total * SHARES[part])

    def bound_memos(self) -> None:
        """Bound the process's token-count and meaning memos to the ``memos`` share (two thirds and one third)."""
        share = self.share("memos")
        default_counter().bound_memo(share * 2 // 3 // MEMO_ENTRY_BYTES)
        bound_value_memo(share // 3 // VALUE_MEMO_ENTRY_BYTES)


def memo_bytes() -> int:
    """Estimated bytes of the process's token-count and meaning memos."""
    return default_counter().estimated_bytes() + value_memo_bytes()


#: A part's estimated bytes now.
Gauge = Callable[[], int]
