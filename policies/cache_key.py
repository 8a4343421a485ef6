"""OpenAI ``prompt_cache_key`` for a session lineage.

A good key serves both kinds of reuse (docs/design.md): the static-prefix *family* (sessions that share
tools + system) plus a *shard* chosen by consistent hashing of the session lineage's root, with enough
shards to keep each key under ~15 requests/min (OpenAI's published overflow point). A session always
lands where its own history lives, its subagents share its root and so its key, and new sessions
still find the shared prefix. Jump consistent hashing (Lamping & Veach, 2014) moves only ~1/n of the
lineages when the shard count grows from n−1 to n.

Shards only when they pay. A shard costs: the family's static prefix must be cached on it too, and a session
that lands on another shard than its history (a resume or subagent the proxy could not tie to its lineage) reads
nothing. It pays only when the family's sustained traffic overflows one key. So the shard count is the family's
requests over the last real minute over ``rpm_per_key`` (counted: one agent's three quick requests are no rate),
and never more than the distinct lineages that sent them (one lineage's requests all carry one key: more shards
cannot spread them). Only a family that already sent more than one key's minute in less than a minute has its rate
so far taken for the minute (over at least :data:`RATE_FLOOR` seconds): a burst of new sessions, spread at once,
since the lineages keyed before the shards grow stay where they are. It follows the traffic down as well as
up: a key, once chosen, is its lineage's for good (the session and lineage keep it), so the count only decides
where *new* lineages go.
"""

from __future__ import annotations

import hashlib
import math
from collections import Counter, OrderedDict, deque
from dataclasses import dataclass, field

#: Bytes one remembered family holds (its OrderedDict entry, its deque of (time, lineage) pairs and lineage
#: counter, shard count): 1,376 B measured with a ``sys.getsizeof`` walk over 1,500 one-request families on
#: CPython 3.11, rounded up.
FAMILY_BYTES = 1500

#: Seconds of a family's traffic its rate is counted over (OpenAI's overflow point is per minute).
WINDOW = 60.0

#: Seconds a burst's rate is extrapolated over, at least (see ``KeyPlanner._needed``).
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
class _Family:
    """A family's requests of the last :data:`WINDOW` seconds: ``(time, lineage hash)`` in time order, and how many
    of them each lineage sent."""

    times: deque[tuple[float, int]] = field(default_factory=deque)
    lineages: Counter[int] = field(default_factory=Counter)

    def slide(self, now: float) -> None:
        while self.times and self.times[0][0] <= now - WINDOW:
            _, h = self.times.popleft()
            self.lineages[h] -= 1
            if not self.lineages[h]:
                del self.lineages[h]


@dataclass(slots=True)
class KeyPlanner:
    """Keys for one cache scope. ``rpm_per_key``: requests per minute one key should carry (setting
    ``openai_rpm_per_key``). ``max_families``: static-prefix families remembered (setting
    ``openai_key_families``; least recently used dropped, a forgotten family starts again at one shard; about
    :data:`FAMILY_BYTES` each).

    ``key(family, lineage, now)`` is the key ``ac-<family>-<shard>`` for a request of ``lineage`` whose static
    prefix hashes to ``family`` at ``now`` (seconds; None when unknown), counting that request; it changes
    nothing. ``record(family, now, lineage)`` counts a request that was sent. ``shards(family)`` is the shard
    count as of the last request recorded (see the module docstring for the rule).
    """

    rpm_per_key: float = 15.0
    max_families: int = 4096
    _times: OrderedDict[str, _Family] = field(default_factory=OrderedDict)
    _shards: dict[str, int] = field(default_factory=dict)

    def _needed(self, family: str, now: float, lineage: int | None) -> int:
        """Shards the family's last minute calls for, with one more request of ``lineage`` when given."""
        fam = self._times.get(family)
        if fam is not None:
            fam.slide(now)
        count = (len(fam.times) if fam is not None else 0) + (lineage is not None)
        lineages = len(fam.lineages) if fam is not None else 0
        if lineage is not None and (fam is None or lineage not in fam.lineages):
            lineages += 1
        span = now - fam.times[0][0] if fam is not None and fam.times else 0.0
        if span < WINDOW and count > self.rpm_per_key:
            # More than one key's minute already, in less than a minute: a burst of sessions, whose rate so far
            # is taken for the minute so it is spread at once (a lineage keeps the key it got first).
            count = math.ceil(count * WINDOW / max(span, RATE_FLOOR))
        return max(1, min(math.ceil(count / self.rpm_per_key), lineages))

    def key(self, family: str, lineage: str, now: float | None) -> str:
        """The key for a request of ``lineage`` whose static prefix hashes to ``family`` (pure)."""
        h = _h64(lineage)
        shards = self._needed(family, now, h) if now is not None else self._shards.get(family, 1)
        return f"ac-{family[:12]}-{jump_hash(h, shards)}"

    def record(self, family: str, now: float | None, lineage: str = "") -> None:
        """Count a request of ``family`` and ``lineage`` sent at ``now`` (None: unknown, not counted)."""
        if now is None:
            return
        fam = self._times.pop(family, None) or _Family()
        self._times[family] = fam
        h = _h64(lineage)
        fam.slide(now)
        fam.times.append((now, h))
        fam.lineages[h] += 1
        self._shards[family] = self._needed(family, now, None)
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
        """The shard count of ``family`` as of its last recorded request (1 for an unknown family)."""
        return self._shards.get(family, 1)
