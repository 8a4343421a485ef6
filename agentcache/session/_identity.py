"""Who a request belongs to: the identity a door knows (:class:`Identity`), and the prefix index that infers the
session of a request that names none.

**Precedence** (docs/design.md, "Session identity precedence"): an explicit id (``x-agentcache-session`` /
``x-agentcache-parent``, a :class:`~agentcache.Session` object, a recorded session name) > what the client
itself declares (:mod:`agentcache.session._clients`) > the OpenAI ``prompt_cache_key`` > inference > a new id.

**Inference.** A request's :class:`Checkpoints` are the hash chain (``h_k = H(h_{k-1} || d_k)``) over the digests
of its conversation items (compact JSON, cache markers stripped), one hash per message boundary, and the digest of
its *prefix* (tools and system). A message whose content is a string or a list of one text block is hashed by its
role, its text and its other keys, so both forms of it are one item (the ``messages.shape`` repair's rule), whatever
else the message carries (Claude Code 2.1.332 puts ``output_config`` on its ``role: "system"`` message and sends
that message as a marked one-block list first, a string afterwards). An item's digest and chain link depend on its
text and what precedes it alone, so they are computed once and follow the item into later turns' parses
(:meth:`~agentcache.model._rawjson.RawBody.facts`). The chain leaves tools, system and options out, so a reordered
tool list, a changed date in the system prompt or a model switch still finds its session and is diagnosed as a
break.

A request joins a session only when it continues that session's last request; anything else is a new session.
It **continues** a session when

* its conversation strictly extends the session's last request (the client appended at least the answer): the
  deepest such *head* with the same prefix wins, else the deepest with any prefix; or, failing that,
* it is that conversation *resumed with its history rewritten*: it carries the final item of the session's last
  request (by its text's first paragraph, surrounding whitespace aside) before its own last item, and either begins
  with the session's opening (its first ``opening`` items, ``min_inner_match``) or has its tools and system (a
  restored transcript, an elided tool output, an edited answer: aider re-reads its chat history from markdown and
  inserts it before its files turns; Qwen Code's ``--continue`` drops the date reminder from the first message).
  The deepest such item wins.

A request that merely *equals* another session's last request is a new conversation (a second run of the same
task), and so is one that shares only an opening with a session (aider opens every chat with the same example
exchange), so a conversation, once given a session, keeps it and two conversations never merge on their opening.
Each live inferred session indexes four keys of its latest request: its chain head, that head keyed by its
prefix digest, and its two *anchors* (its final item under its prefix, and under its opening). Two conversations
with the same prefix and identical histories cannot be told apart without an explicit or declared id. Sessions
with an explicit id are not indexed; a lineage the client declares (Claude Code's session id) is indexed on its own
chain (``scope``), so inference inside it never reaches another lineage.
"""

from __future__ import annotations

import secrets
from collections.abc import Callable, Mapping
from dataclasses import dataclass
from hashlib import blake2b
from typing import Any

