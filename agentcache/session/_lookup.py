"""Canonicalizing a request before its session is looked up: :class:`Canonicalizer`.

Session inference keys the prefix index on the request's canonical form
(:func:`~agentcache.session._identity.checkpoints_from`), so the request is canonicalized once, before the lookup,
and the session's pipeline goes on from that request. It is built with the block cache of the conversation it most
likely continues, so unchanged messages re-use their blocks as in the session's own pass.
"""

from __future__ import annotations

import weakref
from typing import Any

from ..adapters import canonicalize, wire_for
from ..model._build import BlockCache
from ..model._canonical import CanonicalRequest
from ..model._rawjson import RawBody

__all__ = ["Canonicalizer"]


class Canonicalizer:
    """Canonicalizes the requests whose session is still to be found, once, before the lookup (the session's
    pipeline then goes on from that request), with the block cache of the conversation the request most likely
    continues, so unchanged messages re-use their blocks as in the session's own pass: the cache that built a
    conversation's last request is noted on its last messages (:meth:`note`, a weak reference among the facts of
    the parsed message, which the parse memo carries into the conversation's next turn). A request that carries
    none is built with a spare cache, which the new session it opens then adopts (:meth:`adopt`). Not thread-safe:
    the manager calls it under its lock, or from one event loop."""

    __slots__ = ("_spare",)

    def __init__(self) -> None:
        self._spare: dict[str, BlockCache] = {}

    def canonical(self, api: str, body: dict[str, Any], raw: RawBody | None) -> tuple[CanonicalRequest, BlockCache]:
        """``(request, the cache that built it)``: ``body`` of wire ``api`` canonical; ``raw``: its source texts.
        Raises InputError for a malformed body."""
        cache = _noted(api, body, raw)
        if cache is None:
            cache = self._spare.get(api)
            if cache is None:
                cache = self._spare[api] = BlockCache()
        cache.begin(raw)
        return canonicalize(api, body, cache=cache), cache

    def adopt(self, api: str, cache: BlockCache) -> bool:
        """True when ``cache`` is this canonicalizer's spare for ``api``, which a new session now owns (the next
        request that carries no note gets a new one)."""
        if self._spare.get(api) is not cache:
            return False
        del self._spare[api]
        return True

    @staticmethod
    def note(api: str, body: dict[str, Any], raw: RawBody | None, cache: BlockCache) -> None:
        """Note ``cache`` (the session's, which built ``body``) on the last :data:`_NOTED` conversation items of
        ``body``: the next turn of the conversation carries them."""
        items = body.get(wire_for(api).items_field) if raw is not None else None
        if raw is None or not isinstance(items, list):
            return
        ref = weakref.ref(cache)
        for item in items[-_NOTED:]:
            facts = raw.facts(item)
            if facts is not None:
                facts[_NOTE + api] = ref


#: A conversation's cache is noted on its last three items: a client may rewrite the last one or two (markers).
_NOTED = 3
_NOTE = "block cache:"


def _noted(api: str, body: dict[str, Any], raw: RawBody | None) -> BlockCache | None:
    """The block cache noted on the deepest of ``body``'s last few conversation items that carries one (see
    :class:`Canonicalizer`), if it is still alive."""
    items = body.get(wire_for(api).items_field) if raw is not None else None
    if raw is None or not isinstance(items, list):
        return None
    for item in reversed(items[-2 * _NOTED - 2 :]):
        facts = raw.facts(item)
        ref = facts.get(_NOTE + api) if facts is not None else None
        if ref is not None:
            cache: BlockCache | None = ref()
            return cache
    return None
