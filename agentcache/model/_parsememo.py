"""The parses of recent request bodies, so that an agent's next turn is parsed only where it differs.

An agent's turn ``k + 1`` resends turn ``k``'s body with its conversation grown: the tools, the system prompt and
every earlier message come back as the same text at the same place. :class:`ParseMemo` keeps the parses of recent
bodies (:class:`~agentcache.model._rawjson.RawBody`) and hands the most likely predecessor of a new body to
:func:`~agentcache.model._rawjson.loads` as its guide: every part the guide holds with the same text at the same
place (a top-level key, an element of a top-level array) is taken whole after one string comparison instead of
being scanned and built again. The result equals a parse without a guide (a complete JSON text reads the same
wherever it stands); a poor guide only costs the failed comparisons.

**Which guide.** Bodies are grouped by a caller's ``hint`` (the proxy's tenant) and their first 256 characters.
Each kept body has *probes*: the texts and offsets of a few elements of its conversation (``messages`` or
``input``): its last three, deepest first, and the one halfway. A body **continues** a kept one when it holds one
of that body's last three at the same offset (its conversation grew; a client that moves its markers every turn,
as Claude Code does, changes only the last one or two); the newest such body is the guide, and is then replaced
by the new one (which holds all of its parts). Else the newest body whose halfway element is in place guides
(the same conversation, its later history rewritten, as SWE-agent rewrites old tool outputs; it is replaced too),
else the newest
body of the group (same agent, same tools and system: another session's prefix). Bounded by the characters held
(``budget``, LRU; a body of more than a quarter of it is not kept), and ``per_group`` bodies per group. Parts are
shared between the bodies that re-use them: values a parse returns must not be mutated in place (the pipeline edits
copy-on-write). Not thread-safe: one per event loop.
"""

from __future__ import annotations

from collections import OrderedDict
from typing import Any

from .._log import get_logger
from ._rawjson import RawBody, _fallback, loads_text

__all__ = ["ParseMemo"]

log = get_logger("agentcache.parse")

#: The top-level keys that hold a conversation: ``messages`` (Anthropic Messages, Chat Completions), ``input``
#: (Responses).
_CONVERSATION = ("messages", "input")
#: A kept body's probes: ``(offset in its text, element text)`` of its conversation's last three elements, and of
#: the one halfway (None when that is one of the three).
_Probes = tuple[tuple[tuple[int, str], ...], "tuple[int, str] | None"]


class ParseMemo:
    """Recent bodies' parses, guiding the parse of the next (see the module docstring). ``budget``: characters of
    body text kept at most (default 16 Mi, about 350 bodies of 46 KB); ``per_group``: bodies per group; ``smallest``:
    shorter bodies are parsed without a guide and not kept (characters). ``guided``: parses that had a guide;
    ``continued``: of those, ones that replaced their guide (an earlier turn of the same conversation)."""

    def __init__(self, budget: int = 16 << 20, per_group: int = 128, smallest: int = 2048) -> None:
        self.budget = budget
        self.per_group = per_group
        self.smallest = smallest
        self._groups: dict[tuple[str, str], list[tuple[RawBody, _Probes]]] = {}
        self._lru: OrderedDict[int, tuple[tuple[str, str], RawBody, _Probes]] = OrderedDict()
        self._held = 0
        self.guided = self.continued = 0

    def __len__(self) -> int:
        return len(self._lru)

    def estimated_bytes(self) -> int:
        """Estimated bytes the kept parses hold alive: their texts and, about twice that, their values."""
        return 3 * self._held

    def loads(self, raw: bytes, hint: str = "") -> tuple[Any, RawBody | None]:
        """:func:`~agentcache.model._rawjson.loads` of ``raw``, guided by a recent body of the same ``hint``
        group; raises as that does."""
        try:
            s = raw.decode("utf-8")
        except UnicodeDecodeError:
            return _fallback(raw), None
        if len(s) < self.smallest:
            return loads_text(s, raw)
        key = (hint, s[:256])
        group = self._groups.get(key)
        guide, continued = _pick(s, group) if group else (None, False)
        try:
            value, texts = loads_text(s, raw, guide)
        except ValueError:
            raise  # the body's own error, as json.loads gives it (a guide never causes one: it falls back)
        except Exception as exc:  # our bug: parse it unguided and forget the group (fail open)
            if guide is None:
                raise
            log.warning("parse_memo.failed", error=type(exc).__name__)
            self._forget(key)
            guide, continued = None, False
            value, texts = loads_text(s, raw)
        if texts is None:
            return value, texts
        if guide is not None:
            self.guided += 1
            if continued:
                self.continued += 1
                self._drop(guide)
        self._keep(key, texts)
        return value, texts

    def _keep(self, key: tuple[str, str], texts: RawBody) -> None:
        if texts.size > self.budget // 4:
            return  # one body would push out most of the others: not kept
        group = self._groups.setdefault(key, [])
        entry = (texts, _probes(texts))
        group.append(entry)
        self._lru[id(texts)] = (key, *entry)
        self._held += texts.size
        if len(group) > self.per_group:
            self._drop(group[0][0])
        while self._held > self.budget and self._lru:
            self._drop(next(iter(self._lru.values()))[1])

    def _forget(self, key: tuple[str, str]) -> None:
        for texts, _ in list(self._groups.get(key, ())):
            self._drop(texts)

    def _drop(self, texts: RawBody) -> None:
        entry = self._lru.pop(id(texts), None)
        if entry is None:
            return
        self._held -= texts.size
        group = self._groups.get(entry[0])
        if group is not None:
            group.remove((entry[1], entry[2]))
            if not group:
                del self._groups[entry[0]]


def _probes(texts: RawBody) -> _Probes:
    """The probes of a parsed body (see the module docstring and :data:`_Probes`)."""
    for key in _CONVERSATION:
        parts, offsets, start = texts.items.get(key), texts.offsets.get(key), texts.starts.get(key)
        if parts and offsets and start is not None:
            n = len(parts)
            at = [(start + offsets[k], p[1]) for k in range(n - 1, max(n - 4, -1), -1) if (p := parts[k]) is not None]
            half = parts[n // 2] if n // 2 < n - 3 else None
            return tuple(at), (start + offsets[n // 2], half[1]) if half is not None else None
    return (), None


def _pick(s: str, group: list[tuple[RawBody, _Probes]]) -> tuple[RawBody, bool]:
    """``(guide, supersedes)`` for text ``s`` (see the module docstring): ``supersedes``, the guide is an earlier
    turn of the same conversation (the new body replaces it)."""
    startswith = s.startswith
    halfway: RawBody | None = None
    for texts, (tail, half) in reversed(group):
        for offset, text in tail:
            if startswith(text, offset):
                return texts, True
        if halfway is None and half is not None and startswith(half[1], half[0]):
            halfway = texts
    return (halfway, True) if halfway is not None else (group[-1][0], False)
