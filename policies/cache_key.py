"""OpenAI ``prompt_cache_key`` for a session lineage.

A good key serves both kinds of reuse (design.md): the static-prefix *family* (sessions that share
tools + system) plus a *shard* chosen by consistent hashing of the session lineage's root, with enough
shards to keep each key under ~15 requests/min (OpenAI's published overflow point). A session always
lands where its own history lives, its subagents share its root and so its key, and new sessions
still find the shared prefix. Jump consistent hashing (Lamping & Veach, 2014) moves only ~1/n of the
lineages when the shard count grows from n−1 to n.
"""

from __future__ import annotations

import hashlib
import math
from collections import deque
from dataclasses import dataclass, field


def jump_hash(key: int, buckets: int) -> int:
    """Jump consistent hash of a 64-bit ``key`` into ``[0, buckets)``."""
    b, j = -1, 0
    while j < buckets:
        b = j
        key = (key * 2862933555777941757 + 1) & 0xFFFFFFFFFFFFFFFF
        j = int((b + 1) * (float(1 << 31) / float((key >> 33) + 1)))
    return b


def _h64(text: str) -> int:
    return int.from_bytes(hashlib.blake2b(text.encode(), digest_size=8).digest(), "big")


@dataclass(slots=True)
class KeyPlanner:
    """Keys for one cache scope. ``rpm_per_key``: requests per minute one key should carry.

    ``key(family, lineage, now)`` records a request at ``now`` (seconds; None when unknown) and
    returns its key ``ac-<family>-<shard>``; ``shards(family)`` is the current shard count, which
    only grows (shrinking would move lineages away from their history).
    """

    rpm_per_key: float = 15.0
    _times: dict[str, deque[float]] = field(default_factory=dict)
    _shards: dict[str, int] = field(default_factory=dict)

    def key(self, family: str, lineage: str, now: float | None) -> str:
        """The key for a request of ``lineage`` whose static prefix hashes to ``family``."""
        if now is not None:
            window = self._times.setdefault(family, deque())
            window.append(now)
            while window and window[0] < now - 60.0:
                window.popleft()
            need = max(1, math.ceil(len(window) / self.rpm_per_key))
            self._shards[family] = max(self._shards.get(family, 1), need)
        shard = jump_hash(_h64(lineage), self._shards.get(family, 1))
        return f"ac-{family[:12]}-{shard}"

    def shards(self, family: str) -> int:
        """Current shard count of ``family``."""
        return self._shards.get(family, 1)
