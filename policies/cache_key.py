"""OpenAI ``prompt_cache_key`` for a session lineage.

A good key serves both kinds of reuse (docs/design.md): the static-prefix *family* (sessions that share
tools + system) plus a *shard* chosen by consistent hashing of the session lineage's root, with enough
shards to keep each key under ~15 requests/min (OpenAI's published overflow point). A session always
lands where its own history lives, its subagents share its root and so its key, and new sessions
still find the shared prefix. Jump consistent hashing (Lamping & Veach, 2014) moves only ~1/n of the
lineages when the shard count grows from n−1 to n.
"""

from __future__ import annotations

import bisect
import hashlib
import math
from collections import OrderedDict, deque
from dataclasses import dataclass, field

#: Bytes one remembered family holds (its OrderedDict entry, deque of request times, shard count): 988 B
#: measured with a ``sys.getsizeof`` walk over 1,500 one-request families on CPython 3.11, rounded up.
FAMILY_BYTES = 1000

#: Seconds of a young family's requests its rate is extrapolated over, at least (see ``KeyPlanner._needed``).
RATE_FLOOR = 10.0


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
    """Keys for one cache scope. ``rpm_per_key``: requests per minute one key should carry (setting
    ``openai_rpm_per_key``). ``max_families``: static-prefix families remembered (setting
    ``openai_key_families``; least recently used dropped, a forgotten family starts again at one shard; about
    :data:`FAMILY_BYTES` each).

    ``key(family, lineage, now)`` is the key ``ac-<family>-<shard>`` for a request of ``lineage`` whose static
    prefix hashes to ``family`` at ``now`` (seconds; None when unknown), counting that request; it changes
    nothing. ``record(family, now)`` counts a request that was sent. ``shards(family)`` is the current shard
    count, which only grows (shrinking would move lineages away from their history).
    """

    rpm_per_key: float = 15.0
    max_families: int = 4096
    _times: OrderedDict[str, deque[float]] = field(default_factory=OrderedDict)
    _shards: dict[str, int] = field(default_factory=dict)

    def _needed(self, family: str, now: float, extra: int) -> int:
        window = self._times.get(family)
        recent = len(window) - bisect.bisect_left(window, now - 60.0) if window else 0
        # A family younger than the minute would count only part of its rate: a burst of new sessions would all
        # get one shard's key and keep it (a key is a lineage's for good), overflowing it. Its rate so far is
        # extrapolated to the minute, over at least RATE_FLOOR seconds (two quick requests of one agent are no
        # burst).
        span = now - window[0] if window else 0.0
        if span < 60.0:
            recent = math.ceil((recent + extra) * 60.0 / max(span, RATE_FLOOR)) - extra
        return max(self._shards.get(family, 1), math.ceil((recent + extra) / self.rpm_per_key))

    def key(self, family: str, lineage: str, now: float | None) -> str:
        """The key for a request of ``lineage`` whose static prefix hashes to ``family`` (pure)."""
        shards = self._needed(family, now, 1) if now is not None else self._shards.get(family, 1)
        return f"ac-{family[:12]}-{jump_hash(_h64(lineage), max(1, shards))}"

    def record(self, family: str, now: float | None) -> None:
        """Count a request of ``family`` sent at ``now`` (grows the shard count as the rate requires)."""
        if now is None:
            return
        window = self._times.pop(family, None) or deque()
        self._times[family] = window
        window.append(now)
        while window and window[0] < now - 60.0:
            window.popleft()
        self._shards[family] = self._needed(family, now, 0)
        while len(self._times) > self.max_families:
            old, _ = self._times.popitem(last=False)
            self._shards.pop(old, None)

    def estimated_bytes(self) -> int:
        """Estimated bytes the remembered families hold (:data:`FAMILY_BYTES` each)."""
        return len(self._times) * FAMILY_BYTES

    def forget_oldest(self) -> bool:
        """Forget the least recently used family (a memory bound's eviction); False when none is left."""
        if not self._times:
            return False
        old, _ = self._times.popitem(last=False)
        self._shards.pop(old, None)
        return True

    def shards(self, family: str) -> int:
        """Current shard count of ``family``."""
        return self._shards.get(family, 1)
