"""The ledger's cross-session static index: which session first sent each static prefix (tools and system) of a
cache scope, so a session's first request can be compared with the one it would otherwise share its prefix with.
Only a request's static head is kept, never the whole request, within a byte bound."""

from __future__ import annotations

from collections import OrderedDict
from dataclasses import dataclass, field

from ..model._canonical import CanonicalRequest, static_end

__all__ = ["STATIC_BLOCK_BYTES", "STATIC_ENTRY_BYTES", "StaticIndex", "static_head"]

#: Bytes of one static-index entry (a chain hash, its slot and tuple), and of one block of a static head beside its
#: data (the Block, its slot in the head's tuples): measured with a ``sys.getsizeof`` walk, rounded up.
STATIC_ENTRY_BYTES = 250
STATIC_BLOCK_BYTES = 450


@dataclass(slots=True)
class StaticIndex:
    """Static-prefix chain hashes → (session, the static head of the request that sent them, the entry's estimated
    bytes), for cross-session breaks. Only the head (tools and system) is kept, never the whole request; at most
    ``max_bytes`` (None: unbounded), oldest entries forgotten first."""

    max_bytes: int | None = None
    refs: OrderedDict[bytes, tuple[str, CanonicalRequest, int]] = field(default_factory=OrderedDict)
    bytes: int = 0

    def add(self, session: str, req: CanonicalRequest) -> None:
        end = static_end(req)
        new = [h for h in req.chain[:end] if h not in self.refs]
        if not new:
            return
        head = static_head(req, end)
        share = sum(len(b.data) + len(b.env) + STATIC_BLOCK_BYTES for b in head.blocks) // len(new)
        for h in new:
            self.refs[h] = (session, head, STATIC_ENTRY_BYTES + share)
            self.bytes += STATIC_ENTRY_BYTES + share
        while self.max_bytes is not None and self.bytes > self.max_bytes and self.refs:
            self.bytes -= self.refs.popitem(last=False)[1][2]

    def match(self, req: CanonicalRequest) -> tuple[str, CanonicalRequest] | None:
        best = None
        for h in req.chain[: static_end(req)]:
            ref = self.refs.get(h)
            if ref is None:
                break
            best = ref
        if best is None and req.chain:
            best = self.refs.get(req.chain[0])
        return (best[0], best[1]) if best is not None else None


def static_head(req: CanonicalRequest, end: int) -> CanonicalRequest:
    """``req``'s first ``end`` blocks (options, tools, system) as a request of its own, with no messages."""
    return req.evolve(
        blocks=req.blocks[:end], chain=req.chain[:end], cum_tokens=req.cum_tokens[:end], digests=req.digests[:end],
        msg_start=(), marked=tuple(i for i in req.marked if i < end),
    )  # fmt: skip