from ..adapters import wire_for
from ..model._canonical import MARKER_KEYS, item_text
from ..model._rawjson import RawBody, encode_sorted

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
    """A request's keys in the prefix index: ``chain`` (element ``k`` names conversation items ``0..k``),
    ``prefix``, the digest of its tools and system, and ``marks``, each item's digest by its text's first paragraph,
    surrounding whitespace aside (what a resume is recognised by). :meth:`keyed` are the chain's hashes under that
    prefix; :meth:`anchors` the keys of an item as the final item of a request like this one."""

    chain: tuple[bytes, ...] = ()
    prefix: bytes = b""
    marks: tuple[bytes, ...] = ()

    def __len__(self) -> int:
        return len(self.chain)

    def keyed(self) -> tuple[bytes, ...]:
        """Element ``k``: checkpoint ``k`` of a request with this prefix (the index keys a session's head so)."""
        return tuple(blake2b(self.prefix + c, digest_size=16).digest() for c in self.chain)

    def key(self, k: int) -> bytes:
        """``keyed()[k]`` alone."""
        return blake2b(self.prefix + self.chain[k], digest_size=16).digest()

    def anchors(self, k: int, opening: int) -> tuple[bytes, ...]:
        """The keys of item ``k`` as the final item of a request with this request's tools and system, and, when
        ``k`` lies past them, with its first ``opening`` items."""
        mark = self.marks[k]
        keyed = blake2b(b"\x03" + self.prefix + mark, digest_size=16).digest()
        if k < opening:
            return (keyed,)
        return keyed, blake2b(b"\x02" + self.chain[opening - 1] + mark, digest_size=16).digest()

    def resumes(self, opening: int) -> list[bytes]:
        """The anchors a resumed request looks up, deepest item first: every item but its last (a request goes
        beyond the history it resumes)."""
        return [a for k in range(len(self.marks) - 2, -1, -1) for a in self.anchors(k, opening)]

    def lookups(self, opening: int) -> tuple[bytes, ...]:
        """Every hash :func:`match_checkpoints` may look up: :meth:`keyed`, the chain, then :meth:`resumes`."""
        return (*self.keyed(), *self.chain, *self.resumes(opening))


NO_CHECKPOINTS = Checkpoints()


def new_session_id() -> str:
    """A fresh id for a session the request did not name."""
    return "s-" + secrets.token_hex(8)


def conversation_of(api: str, body: Mapping[str, Any]) -> list[Any]:
    """The conversation items of a wire body (its wire's :meth:`~agentcache.adapters.Wire.conversation`:
    Anthropic ``messages``; Chat ``messages`` and Responses ``input`` without system/developer messages). Raises
    InputError when the body has none, ConfigError for an unknown ``api``."""
    return wire_for(api).conversation(body)


def _plain(item: Any) -> tuple[str, str, str] | None:
    """``(role, text, the message's other keys as sorted JSON)`` for a message whose content is a string or a list
    of one text block (the same message to a reader, and to :mod:`agentcache.analysis._repair`; a marker on that
    block aside); None for any other item. A Responses ``"type": "message"`` is no other key (an item without a
    type is a message)."""
    if not isinstance(item, dict):
        return None
    role, content = item.get("role"), item.get("content")
    if not isinstance(role, str):
        return None
    if isinstance(content, list) and len(content) == 1 and isinstance(content[0], dict):
        block = content[0]
        content = block.get("text")
        if block.get("type") not in _TEXT_TYPES or not block.keys() <= _TEXT_KEYS:
            return None
    if not isinstance(content, str):
        return None
    rest = {k: v for k, v in item.items() if k not in ("role", "content") and (k, v) != ("type", "message")}
    return role, content, encode_sorted(rest) if rest else ""


def _item_digests(api: str, item: Any, raw: RawBody | None) -> tuple[bytes, bytes]:
    """``(digest, mark)`` of one conversation item: of ``"\\x01<role>\\x00<text>[\\x00<other keys>]"`` when it is a
    role and a text (either form; the leading ``\\x01`` cannot begin a JSON text, so no other item's hash input
    equals it), else of its source text (or encoding) with markers cut out. The mark is the digest of its text's
    first paragraph, surrounding whitespace stripped (a resumed chat may come back with whitespace rewritten and
    without what was appended to the prompt: aider in Anthropic mode appends its rules to the prompt it sends and
    restores the prompt alone); for any other item, the digest."""
    plain = _plain(item)
    if plain is None:
        data = item_text(api, item, raw.text_of(item) if raw is not None else None).encode()
        d = blake2b(data, digest_size=16).digest()
        return d, d
    role, text, rest = plain
    tail = f"\x00{rest}" if rest else ""  # a message of role and content alone hashes as it always did
    d = blake2b(f"\x01{role}\x00{text}{tail}".encode("utf-8", "surrogatepass"), digest_size=16).digest()
    first = text.strip().split("\n\n", 1)[0].rstrip()
    if first == text:
        return d, d
    mark = f"\x01{role}\x00{first}{tail}".encode("utf-8", "surrogatepass")
    return d, blake2b(mark, digest_size=16).digest()


