"""The blocks of the tools and system prompts built lately, process-wide (:data:`STATIC`), for
:class:`~agentcache.model._build.Builder`: a conversation's :class:`~agentcache.model._build.BlockCache` is its own,
so without them every new conversation would check, encode, hash and count its agent's tools and system again."""

from __future__ import annotations

import threading
from collections import OrderedDict

from ._canonical import Block
from ._tokens import TokenCounter

__all__ = ["STATIC", "StaticBlocks"]


class StaticBlocks:
    """Blocks keyed by wire API, position and source text (what they are a function of, with the token counter,
    which must be the same object). Bounded, least recently used dropped: ``keep`` entries and ``budget``
    characters of source text (the blocks' bytes are about as many again); a text of more than a quarter of it is
    not kept. Blocks are immutable, so sharing them between conversations is safe. Thread-safe."""

    __slots__ = ("_budget", "_entries", "_held", "_keep", "_lock")

    def __init__(self, keep: int = 32, budget: int = 1 << 20) -> None:
        self._entries: OrderedDict[tuple[str, str | int, str], tuple[TokenCounter, tuple[Block, ...]]] = OrderedDict()
        self._keep = keep
        self._budget = budget
        self._held = 0
        self._lock = threading.Lock()  # sessions of several threads (``wrap()``) build at once

    def __len__(self) -> int:
        return len(self._entries)

    def get(self, api: str, key: tuple[str | int, str], counter: TokenCounter) -> tuple[Block, ...] | None:
        """The blocks built for ``key`` (``(position, source text)``) of wire ``api`` with ``counter``, if kept."""
        with self._lock:
            hit = self._entries.get((api, *key))
            if hit is None or hit[0] is not counter:
                return None
            self._entries.move_to_end((api, *key))
            return hit[1]

    def put(self, api: str, key: tuple[str | int, str], counter: TokenCounter, blocks: tuple[Block, ...]) -> None:
        """Keep ``blocks``, built for ``key`` of wire ``api`` with ``counter``."""
        if len(key[1]) > self._budget // 4:
            return
        with self._lock:
            old = self._entries.pop((api, *key), None)
            self._held += len(key[1]) - (len(key[1]) if old is not None else 0)
            self._entries[(api, *key)] = (counter, blocks)
            while len(self._entries) > self._keep or self._held > self._budget:
                (_, _, text), _ = self._entries.popitem(last=False)
                self._held -= len(text)


#: The process's.
STATIC = StaticBlocks()
