"""A paged radix tree over token ids, shared by every session, with three tiers: L1 (GPU KV pool), L2 (host
memory) and L3 (storage), each a capacity in tokens.

The semantics follow SGLang 0.5.23 (read in ``sglang/srt/mem_cache/``: ``unified_radix_cache.py``,
``unified_cache/components/base.py`` and ``full.py``, ``unified_cache/session_ref_tracker.py``,
``evict_policy.py``; ``arg_groups/fields/memory.py`` for the defaults):

* reuse is the longest cached prefix at page granularity: only whole pages of ``page_size`` tokens are cached
  and matched (SGLang truncates keys to a page multiple);
* L1 evicts leaves only (a node whose children are all off the device), by priority: LRU is
  ``last_access_time`` (``LRUStrategy``); session-aware (``--enable-session-radix-cache``) is
  ``(session_ref > 0, session_ref, last_access_time)`` (``FullComponent._session_ref_eviction_strategy``), so
  entries no live session references go first;
* a finished request registers the node its prompt ended on for its session; every node from there to the root
  gains one ``session_ref`` per session covering it, the session's older frontier on that path is replaced
  (``register_session_leaf``); closing the session (``/close_session``, the proxy's idle timeout) removes its
  references (``release_session``); a deleted frontier node passes its reference to its parent
  (``discard_deleted_session_leaf``);
* HiCache ``write_through`` (the default ``--hicache-write-policy``, and what ``agentcache serve`` sets): every
  page is backed up to L2 when inserted, and to L3 when a storage backend is set; a page evicted from L1 stays
  in the tree while L2 holds it; L2 evicts only pages already off the device (host-only leaves); L3 is not in
  the tree (SGLang looks pages up in storage by hash after a tree miss) and is modelled as an LRU of page
  hashes; a hit in L2 or L3 is loaded back into L1.

Simplifications (stated in the planner's output): requests are served one at a time, so no page is locked by a
concurrent request except the current one's; eviction goes page by page (SGLang evicts node by node, a node
being a run of pages with one access time, so the order is the same); generated tokens are not inserted.
"""

from __future__ import annotations

import heapq
from collections import OrderedDict
from collections.abc import Hashable, Sequence
from dataclasses import dataclass
from typing import Literal

__all__ = ["EVICTIONS", "Access", "TieredRadixCache"]

Eviction = Literal["lru", "session", "slot"]
#: ``lru``: SGLang's default ``--radix-eviction-policy lru``; ``session``: ``--enable-session-radix-cache`` on
#: top of LRU; ``slot``: a one-entry cache (only the last request's prefix stays in L1), llama.cpp's single slot
#: without its host prompt cache, at page granularity (the token-exact llama.cpp model is :mod:`._llama`).
EVICTIONS: tuple[str, ...] = ("lru", "session", "slot")


class _Node:
    __slots__ = ("access", "children", "depth", "hash", "key", "l1", "l2", "parent", "refs", "sessions")

    def __init__(self, key: Hashable, parent: _Node | None, page_hash: int, depth: int) -> None:
        self.key = key
        self.parent = parent
        self.children: dict[Hashable, _Node] = {}
        self.hash = page_hash
        self.depth = depth
        self.l1 = False
        self.l2 = False
        self.access = 0
        self.refs = 0
        self.sessions: set[str] | None = None

    def __lt__(self, other: _Node) -> bool:  # heap ties: the deeper page first (a leaf before its parent)
        return self.depth > other.depth


@dataclass(frozen=True, slots=True)
class Access:
    """What one request found and did, in tokens: ``prompt`` tokens sent; ``l1``/``l2``/``l3`` tokens reused
    from each tier (L2 and L3 hits are loaded back into L1); ``prefill`` tokens computed; ``evicted`` tokens
    pushed out of L1 to make room (they may still be in L2/L3)."""

    prompt: int
    l1: int
    l2: int
    l3: int
    prefill: int
    evicted: int

    @property
    def hit(self) -> int:
        """Tokens reused from any tier."""
        return self.l1 + self.l2 + self.l3


