"""The diagnosis of a divergent conversation (``_diagnose._classify_messages``, which reads the messages' meanings in
one pass and tries an alignment only where its first pair agrees) names the same cause as the plain reference below
(every message's meaning by :func:`message_value`, every alignment tried in turn) on random edits of conversations
whose messages repeat (so that many alignments are tried and some hold)."""

from __future__ import annotations

import random
from typing import Any

import pytest

from agentcache.adapters import canonicalize
from agentcache.analysis import _diagnose
from agentcache.model import _causes as C
from agentcache.model._canonical import MEDIA_TYPES, Block, CanonicalRequest, message_indices
from agentcache.model._equivalence import message_value


def reference(prev: CanonicalRequest, new: CanonicalRequest, pb: Block, nb: Block | None) -> str:
    """main's ``_diagnose._classify_messages`` before issue 26 (every message's meaning by a walk over all blocks,
    each alignment tried in turn): the cause the faster one must name, and benchmarks/turn_profile.py's "before"."""
    if nb is None:
        return C.MESSAGES_REMOVED
    mi = pb.message if pb.message is not None else nb.message
    assert mi is not None
    p = [message_value(prev, m) for m in message_indices(prev) if m >= mi]
    q = [message_value(new, m) for m in message_indices(new) if m >= mi]

    def aligned(i: int, j: int) -> bool:
        span = min(len(p) - i, len(q) - j)
        return span > 0 and all(p[i + t] == q[j + t] for t in range(span))

    if not q:
        return C.MESSAGES_REMOVED
    if p and p[0] == q[0]:
        flip = pb.path.endswith(".content") != nb.path.endswith(".content")
        return C.MESSAGES_SHAPE if flip else C.MESSAGES_SERIALIZATION
    if pb.kind in MEDIA_TYPES or nb.kind in MEDIA_TYPES:
        return C.MESSAGES_MEDIA_CHANGED
    if len(p) > 1 and aligned(1, 1):
        return C.MESSAGES_EDITED
    for k in range(1, len(q)):
        if aligned(0, k):
            return C.MESSAGES_INSERTED
    for k in range(1, len(p)):
        if aligned(k, 0):
            return C.MESSAGES_REMOVED
    for r in (1, 2):
        for m in range(r + 1, len(p)):
            if r < len(q) and aligned(m, r):
                return C.MESSAGES_COMPACTED
    first = min((b.message for b in prev.blocks if b.section == "message" and b.message is not None), default=mi)
    if mi == first and len(p) > len(q) + 1:
        return C.MESSAGES_COMPACTED
    return C.MESSAGES_EDITED


def _message(rng: random.Random, i: int) -> dict[str, Any]:
    text = rng.choice(["yes", "no", "ok", "again", f"turn {rng.randrange(4)}"])
    role = "user" if i % 2 == 0 else "assistant"
    content: Any = text if rng.random() < 0.5 else [{"type": "text", "text": text}]  # a shape flip is no edit
    return {"role": role, "content": content}


def _edited(rng: random.Random, msgs: list[dict[str, Any]]) -> list[dict[str, Any]]:
    out = list(msgs)
    for _ in range(rng.randrange(1, 3)):
        op, at = rng.randrange(5), rng.randrange(len(out) + 1)
        if op == 0:
            out.insert(at, _message(rng, at))
        elif op == 1 and out:
            del out[min(at, len(out) - 1)]
        elif op == 2 and out:
            out[min(at, len(out) - 1)] = _message(rng, at)
        elif op == 3 and len(out) > 3:
            out = [_message(rng, 0), *out[rng.randrange(2, len(out)) :]]  # compacted: a summary, then the tail
        else:
            out += [_message(rng, len(out)), _message(rng, len(out) + 1)]
    return out or [_message(rng, 0)]


@pytest.mark.parametrize("api", ["anthropic.messages", "openai.chat"])
def test_classify_messages_names_the_reference_cause(api: str, monkeypatch: pytest.MonkeyPatch) -> None:
    rng = random.Random(26)
    causes: set[str] = set()
    for _ in range(400):
        msgs = [_message(rng, i) for i in range(rng.randrange(2, 14))]
        body = {"model": "m", "max_tokens": 8, "messages": msgs}
        prev = canonicalize(api, body)
        new = canonicalize(api, {**body, "messages": _edited(rng, msgs)})
        ours = _diagnose.diagnose(prev, new)
        with monkeypatch.context() as m:
            m.setattr(_diagnose, "_classify_messages", reference)
            theirs = _diagnose.diagnose(prev, new)
        assert ours == theirs
        causes.add(str(ours.cause))
    assert {"messages.inserted", "messages.removed", "messages.compacted", "messages.edited"} <= causes
