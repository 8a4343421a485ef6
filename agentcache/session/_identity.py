"""Who a request belongs to: the identity a door knows (:class:`Identity`), and the prefix index that infers the
session of a request that names none.

**Precedence** (docs/design.md, "Session identity precedence"): an explicit id (``x-agentcache-session`` /
``x-agentcache-parent``, a :class:`~agentcache.Session` object, a recorded session name) > what the client
itself declares (:mod:`agentcache.session._clients`) > the OpenAI ``prompt_cache_key`` > inference > a new id.

**Inference.** A request is canonicalized once, before its session is looked up
(:class:`~agentcache.session._lookup.Canonicalizer`), and its :class:`Checkpoints` are read off that canonical
request (:func:`checkpoints_from`): the hash chain (``h_k = H(h_{k-1} || d_k)``) over the digests of its
conversation messages, one hash per message boundary,
where ``d_k`` comes from the message's canonical blocks (the bytes and digests ``CanonicalRequest.chain`` hashes,
markers stripped), and the digest of its *prefix* (its tools and system blocks). A message the API reads as a
string (a string, or one text part: :class:`~agentcache.model._equivalence.TextShape`, the table the repairs read)
is hashed by its role, its text and its other keys, so both forms of it are one item (the ``messages.shape``
repair's rule), whatever else the message carries (Claude Code 2.1.332 puts ``output_config`` on its
``role: "system"`` message and sends that message as a marked one-block list first, a string afterwards). A
message's link depends on what precedes it and its blocks alone, so it is computed once and found again by its
block digests in later turns. The chain leaves tools, system and options out, so a reordered tool list, a changed
date in the system prompt or a model switch still finds its session and is diagnosed as a break.

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
import weakref
from bisect import bisect_right
from collections.abc import Callable, Mapping
from dataclasses import dataclass
from hashlib import blake2b
from typing import Any

from ..adapters import canonicalize, wire_for
from ..model._build import BlockCache, shared_run
from ..model._canonical import Block, CanonicalRequest
from ..model._equivalence import plain_text
from ..model._rawjson import RawBody, encode_sorted, parse

__all__ = [
    "LOCAL_TENANT",
    "NO_CHECKPOINTS",
    "Checkpoints",
    "Identity",
    "carries_last",
    "checkpoints_from",
    "checkpoints_of",
    "conversation_of",
    "index_entries",
    "match_checkpoints",
    "new_session_id",
]

#: The tenant of sessions that no API key namespaces (the SDK wrappers, audits, replays, anonymous callers).
LOCAL_TENANT = "anonymous"


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


def checkpoints_of(
    api: str, body: dict[str, Any], raw: RawBody | None = None, *, scope: str | None = None
) -> Checkpoints:
    """The prefix-index keys of wire ``body`` (:func:`checkpoints_from` of its canonical request; ``raw``: its
    source texts). Raises InputError for a malformed body."""
    cache = BlockCache()
    cache.begin(raw)
    return checkpoints_from(canonicalize(api, body, cache=cache), scope=scope, cache=cache)


@dataclass(frozen=True, slots=True)
class _Walk:
    """One :func:`checkpoints_from` walk, for the next request of the conversation: the ``api``, block ``digests``
    and message starts (``starts``) of the request walked under ``scope`` (not the request: a walk holds no unit's
    bytes); ``links``/``marks`` its checkpoints' chain and marks; ``count[j]``: its conversation messages
    among its first ``j`` messages; ``system``: ``(message index, its blocks' digests)`` of its system-section
    messages (OpenAI)."""

    api: str
    digests: tuple[bytes, ...]
    starts: tuple[int, ...]
    scope: str | None
    links: tuple[bytes, ...]
    marks: tuple[bytes, ...]
    count: tuple[int, ...]
    system: tuple[tuple[int, bytes], ...]


# The latest walk of each conversation, by the block cache that built its request (the conversation's own, found
# through its parsed messages, so however many conversations interleave), and the latest walks of the process,
# newest first: a request re-uses the links of the one it shares the most leading messages with (its
# conversation's previous turn), so a turn walks its new messages only.
_WALK_OF: weakref.WeakKeyDictionary[BlockCache, _Walk] = weakref.WeakKeyDictionary()
_WALKS: list[_Walk] = []
_WALKS_KEPT = 8


def _resume(req: CanonicalRequest, scope: str | None, own: _Walk | None) -> tuple[int, _Walk | None]:
    """``(m, walk)``: the walk (``own``, the conversation's latest, first; then the recent ones) sharing the most
    leading whole messages with ``req`` (same blocks, same message boundaries), and how many."""
    best, found = 0, None
    for walk in (own, *_WALKS) if own is not None else _WALKS:
        if walk.scope != scope or walk.api != req.api:
            continue
        shared = shared_run(req.digests, walk.digests)
        bounds = shared_run(req.msg_start, walk.starts)
        m = bisect_right(walk.starts, shared, 1, bounds) - 1 if bounds > 1 else 0  # message j ends at start j+1
        n = len(walk.starts)
        after = req.msg_start[n] if len(req.msg_start) > n else len(req.digests)  # where req's message n starts
        if shared == len(walk.digests) == after and bounds == n:  # all of it, its last message ending there too
            m = n
        if m > best:
            best, found = m, walk
            if m >= len(walk.starts) - 1:  # all of it but its last message: the conversation's previous turn
                break
    return best, found


def checkpoints_from(
    req: CanonicalRequest, *, scope: str | None = None, cache: BlockCache | None = None
) -> Checkpoints:
    """The prefix-index keys of canonical request ``req`` (see the module docstring), from the same blocks and
    block digests as ``req.chain``: the hash chain over its conversation messages (the messages outside the
    system section), seeded with the wire API (a session never spans two APIs) and ``scope`` (a declared lineage:
    its sessions are indexed apart); and the digest of its tools and system blocks (options left out). ``cache``:
    the block cache that built ``req``, under which the walk is kept for the conversation's next turn."""
    m, walk = _resume(req, scope, _WALK_OF.get(cache) if cache is not None else None)
    if walk is not None:
        c = walk.count[m]
        out, marks, count = list(walk.links[:c]), list(walk.marks[:c]), list(walk.count[: m + 1])
        system = [part for part in walk.system if part[0] < m]
    else:
        out, marks, count, system = [], [], [0], []
    seed = req.api.encode() + (b"\x00" + scope.encode() if scope is not None else b"")
    link = out[-1] if out else blake2b(seed, digest_size=16).digest()
    blocks, ds, starts = req.blocks, req.digests, req.msg_start
    n, end = len(starts), len(blocks)
    for k in range(m, n):
        lo, hi = starts[k], starts[k + 1] if k + 1 < n else end
        if blocks[lo].section != "message":  # a system/developer message (OpenAI): part of the prefix
            system.append((k, b"".join(ds[lo:hi])))
            count.append(count[-1])
            continue
        d, mark = _message_digests(req.api, blocks[lo:hi])
        link = blake2b(link + d, digest_size=16).digest()
        out.append(link)
        marks.append(mark)
        count.append(count[-1] + 1)
    head = b"".join([b.digest for b in req.head if not b.is_option])
    prefix = blake2b(head + b"".join([part[1] for part in system]), digest_size=16).digest()
    cps = Checkpoints(tuple(out), prefix, tuple(marks))
    walk = _Walk(req.api, req.digests, req.msg_start, scope, cps.chain, cps.marks, tuple(count), tuple(system))
    _WALKS[:] = [walk, *_WALKS[: _WALKS_KEPT - 1]]
    if cache is not None:
        _WALK_OF[cache] = walk
    return cps


_ENVELOPES: dict[bytes, tuple[str | None, str]] = {}  # a message envelope's bytes → _envelope (envelopes repeat)


def _envelope(env: bytes) -> tuple[str | None, str]:
    """``(role, tail)`` of a message envelope: its role (None: none, or not a string) and its other keys as
    ``"\x00<sorted JSON>"`` (``""`` when none; a Responses ``"type": "message"`` is no other key)."""
    hit = _ENVELOPES.get(env)
    if hit is None:
        value = parse(env) if env else None
        hit = None, ""
        if isinstance(value, dict) and isinstance(role := value.get("role"), str):
            rest = {k: v for k, v in value.items() if k != "role" and (k, v) != ("type", "message")}
            hit = role, f"\x00{encode_sorted(rest)}" if rest else ""
        if len(_ENVELOPES) >= 1024:
            _ENVELOPES.clear()
        _ENVELOPES[env] = hit
    return hit


def carries_last(checkpoints: Checkpoints, last: CanonicalRequest | None) -> bool:
    """True when a request with ``checkpoints`` carries the final conversation item of ``last`` (a session's last
    request) before its own last item: it goes on with that session's history, whatever else its client
    re-serialized (the test a declared lineage applies to its main session). Marks depend on the item alone."""
    if last is None or not checkpoints.marks:
        return False
    walk = next((w for w in _WALKS if w.digests == last.digests and w.starts == last.msg_start), None)
    marks = walk.marks if walk is not None else checkpoints_from(last).marks
    return bool(marks) and marks[-1] in checkpoints.marks[:-1]


def _message_digests(api: str, blocks: tuple[Block, ...]) -> tuple[bytes, bytes]:
    """``(digest, mark)`` of one conversation message from its canonical blocks (markers stripped). A message of
    one block the API reads as a string (:func:`~agentcache.model._equivalence.plain_text`: a string, or one text
    part) is hashed as ``"\x01<role>\x00<text>[\x00<other keys>]"``, its other keys as sorted JSON (a Responses
    ``"type": "message"`` is no other key), so both spellings are one item (the ``messages.shape`` repair's
    rule); the mark is then the digest of its text's first paragraph, surrounding whitespace stripped (a resumed
    chat may come back with whitespace rewritten and without what was appended to the prompt: aider in Anthropic
    mode appends its rules to the prompt it sends and restores the prompt alone). Any other message is hashed by
    its blocks' digests, and is its own mark."""
    if len(blocks) == 1 and blocks[0].kind == "text":
        role, tail = _envelope(blocks[0].env)
        text = plain_text(api, blocks[0], role) if role is not None else None
        if text is not None:
            d = blake2b(f"\x01{role}\x00{text}{tail}".encode("utf-8", "surrogatepass"), digest_size=16).digest()
            first = text.strip().split("\n\n", 1)[0].rstrip()
            if first == text:
                return d, d
            mark = f"\x01{role}\x00{first}{tail}".encode("utf-8", "surrogatepass")
            return d, blake2b(mark, digest_size=16).digest()
    d = blake2b(b"\x04" + b"".join(b.digest for b in blocks), digest_size=16).digest()
    return d, d


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