class TieredRadixCache:
    """The cache of one engine: see the module docstring.

    ``page_size`` tokens per page (SGLang ``--page-size``; 1 matches token by token); ``l1_tokens`` the GPU KV
    pool, ``l2_tokens`` host memory (0: no HiCache), ``l3_tokens`` storage (0: none), all in tokens and rounded
    down to whole pages; ``eviction`` one of :data:`EVICTIONS`. Raises ValueError for a non-positive page size or
    L1, or an unknown eviction.
    """

    def __init__(
        self, page_size: int, l1_tokens: int, l2_tokens: int = 0, l3_tokens: int = 0, eviction: str = "lru"
    ) -> None:
        if page_size < 1 or l1_tokens < page_size:
            raise ValueError(f"page size {page_size} and L1 {l1_tokens} tokens: both must hold at least a page")
        if eviction not in EVICTIONS:
            raise ValueError(f"eviction {eviction!r}: expected one of {', '.join(EVICTIONS)}")
        self.page_size = page_size
        self.eviction = eviction
        self._cap1 = l1_tokens // page_size
        self._cap2 = max(0, l2_tokens) // page_size
        self._cap3 = max(0, l3_tokens) // page_size
        self._root = _Node(None, None, 0, 0)
        self._root.l1 = self._root.l2 = True
        self._n1 = 0
        self._n2 = 0
        self._l3: OrderedDict[int, None] = OrderedDict()
        self._heap1: list[tuple[tuple[int, int, int], _Node]] = []
        self._heap2: list[tuple[tuple[int, int, int], _Node]] = []
        self._frontier: dict[str, set[_Node]] = {}
        self._tick = 0
        self.evicted_tokens = 0
        self.peak = {"l1": 0, "l2": 0, "l3": 0}

    # -- public -------------------------------------------------------------------------------------------------

    def request(self, keys: Sequence[Hashable], tokens: int, session: str | None = None) -> Access:
        """Serve one prompt of ``tokens`` tokens whose whole pages have ``keys``
        (:meth:`~agentcache.engine.Prompt.page_keys`) for ``session``: match, load hits into L1, prefill and insert
        the rest, then register the session's reference. Returns the :class:`Access`."""
        self._tick += 1
        p = self.page_size
        pages = list(keys)
        full = len(pages)
        path: list[_Node] = []
        node = self._root
        for key in pages:
            child = node.children.get(key)
            if child is None:
                break
            path.append(child)
            node = child
        n1 = sum(1 for n in path if n.l1)
        n2 = len(path) - n1
        # L3 continues the match by page hash where the tree stops (a prefetch from storage).
        n3 = 0
        h = node.hash
        rest_hashes: list[int] = []
        for key in pages[len(path) :]:
            h = hash((h, key))
            rest_hashes.append(h)
        if self._cap3:
            for rh in rest_hashes:
                if rh not in self._l3:
                    break
                self._l3.move_to_end(rh)
                n3 += 1
        keep = min(full, self._cap1)
        n2 = max(0, min(n2, keep - n1))
        n3 = max(0, min(n3, keep - len(path)))
        before = self.evicted_tokens
        # Everything the request reuses or computes ends up in L1 (up to its capacity: a longer prompt is not
        # cached past it), on one path that stays protected while it is served.
        kept = path[:keep]
        path_set = set(kept)
        if self.eviction == "slot":
            self._evict_l1_except(path_set)
        for n in path[:keep]:
            if not n.l1:
                self._make_room_l1(1, path_set)
                n.l1 = True
                self._n1 += 1
            n.access = self._tick
        for i in range(len(path), keep):
            self._make_room_l1(1, path_set)
            child = _Node(pages[i], node, rest_hashes[i - len(path)], node.depth + 1)
            node.children[pages[i]] = child
            child.l1 = True
            child.access = self._tick
            self._n1 += 1
            self._backup(child)
            path_set.add(child)
            kept.append(child)
            node = child
        last = path[keep - 1] if keep and keep <= len(path) else node
        for n in kept:
            self._push1(n)
        if session is not None and self.eviction == "session" and last is not self._root:
            self._register(session, last)
        self.peak["l1"] = max(self.peak["l1"], self._n1 * p)
        self.peak["l2"] = max(self.peak["l2"], self._n2 * p)
        self.peak["l3"] = max(self.peak["l3"], len(self._l3) * p)
        hit1, hit2, hit3 = n1 * p, n2 * p, n3 * p
        return Access(tokens, hit1, hit2, hit3, tokens - hit1 - hit2 - hit3, self.evicted_tokens - before)

    def release(self, session: str) -> None:
        """Close ``session``: drop its references (SGLang ``release_radix_session``); nothing is evicted now."""
        for leaf in self._frontier.pop(session, set()):
            self._unmark(session, leaf)
            self._add_refs(leaf, None, -1)

    def resident(self) -> dict[str, int]:
        """Tokens held now per tier: ``{"l1", "l2", "l3"}``."""
        return {"l1": self._n1 * self.page_size, "l2": self._n2 * self.page_size, "l3": len(self._l3) * self.page_size}

    # -- eviction -----------------------------------------------------------------------------------------------

    def _priority(self, n: _Node) -> tuple[int, int, int]:
        if self.eviction == "session":
            return (1 if n.refs > 0 else 0, n.refs, n.access)
        return (0, 0, n.access)

    def _push1(self, n: _Node) -> None:
        if n.l1 and not any(c.l1 for c in n.children.values()):
            heapq.heappush(self._heap1, (self._priority(n), n))

    def _push2(self, n: _Node) -> None:
        if n.l2 and not n.l1 and not n.children:
            heapq.heappush(self._heap2, (self._priority(n), n))

    def _make_room_l1(self, pages: int, protect: set[_Node]) -> None:
        skipped: list[tuple[tuple[int, int, int], _Node]] = []
        while self._n1 + pages > self._cap1 and self._heap1:
            prio, n = heapq.heappop(self._heap1)
            if n is self._root or n.parent is None or not n.l1:
                continue  # the root, deleted, or already off the device
            if any(c.l1 for c in n.children.values()) or prio != self._priority(n):
                continue  # stale entry: no longer a leaf, or its priority changed (pushed again then)
            if n in protect:
                skipped.append((prio, n))
                continue
            self._evict_l1(n)
        for item in skipped:
            heapq.heappush(self._heap1, item)

    def _evict_l1_except(self, protect: set[_Node]) -> None:
        stack = [c for c in self._root.children.values()]
        doomed: list[_Node] = []
        while stack:
            n = stack.pop()
            if n.l1 and n not in protect:
                doomed.append(n)
            stack.extend(n.children.values())
        for n in sorted(doomed, key=lambda x: -x.depth):  # leaves first
            if n.l1 and n.parent is not None:
                self._evict_l1(n)

    def _evict_l1(self, n: _Node) -> None:
        n.l1 = False
        self._n1 -= 1
        self.evicted_tokens += self.page_size
        parent = n.parent
        if n.l2:
            self._push2(n)
        else:
            self._delete(n)
        if parent is not None and parent is not self._root:
            self._push1(parent)

    def _backup(self, n: _Node) -> None:
        """Write-through: the new page goes to L2 (if it has room, after evicting host-only leaves) and L3."""
        if self._cap2:
            while self._n2 >= self._cap2 and self._heap2:
                prio, m = heapq.heappop(self._heap2)
                if m.parent is None or not m.l2 or m.l1 or m.children or prio != self._priority(m):
                    continue
                self._evict_l2(m)
            if self._n2 < self._cap2:
                n.l2 = True
                self._n2 += 1
        if self._cap3:
            self._l3[n.hash] = None
            self._l3.move_to_end(n.hash)
            while len(self._l3) > self._cap3:
                self._l3.popitem(last=False)

    def _evict_l2(self, n: _Node) -> None:
        n.l2 = False
        self._n2 -= 1
        self._delete(n)

    def _delete(self, n: _Node) -> None:
        """Remove ``n`` (and any host-only pages under it, now unreachable) from the tree."""
        order: list[_Node] = []
        stack = [n]
        while stack:
            m = stack.pop()
            order.append(m)
            stack.extend(m.children.values())
        for m in reversed(order):  # children first: a session's reference recedes up the path
            if m.l2:
                m.l2 = False
                self._n2 -= 1
            if m.l1:
                m.l1 = False
                self._n1 -= 1
            if m.sessions:
                self._recede(m)
            m.children = {}
            if m is not n:
                m.parent = None
        parent = n.parent
        if parent is not None:
            parent.children.pop(n.key, None)
            n.parent = None
            if parent is not self._root:
                self._push2(parent)

    # -- session references -------------------------------------------------------------------------------------

    def _register(self, session: str, leaf: _Node) -> None:
        frontier = self._frontier.setdefault(session, set())
        if leaf in frontier:
            return
        ancestor = leaf.parent
        while ancestor is not None and ancestor is not self._root and ancestor not in frontier:
            ancestor = ancestor.parent
        stop = ancestor if ancestor is not None and ancestor is not self._root else None
        self._add_refs(leaf, stop, +1)
        self._mark(session, leaf)
        if stop is not None:
            self._unmark(session, stop)

    def _mark(self, session: str, n: _Node) -> None:
        self._frontier.setdefault(session, set()).add(n)
        if n.sessions is None:
            n.sessions = set()
        n.sessions.add(session)

    def _unmark(self, session: str, n: _Node) -> None:
        self._frontier.get(session, set()).discard(n)
        if n.sessions is not None:
            n.sessions.discard(session)
            if not n.sessions:
                n.sessions = None

    def _add_refs(self, leaf: _Node, stop: _Node | None, delta: int) -> None:
        n: _Node | None = leaf
        while n is not None and n is not stop and n is not self._root:
            n.refs += delta
            self._push1(n)
            self._push2(n)
            n = n.parent

    def _recede(self, n: _Node) -> None:
        """``n`` leaves the tree: each session whose frontier it was falls back to its parent."""
        parent = n.parent
        for session in tuple(n.sessions or ()):
            self._unmark(session, n)
            n.refs -= 1
            if parent is None or parent is self._root:
                continue
            if parent in self._frontier.get(session, set()):
                self._add_refs(parent, None, -1)  # the parent's own registration already covers the path
            else:
                self._mark(session, parent)
