"""A report's misses and TTL decisions summarised once, for every renderer (the terminal's tables and the HTML
page): misses grouped by cause and arm, requests per chosen TTL with the latest reason."""

from __future__ import annotations

from collections import Counter, defaultdict
from collections.abc import Iterable
from dataclasses import dataclass

from ._report import MissRecord, TurnRecord

__all__ = ["MissGroup", "TTLGroup", "group_misses", "group_ttl"]


@dataclass(frozen=True, slots=True)
class MissGroup:
    """Misses of one ``arm`` for one ``cause``: how many, in how many sessions, the tokens lost, rejected
    requests, the first and last request index (0-based, within their sessions) and the most frequent ``where``."""

    cause: str
    arm: str
    count: int
    sessions: int
    tokens_lost: int
    rejected: int
    first: int
    last: int
    where: str | None


@dataclass(frozen=True, slots=True)
class TTLGroup:
    """Requests the TTL policy gave ``ttl``, in how many sessions, and the latest ``reason``."""

    ttl: str
    requests: int
    sessions: int
    reason: str


def group_misses(misses: Iterable[MissRecord]) -> list[MissGroup]:
    """Misses grouped by (cause, arm), the most tokens lost first."""
    groups: dict[tuple[str, str], list[MissRecord]] = defaultdict(list)
    for m in misses:
        groups[(m.cause, m.arm)].append(m)
    out = []
    for (cause, arm), items in groups.items():
        where = Counter(m.where for m in items if m.where).most_common(1)
        out.append(
            MissGroup(
                cause,
                arm,
                len(items),
                len({m.session for m in items}),
                sum(m.tokens_lost for m in items),
                sum(m.rejected for m in items),
                min(m.request for m in items),
                max(m.request for m in items),
                where[0][0] if where else None,
            )
        )
    return sorted(out, key=lambda g: (-g.tokens_lost, -g.count, g.cause, g.arm))


def group_ttl(turns: Iterable[TurnRecord]) -> list[TTLGroup]:
    """Requests per chosen TTL (agentcache arm), with the latest reason; empty when no TTL was chosen."""
    counts: Counter[str] = Counter()
    sessions: dict[str, set[str]] = defaultdict(set)
    reasons: dict[str, str] = {}
    for t in turns:
        ttl = getattr(t.prepared, "ttl", None)
        if ttl is not None:
            counts[ttl.ttl] += 1
            sessions[ttl.ttl].add(t.session)
            reasons[ttl.ttl] = ttl.reason
    return [TTLGroup(k, counts[k], len(sessions[k]), reasons[k]) for k in sorted(counts)]