def checkpoints_of(
    api: str, body: Mapping[str, Any], raw: RawBody | None = None, *, scope: str | None = None
) -> Checkpoints:
    """The prefix-index keys of a request (see the module docstring): the hash chain over its conversation
    (markers stripped), seeded with the wire API (a session never spans two APIs) and ``scope`` (a declared
    lineage: its sessions are indexed apart), and the digest of its tools and system. ``raw``: the body's source
    texts (:func:`agentcache.model._rawjson.loads`); an item is then hashed as the client wrote it, markers cut
    out, instead of encoded again (a client writes an unchanged item the same way every turn). Raises InputError
    when the body has no conversation list."""
    wire = wire_for(api)
    out: list[bytes] = []
    marks: list[bytes] = []
    cur = blake2b(api.encode() + (b"\x00" + scope.encode() if scope is not None else b""), digest_size=16).digest()
    fact, unit_fact = "checkpoint:" + api, "prefix:" + api  # a conversation item's facts; a prefix unit's
    for item in wire.conversation(body):
        # (item digest, its mark, chain before, chain after): an item re-used from the last turn's parse, after
        # the same chain, extends it the same way (the usual turn hashes only its new items).
        facts = raw.facts(item) if raw is not None else None
        hit = facts.get(fact) if facts is not None else None
        if hit is not None and hit[2] == cur:
            cur = hit[3]
        else:
            d, mark = hit[:2] if hit is not None else _item_digests(api, item, raw)
            nxt = blake2b(cur + d, digest_size=16).digest()
            hit = (d, mark, cur, nxt)
            if facts is not None:
                facts[fact] = hit
            cur = nxt
        out.append(cur)
        marks.append(hit[1])
    p = blake2b(digest_size=16)
    for unit in wire.prefix_units(body):
        facts = raw.facts(unit) if raw is not None and unit is not None else None
        d = facts.get(unit_fact) if facts is not None else None
        if d is None:
            text = raw.text_of(unit) if raw is not None and unit is not None else None
            d = blake2b(item_text(api, unit, text).encode(), digest_size=16).digest()
            if facts is not None:
                facts[unit_fact] = d
        p.update(d)
    return Checkpoints(tuple(out), p.digest(), tuple(marks))


def index_entries(checkpoints: Checkpoints, opening: int) -> list[tuple[bytes, bool]]:
    """The ``(hash, is_head)`` entries a session holds in the index for a request with ``checkpoints``: the
    deepest checkpoint of its chain (its head), that head keyed by the request's prefix, and its anchors (its final
    item under its prefix, and under its first ``opening`` items when it is longer)."""
    chain = checkpoints.chain
    if not chain:
        return []
    entries = [(chain[-1], True), (checkpoints.key(len(chain) - 1), True)]
    entries += [(a, False) for a in checkpoints.anchors(len(chain) - 1, opening)]
    return entries


def match_checkpoints(
    checkpoints: Checkpoints, lookup: Callable[[bytes], tuple[str, bool] | None], opening: int
) -> str | None:
    """The session a request with ``checkpoints`` continues, under the rule of the module docstring: the deepest
    head the request strictly extends, one with the same prefix first; without one, the session whose final item
    the request carries deepest, after their common ``opening`` items or under the same prefix (a resume that
    rewrote history); else None (a request equal to a session's last request, or sharing only an opening with it,
    continues none)."""
    chain = checkpoints.chain
    n = len(chain)
    for k in range(n - 1, 0, -1):  # keyed one by one: a continued session is found at one of the first few
        hit = lookup(checkpoints.key(k - 1))
        if hit is not None and hit[1]:
            return hit[0]
    for k in range(n - 1, 0, -1):
        hit = lookup(chain[k - 1])
        if hit is not None and hit[1]:
            return hit[0]
    for anchor in checkpoints.resumes(opening):
        hit = lookup(anchor)
        if hit is not None and not hit[1]:
            return hit[0]
    return None
