"""What the session manager keeps per lineage (a root session and its subagents): :class:`Lineage`, and the
sizes its memory bound counts (:data:`LINEAGE_BYTES`, :data:`SIBLING_HASH_BYTES`)."""

from __future__ import annotations

from dataclasses import dataclass, field

from ..model._totals import UsageTotals

__all__ = ["LINEAGE_BYTES", "SIBLING_BLOCKS", "SIBLING_HASH_BYTES", "Lineage"]


@dataclass(slots=True)
class Lineage:
    """What a manager keeps per lineage (a root session and its subagents): usage ``totals``, the OpenAI
    ``routing_key`` its first request got, which every later session of the lineage reuses, so all land where
    the lineage's prefixes are cached, and its latest subagent's first prefix (``sibling``)."""

    totals: UsageTotals = field(default_factory=UsageTotals)
    routing_key: str | None = None
    #: The client's prefix chain (block hashes, at most :data:`SIBLING_BLOCKS`) of the first request the latest
    #: subagent of the lineage sent: where the next subagent's prompt diverges from it is their shared prefix.
    sibling: tuple[bytes, ...] | None = None
    #: When the lineage's latest subagents sent their first requests (seconds, at most 32).
    spawns: tuple[float, ...] = ()


#: Leading blocks of a subagent's first request a lineage remembers (32 bytes each, hashes only).
SIBLING_BLOCKS = 512
#: Bytes of one remembered lineage (its entry, Lineage and totals), and of each hash of its sibling chain (a 16-byte
#: bytes object and its slot): measured with a ``sys.getsizeof`` walk, rounded up.
LINEAGE_BYTES = 700
SIBLING_HASH_BYTES = 60
