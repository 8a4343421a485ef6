"""Prefix diff and break diagnosis between two canonical requests.

``diagnose(prev, new)`` finds the longest shared prefix (blocks and tokens), the first divergent unit
as a wire path, and classifies the cause with the names in :mod:`agentcache.model._causes`. It works on
block hashes, so an append-only turn costs O(log n) comparisons; only a divergent turn parses the
few units it needs to tell re-serialisation from a real edit.
"""

from __future__ import annotations

from dataclasses import dataclass

from ..model import _causes as C
from ..model._canonical import (
    MEDIA_TYPES,
    Block,
    CanonicalRequest,
    common_prefix,
    digest,
    message_indices,
)
from ..model._equivalence import value_digest
from ..model._volatile import VolatileSpan, volatile_diff

_OPTION_CAUSES = {
    "model": C.OPTIONS_MODEL,
    "tool_choice": C.OPTIONS_TOOL_CHOICE,
    "thinking": C.OPTIONS_THINKING,
    "reasoning": C.OPTIONS_THINKING,
    "reasoning_effort": C.OPTIONS_THINKING,
}


@dataclass(frozen=True, slots=True)
class Divergence:
    """Where and why ``new`` stops extending ``prev``.

    ``shared_blocks``/``shared_tokens``: the longest common prefix. ``first_divergent``: the wire path
    (``tools[3]``, ``system[0]``, ``messages[5].content[0]``) or option key (``tool_choice``) of the
    first unit that differs; None when ``new`` extends ``prev`` append-only. ``cause``: a break cause,
    None when append-only. ``tokens_lost``: tokens of ``prev`` after the shared prefix, which must be
    processed again. ``volatile``: the changed span for ``system.volatile``. ``ephemeral``: trailing blocks of
    ``prev``'s newest message that ``new`` no longer carries while it goes on with new messages: blocks the client
    sends once (a per-turn status block, anthropics/claude-code#96101). No break: ``new`` extends the rest of
    ``prev`` append-only, and those blocks were never to be read again (a marker on one of them is the loss:
    ``markers.invalid``).
    """

    shared_blocks: int
    shared_tokens: int
    first_divergent: str | None
    cause: str | None
    tokens_lost: int
    volatile: VolatileSpan | None = None
    ephemeral: int = 0

    @property
    def is_break(self) -> bool:
        """True when ``new`` does not extend ``prev``."""
        return self.cause is not None


def diagnose(prev: CanonicalRequest, new: CanonicalRequest) -> Divergence:
    """Diff ``new`` against ``prev`` (an earlier request of the same session)."""
    n = common_prefix(prev, new)
    shared = prev.tokens_before(n)
    if n == len(prev.blocks):
        return Divergence(n, shared, None, None, 0)
    pb = prev.blocks[n]
    nb = new.blocks[n] if n < len(new.blocks) else None
    if _ephemeral_tail(prev, n, nb):
        return Divergence(n, shared, None, None, 0, None, len(prev.blocks) - n)
    cause, path, span = _classify(prev, new, n, pb, nb)
    return Divergence(n, shared, path, cause, prev.tokens - shared, span)


def extends(prev: CanonicalRequest, new: CanonicalRequest) -> bool:
    """Whether ``new`` extends ``prev`` (``not diagnose(prev, new).is_break``) without classifying a break: a
    caller that needs only the yes/no skips the message comparisons a divergent pair costs."""
    n = common_prefix(prev, new)
    if n == len(prev.blocks):
        return True
    return _ephemeral_tail(prev, n, new.blocks[n] if n < len(new.blocks) else None)


class Diagnosis:
    """``diagnose(prev, new)``, computed once, when first asked for (:meth:`value`): a request's divergence from
    the client's previous one is for the reports, which read it after the upstream call; what the plan needs of
    it before (:meth:`breaks`) is one prefix comparison. Equal when the divergences are."""

    __slots__ = ("_done", "new", "prev")

    def __init__(self, prev: CanonicalRequest, new: CanonicalRequest) -> None:
        self.prev, self.new = prev, new
        self._done: tuple[Divergence] | None = None

    def value(self) -> Divergence:
        """The divergence (:func:`diagnose`)."""
        if self._done is None:
            self._done = (diagnose(self.prev, self.new),)
        return self._done[0]

    def breaks(self) -> bool:
        """``value().cause is not None or value().ephemeral``: ``new`` does not extend all of ``prev`` (a break,
        or the client dropped trailing blocks of its last message), without classifying how."""
        return common_prefix(self.prev, self.new) < len(self.prev.blocks)

    def __eq__(self, other: object) -> bool:
        return isinstance(other, Diagnosis) and self.value() == other.value()

    def __hash__(self) -> int:
        return hash(self.value())


def _ephemeral_tail(prev: CanonicalRequest, n: int, nb: Block | None) -> bool:
    """Whether blocks ``n..`` of ``prev`` are trailing blocks of its newest message (which keeps its first block)
    and the new request's block ``nb`` at ``n`` begins the next message: the client dropped them and went on."""
    last = prev.messages - 1
    return last >= 0 and n > prev.msg_start[last] and nb is not None and nb.message == last + 1


