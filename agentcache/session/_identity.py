"""Who a request belongs to: the identity a door knows (:class:`Identity`), and the prefix index that infers the
session of a request that names none.

**Precedence** (docs/design.md, "Session identity precedence"): an explicit id (``x-agentcache-session`` /
``x-agentcache-parent``, a :class:`~agentcache.Session` object, a recorded session name) > what the client
itself declares (:mod:`agentcache.session._clients`) > the OpenAI ``prompt_cache_key`` > inference > a new id.

**Inference.** A request's :class:`Checkpoints` are the hash chain (``h_k = H(h_{k-1} || d_k)``) over the digests
of its conversation items (compact JSON, cache markers stripped, a one-text-block content list read as its
string), one hash per message boundary, and the digest of its *prefix* (tools and system). An item's digest and
chain link depend on its text and what precedes it alone, so they are computed once and follow the item into later
turns' parses (:meth:`~agentcache.model._rawjson.RawBody.facts`). The chain leaves tools, system and options out,
so a reordered tool list, a changed date in the system prompt or a model switch still finds its session and is
diagnosed as a break.
Each live inferred session indexes the last ``index_checkpoints`` checkpoints of its latest request, the deepest
one marked as its *head*, plus that head keyed by its prefix digest. A request **continues** a session when its
conversation strictly extends that session's last request (the client appended at least the answer): the
deepest such head with the same prefix wins, else the deepest such head with any prefix. Without one, its
deepest checkpoint inside a session's history wins when it covers at least ``min_inner_match`` messages and the
request goes beyond it (the client edited or elided history). Anything else starts a new session: a request
that merely *equals* another session's last request is a new conversation (a second run of the same task, two
agents with the same opening), so a conversation, once given a session, keeps it. Two conversations with the
same prefix and identical histories cannot be told apart without an explicit or declared id. Sessions with an
explicit id are not indexed; a lineage the client declares (Claude Code's session id) is indexed on its own
chain (``scope``), so inference inside it never reaches another lineage.
"""

from __future__ import annotations

import secrets
from collections.abc import Callable, Mapping
from dataclasses import dataclass
from hashlib import blake2b
from typing import Any

from .._exceptions import InputError
from ..model._canonical import MARKER_KEYS, item_text
from ..model._rawjson import RawBody

