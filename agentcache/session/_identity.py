"""Who a request belongs to: the identity a door knows (:class:`Identity`), and the prefix index that infers the
session of a request that names none.

**Precedence** (docs/design.md, "Session identity precedence"): an explicit id (``x-agentcache-session`` /
``x-agentcache-parent``, a :class:`~agentcache.Session` object, a recorded session name) > what the client
itself declares > the OpenAI ``prompt_cache_key`` > inference > a new id.

**Inference.** A request's *checkpoints* are the hash chain over its conversation (compact JSON, cache markers
stripped), one hash per message boundary. Tools, system and options are left out, so a reordered tool list, a
changed date in the system prompt or a model switch still finds its session and is diagnosed as a break. Each
live inferred session indexes the last ``index_checkpoints`` checkpoints of its latest request, the deepest one
marked as its *head*. The new request's deepest checkpoint that is some session's head wins (the request
extends, or repeats, that session's last request). Without one, its deepest checkpoint inside a session's
history wins when it covers at least ``min_inner_match`` messages and the request goes beyond it (the client
edited or elided history). Anything else starts a new session, so two conversations that merely open with the
same first message stay apart. A checkpoint names one session, the last to send it: two sessions with
identical histories cannot be told apart without an explicit id. Sessions with an explicit id are not indexed.
"""

from __future__ import annotations

import secrets
from collections.abc import Callable, Mapping, Sequence
from dataclasses import dataclass
from hashlib import blake2b
from typing import Any

from .._exceptions import InputError
from ..model._canonical import item_text
from ..model._rawjson import RawBody

__all__ = [
    "LOCAL_TENANT",
    "Identity",
    "checkpoints_of",
    "conversation_of",
    "index_entries",
    "match_checkpoints",
    "new_session_id",
]

#: The tenant of sessions that no API key namespaces (the SDK wrappers, audits, replays, anonymous callers).
LOCAL_TENANT = "anonymous"
_SYSTEM_ROLES = frozenset({"system", "developer"})


@dataclass(frozen=True, slots=True)
class Identity:
    """What a door knows about whose request this is (see the module docstring for the precedence).

    ``tenant``: the namespace (the proxy's salted API-key hash; one tenant never sees another's sessions).
    ``session``/``parent``: explicit ids. ``cache_key``: the client's ``prompt_cache_key``, taken as its session
    id when nothing better names one. ``infer``: look the conversation up in the prefix index.
    """

    tenant: str = LOCAL_TENANT
    session: str | None = None
    parent: str | None = None
    cache_key: str | None = None
    infer: bool = False


def new_session_id() -> str:
    """A fresh id for a session the request did not name."""
    return "s-" + secrets.token_hex(8)


def conversation_of(api: str, body: Mapping[str, Any]) -> list[Any]:
    """The conversation items of a wire body: Anthropic ``messages``; Chat ``messages`` and Responses
    ``input`` without system/developer messages. Raises InputError when the body has none."""
    items = body.get("input") if api == "openai.responses" else body.get("messages")
    if isinstance(items, str) and api == "openai.responses":
        return [items]
    if not isinstance(items, list):
        raise InputError(f"{api} body needs a list of {'input' if api == 'openai.responses' else 'messages'}")
    if api == "anthropic.messages":
        return items
    return [m for m in items if not (isinstance(m, dict) and m.get("role") in _SYSTEM_ROLES)]


def checkpoints_of(api: str, body: Mapping[str, Any], raw: RawBody | None = None) -> tuple[bytes, ...]:
    """Hash chain over a request's conversation: element ``k`` names items ``0..k`` (markers stripped), seeded
    with the wire API (a session never spans two APIs). ``raw``: the body's source texts
    (:func:`agentcache.model._rawjson.loads`); an item is then hashed as the client wrote it, markers cut out,
    instead of encoded again (a client writes an unchanged item the same way every turn)."""
    out: list[bytes] = []
    h = blake2b(api.encode(), digest_size=16)
    for item in conversation_of(api, body):
        h.update(item_text(api, item, raw.text_of(item) if raw is not None else None).encode())
        h.update(b"\x00")
        out.append(h.copy().digest())
    return tuple(out)


def index_entries(checkpoints: Sequence[bytes], keep: int) -> list[tuple[bytes, bool]]:
    """The ``(hash, is_head)`` entries a session holds in the index for a request with ``checkpoints``."""
    tail = list(checkpoints[-keep:])
    return [(h, i == len(tail) - 1) for i, h in enumerate(tail)]


def match_checkpoints(
    checkpoints: Sequence[bytes], lookup: Callable[[bytes], tuple[str, bool] | None], min_inner: int
) -> str | None:
    """The session a request with ``checkpoints`` continues, under the rule of the module docstring: the
    deepest *head* found wins; without one, the deepest acceptable inner checkpoint; else None."""
    n = len(checkpoints)
    inner: str | None = None
    for k in range(n, 0, -1):
        hit = lookup(checkpoints[k - 1])
        if hit is None:
            continue
        sid, head = hit
        if head:
            return sid
        if inner is None and min_inner <= k < n:
            inner = sid
    return inner