def _classify(
    prev: CanonicalRequest, new: CanonicalRequest, n: int, pb: Block, nb: Block | None
) -> tuple[str, str, VolatileSpan | None]:
    if pb.is_option or (nb is not None and nb.is_option):
        key = nb.name if nb is not None and nb.is_option else pb.name
        return _OPTION_CAUSES.get(key or "", C.OPTIONS_OTHER), key or pb.path, None
    if pb.section == "tool" or (nb is not None and nb.section == "tool"):
        return (
            _classify_tools(prev, new, pb, nb),
            (nb.path if nb is not None and nb.section == "tool" else pb.path),
            None,
        )
    if nb is not None and pb.section == "system" and nb.section == "system":
        if value_digest(pb, prev.api) == value_digest(nb, new.api):
            return C.SYSTEM_CHANGED, nb.path, None
        span = volatile_diff(pb.text(), nb.text())
        return (C.SYSTEM_VOLATILE if span else C.SYSTEM_CHANGED), nb.path, span
    if (pb.section == "system" and pb.message is None) or (
        nb is not None and nb.section == "system" and nb.message is None
    ):
        return C.SYSTEM_CHANGED, (nb or pb).path, None
    return _classify_messages(prev, new, pb, nb), (nb.path if nb is not None else pb.path), None


def _classify_tools(prev: CanonicalRequest, new: CanonicalRequest, pb: Block, nb: Block | None) -> str:
    old_names = [b.name for b in prev.blocks if b.section == "tool"]
    new_names = [b.name for b in new.blocks if b.section == "tool"]
    nb_tool = nb if nb is not None and nb.section == "tool" else None
    pb_tool = pb if pb.section == "tool" else None
    if nb_tool is not None and pb_tool is not None and nb_tool.name == pb_tool.name:
        same = value_digest(pb_tool, prev.api) == value_digest(nb_tool, new.api)
        return C.TOOLS_SERIALIZATION if same else C.TOOLS_CHANGED
    if nb_tool is not None and nb_tool.name not in old_names:
        return C.TOOLS_ADDED
    if pb_tool is not None and pb_tool.name not in new_names:
        return C.TOOLS_REMOVED
    if sorted(map(str, old_names)) == sorted(map(str, new_names)):
        return C.TOOLS_REORDERED
    return C.TOOLS_ADDED if len(new_names) > len(old_names) else C.TOOLS_REMOVED


def _classify_messages(prev: CanonicalRequest, new: CanonicalRequest, pb: Block, nb: Block | None) -> str:
    if nb is None:
        return C.MESSAGES_REMOVED
    mi = pb.message if pb.message is not None else nb.message
    assert mi is not None
    old = [m for m in message_indices(prev) if m >= mi]
    cur = [m for m in message_indices(new) if m >= mi]
    p, q = _message_values(prev, old), _message_values(new, cur)
    if not q:
        return C.MESSAGES_REMOVED
    if p and p[0] == q[0]:
        # Same meaning, different bytes: a string/array flip is a shape change.
        flip = pb.path.endswith(".content") != nb.path.endswith(".content")
        return C.MESSAGES_SHAPE if flip else C.MESSAGES_SERIALIZATION
    if pb.kind in MEDIA_TYPES or nb.kind in MEDIA_TYPES:
        return C.MESSAGES_MEDIA_CHANGED
    if len(p) > 1 and _aligned(p, 1, q, 1):
        return C.MESSAGES_EDITED
    # Each search below tries an alignment only where its first pair is equal (what _aligned checks first).
    for k in range(1, len(q)):
        if p and q[k] == p[0] and _aligned(p, 0, q, k):
            return C.MESSAGES_INSERTED
    for k in range(1, len(p)):
        if p[k] == q[0] and _aligned(p, k, q, 0):
            return C.MESSAGES_REMOVED
    for r in (1, 2):
        for m in range(r + 1, len(p)):
            if r < len(q) and p[m] == q[r] and _aligned(p, m, q, r):
                return C.MESSAGES_COMPACTED
    first_msg = min((b.message for b in prev.blocks if b.section == "message" and b.message is not None), default=mi)
    if mi == first_msg and len(p) > len(q) + 1:
        return C.MESSAGES_COMPACTED
    return C.MESSAGES_EDITED


def _message_values(req: CanonicalRequest, indices: list[int]) -> list[bytes]:
    """The meanings of ``req``'s messages ``indices``, in order: each the digest of its blocks' :func:`value_digest`
    in order (:func:`~agentcache.model._equivalence.message_value`), the blocks grouped by message in one pass
    (``message_value`` walks every block of the request for each message: quadratic over a long conversation)."""
    groups: dict[int, list[bytes]] = {m: [] for m in indices}
    api = req.api
    for b in req.blocks:
        if b.message is not None:
            group = groups.get(b.message)
            if group is not None:
                group.append(value_digest(b, api))
    return [digest(*groups[m]) for m in indices]


def _aligned(p: list[bytes], i: int, q: list[bytes], j: int) -> bool:
    """``p[i:]`` and ``q[j:]`` agree on their overlap, and the overlap is not empty."""
    span = min(len(p) - i, len(q) - j)
    return span > 0 and p[i : i + span] == q[j : j + span]