__all__ = [
    "LOCAL_TENANT",
    "NO_CHECKPOINTS",
    "Checkpoints",
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
_TEXT_TYPES = frozenset({"text", "input_text"})
# A marker on the one block of a content list sits where both APIs define one (model/_canonical.MARKERS).
_TEXT_KEYS = frozenset({"type", "text", *MARKER_KEYS})


@dataclass(frozen=True, slots=True)
class Identity:
    """What a door knows about whose request this is (see the module docstring for the precedence).

    ``tenant``: the namespace (the proxy's salted API-key hash; one tenant never sees another's sessions).
    ``session``/``parent``: explicit ids. ``declared``/``declared_parent``: the session and parent ids the client
    itself declares (:func:`agentcache.session.declared_by`); ``declared_lineage``: ``declared`` names the
    client's whole lineage (its main conversation and the side requests it sends under the same id), so the
    session inside it is inferred. ``cache_key``: the client's ``prompt_cache_key``, taken as its session id when
    nothing better names one. ``infer``: look the conversation up in the prefix index.
    """

    tenant: str = LOCAL_TENANT
    session: str | None = None
    parent: str | None = None
    cache_key: str | None = None
    infer: bool = False
    declared: str | None = None
    declared_parent: str | None = None
    declared_lineage: bool = False


@dataclass(frozen=True, slots=True)
class Checkpoints:
    """A request's keys in the prefix index: ``chain`` (element ``k`` names conversation items ``0..k``) and
    ``prefix``, the digest of its tools and system. :meth:`keyed` are the chain's hashes under that prefix."""

    chain: tuple[bytes, ...] = ()
    prefix: bytes = b""

    def __len__(self) -> int:
        return len(self.chain)

    def keyed(self) -> tuple[bytes, ...]:
        """Element ``k``: checkpoint ``k`` of a request with this prefix (the index keys a session's head so)."""
        return tuple(blake2b(self.prefix + c, digest_size=16).digest() for c in self.chain)

    def key(self, k: int) -> bytes:
        """``keyed()[k]`` alone."""
        return blake2b(self.prefix + self.chain[k], digest_size=16).digest()

    def lookups(self) -> tuple[bytes, ...]:
        """Every hash :func:`match_checkpoints` may look up: the chain, then :meth:`keyed`."""
        return (*self.chain, *self.keyed())


NO_CHECKPOINTS = Checkpoints()


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


def _plain(item: Any) -> str | None:
    """``"\x01<role>\x00<text>"`` for a message that is only a role and a text: string content, or a list of
    one text block (the same message to a reader, and to :mod:`agentcache.analysis._repair`; a marker on that
    block aside). Both forms hash alike, with no encoding; None for any other item. The leading ``\x01`` cannot
    begin a JSON text, so no other item's hash input equals it."""
    if not isinstance(item, dict) or len(item) > 3:
        return None
    role, content = item.get("role"), item.get("content")
    if not isinstance(role, str) or len(item) != (3 if item.get("type") == "message" else 2):
        return None
    if isinstance(content, str):
        return f"\x01{role}\x00{content}"
    if not (isinstance(content, list) and len(content) == 1 and isinstance(content[0], dict)):
        return None
    block = content[0]
    text = block.get("text")
    if block.get("type") not in _TEXT_TYPES or not isinstance(text, str) or not block.keys() <= _TEXT_KEYS:
        return None
    return f"\x01{role}\x00{text}"


def _item_digest(api: str, item: Any, raw: RawBody | None) -> bytes:
    """The digest of one conversation item in the chain: of its role and text when it is only that (either form),
    else of its source text (or encoding) with markers cut out."""
    plain = _plain(item)
    if plain is not None:  # a role and a text: hashed as such, whichever of the two forms the client sent
        data = plain.encode("utf-8", "surrogatepass")
    else:
        data = item_text(api, item, raw.text_of(item) if raw is not None else None).encode()
    return blake2b(data, digest_size=16).digest()


def _prefix_units(api: str, body: Mapping[str, Any]) -> list[Any]:
    """The tools and system units of a wire body (what precedes the conversation)."""
    units: list[Any] = [body.get("tools")]
    if api == "anthropic.messages":
        units.append(body.get("system"))
        return units
    items = body.get("input") if api == "openai.responses" else body.get("messages")
    units.append(body.get("instructions"))
    if isinstance(items, list):
        units += [m for m in items if isinstance(m, dict) and m.get("role") in _SYSTEM_ROLES]
    return units


def checkpoints_of(
    api: str, body: Mapping[str, Any], raw: RawBody | None = None, *, scope: str | None = None
) -> Checkpoints:
    """The prefix-index keys of a request (see the module docstring): the hash chain over its conversation
    (markers stripped), seeded with the wire API (a session never spans two APIs) and ``scope`` (a declared
    lineage: its sessions are indexed apart), and the digest of its tools and system. ``raw``: the body's source
    texts (:func:`agentcache.model._rawjson.loads`); an item is then hashed as the client wrote it, markers cut
    out, instead of encoded again (a client writes an unchanged item the same way every turn). Raises InputError
    when the body has no conversation list."""
    out: list[bytes] = []
    cur = blake2b(api.encode() + (b"\x00" + scope.encode() if scope is not None else b""), digest_size=16).digest()
    fact, unit_fact = "checkpoint:" + api, "prefix:" + api  # a conversation item's facts; a prefix unit's
    for item in conversation_of(api, body):
        # (item digest, chain before, chain after): an item re-used from the last turn's parse, after the same
        # chain, extends it the same way (the usual turn hashes only its new items).
        facts = raw.facts(item) if raw is not None else None
        hit = facts.get(fact) if facts is not None else None
        if hit is not None and hit[1] == cur:
            cur = hit[2]
        else:
            d = hit[0] if hit is not None else _item_digest(api, item, raw)
            nxt = blake2b(cur + d, digest_size=16).digest()
            if facts is not None:
                facts[fact] = (d, cur, nxt)
            cur = nxt
        out.append(cur)
    p = blake2b(digest_size=16)
    for unit in _prefix_units(api, body):
        facts = raw.facts(unit) if raw is not None and unit is not None else None
        d = facts.get(unit_fact) if facts is not None else None
        if d is None:
            text = raw.text_of(unit) if raw is not None and unit is not None else None
            d = blake2b(item_text(api, unit, text).encode(), digest_size=16).digest()
            if facts is not None:
                facts[unit_fact] = d
        p.update(d)
    return Checkpoints(tuple(out), p.digest())


def index_entries(checkpoints: Checkpoints, keep: int) -> list[tuple[bytes, bool]]:
    """The ``(hash, is_head)`` entries a session holds in the index for a request with ``checkpoints``: the last
    ``keep`` checkpoints of its chain, the deepest one its head, and that head keyed by the request's prefix."""
    chain = checkpoints.chain
    if not chain:
        return []
    tail = list(chain[-keep:])
    entries = [(h, i == len(tail) - 1) for i, h in enumerate(tail)]
    entries.append((checkpoints.key(len(chain) - 1), True))
    return entries


def match_checkpoints(
    checkpoints: Checkpoints, lookup: Callable[[bytes], tuple[str, bool] | None], min_inner: int
) -> str | None:
    """The session a request with ``checkpoints`` continues, under the rule of the module docstring: the deepest
    head the request strictly extends, one with the same prefix first; without one, the deepest acceptable inner
    checkpoint; else None (a request equal to a session's last request does not continue it)."""
    chain = checkpoints.chain
    n = len(chain)
    for k in range(n - 1, 0, -1):  # keyed one by one: a continued session is found at one of the first few
        hit = lookup(checkpoints.key(k - 1))
        if hit is not None and hit[1]:
            return hit[0]
    inner: str | None = None
    for k in range(n - 1, 0, -1):
        hit = lookup(chain[k - 1])
        if hit is None:
            continue
        sid, head = hit
        if head:
            return sid
        if inner is None and min_inner <= k:
            inner = sid
    return inner
