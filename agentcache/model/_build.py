"""Building canonical requests: :class:`Builder` (what adapters call, in prefix order), the per-session
:class:`BlockCache` that re-uses the blocks of unchanged units (and the whole unchanged history at once), and the
chain computations (:func:`chain_of`, :func:`rebuild`) that re-use the hashes of a reference request.
"""

from __future__ import annotations

from collections.abc import Mapping, Sequence
from typing import Any

from .._exceptions import InputError
from ._bounded import bounded
from ._canonical import Block, CanonicalRequest, Marker, digest, marker_at
from ._causes import Section
from ._rawjson import NestingTooDeep, RawBody, has_duplicates
from ._rawjson import encode as _encode
from ._static import STATIC as _STATIC
from ._tokens import TokenCounter, default_counter

__all__ = ["BlockCache", "Builder", "chain_of", "rebuild", "shared_run"]


class BlockCache:
    """The blocks of the units one session sent recently, keyed by (position, wire text), so a new
    turn re-uses the blocks of every unchanged message instead of rebuilding them: per-turn work is
    then one lookup per message (keyed by its source text when the body came through
    :func:`agentcache.model._rawjson.loads`, else by one C-level JSON encoding) plus the work on the new blocks.
    Bounded: entries no request among the last ``keep`` used are dropped (each :meth:`tick` is one request)."""

    __slots__ = (
        "__weakref__",
        "_age",
        "_by_id",
        "_checked",
        "_entries",
        "_keep",
        "_raw",
        "generation",
        "hits",
        "last",
        "misses",
        "runs",
    )  # fmt: skip  (weakly referenced: session inference finds a conversation's cache from its parsed messages)

    def __init__(self, keep: int = 4):
        self._entries: dict[tuple[str | int, str], tuple[Block, ...]] = {}
        self._age: dict[tuple[str | int, str], int] = {}
        # Within one prepared request the same (unmutated) objects are canonicalized several times
        # (client body, repaired body, marked body): remember their keys by identity until begin().
        self._by_id: dict[int, tuple[Any, tuple[str | int, str]]] = {}
        self._keep = keep
        self._raw: RawBody | None = None
        self._checked: set[str] = set()
        # The last three requests built (a turn builds the client's request, maybe a repaired one and a
        # marked one): the next build re-uses the chain hashes and token sums of the one sharing the most
        # leading digests (the cached history), so building costs only the new blocks.
        self.last: list[CanonicalRequest] = []
        # Per conversation field (``messages``/``input``): the source text of the last request's item list without
        # its closing bracket, its item count, and the blocks and message starts of those items. A request whose
        # list text starts with it re-uses them all at once (an append-only turn: one string comparison).
        self.runs: dict[str, tuple[str, int, tuple[Block, ...], tuple[int, ...], tuple[bytes, ...], int]] = {}
        self.generation = 0
        self.hits = self.misses = 0

    def begin(self, raw: RawBody | None = None) -> None:
        """Start a new request: objects seen before may since have been mutated in place. ``raw``: the
        source texts of the request's body (:func:`agentcache.model._rawjson.loads`), which then key its
        unchanged units without encoding them. Raises InputError when the body repeats a top-level key (a dict
        cannot hold it: agentcache leaves such a body as the client sent it)."""
        self._by_id.clear()
        self._raw = raw
        if raw is not None and raw.duplicates:
            raise InputError("request body repeats a top-level key")

    def get(self, position: str | int, unit: Any) -> tuple[tuple[str | int, str], tuple[Block, ...] | None]:
        """``(key, blocks)``: the key of ``unit`` at ``position`` and its cached blocks, if any."""
        seen = self._by_id.get(id(unit))
        if seen is not None and seen[0] is unit and seen[1][0] == position:
            key = seen[1]
        else:
            text = self._raw.text_of(unit) if self._raw is not None else None
            key = (position, text if text is not None else _encoded(unit, str(position)))
            self._by_id[id(unit)] = (unit, key)
        hit = self._entries.get(key)
        if hit is not None:
            self._age[key] = self.generation
            self.hits += 1
        else:
            self.misses += 1
            if text is not None and isinstance(position, int):
                self.check(text)
        return key, hit

    def check(self, text: str, remember: bool = False) -> None:
        """Raise InputError when the source ``text`` of a new unit repeats a key in some object: a dict keeps only
        the last, so agentcache could not write the unit back as the client meant it and leaves the request as
        the client sent it. Only units seen for the first time are parsed again (their blocks are built anyway);
        ``remember``: keep ``text`` as checked (a tool or system block, which a format may re-add every turn:
        Responses tools); messages are checked on a block-cache miss only, so they need no memo."""
        if "{" not in text or text in self._checked:
            return
        if has_duplicates(text):
            raise InputError("request body repeats a key in an object")
        if remember:
            if len(self._checked) >= 64:
                self._checked.clear()
            self._checked.add(text)

    def put(self, key: tuple[str | int, str], blocks: tuple[Block, ...]) -> None:
        """Remember ``blocks`` for ``key``."""
        self._entries[key] = blocks
        self._age[key] = self.generation

    @property
    def raw(self) -> RawBody | None:
        """The source texts of the current request's body (:meth:`begin`), if it came with them."""
        return self._raw

    def raw_text(self, value: Any) -> str | None:
        """The source text of ``value`` in the current request's body, when it has one."""
        return self._raw.text_of(value) if self._raw is not None else None

    def remember(self, req: CanonicalRequest) -> None:
        """Keep ``req`` as a reference for the chains of the next builds (the three most recent)."""
        self.last = [req, *self.last[:2]]

    def tick(self) -> None:
        """One request done: forget entries no recent request used."""
        self.generation += 1
        if len(self._age) > 64:
            old = [k for k, g in self._age.items() if g < self.generation - self._keep]
            for k in old:
                del self._entries[k]
                del self._age[k]

    def __len__(self) -> int:
        return len(self._entries)


class Builder:
    """Accumulates blocks for one request; adapters call :meth:`add` in prefix order."""

    def __init__(self, api: str, model: str, counter: TokenCounter | None = None, cache: BlockCache | None = None):
        self.api = api
        self.model = bounded(model)  # the option block keeps the bytes; the rest of agentcache, a bounded name
        self._counter = counter or default_counter()
        self._blocks: list[Block] = []
        self._cache = cache
        self._mark = 0
        self._starts: list[int] = []
        self._last_msg: int | None = None
        self._run: tuple[str, str, int] | None = None  # (field, list text, first message block)
        self._digests: list[bytes] = []

    def reuse(self, position: str | int, unit: Any) -> tuple[str | int, str] | None:
        """With a cache, re-use the blocks of ``unit`` at ``position`` when it was seen unchanged and
        return None (the caller skips it); otherwise return the key for :meth:`store`, which files the
        blocks the caller adds next. Without a cache, always None-free: returns a dummy key."""
        if self._cache is None:
            return ("", "")
        key, hit = self._cache.get(position, unit)
        if hit is None and isinstance(position, str):  # tools, system: another conversation may have built them
            hit = _STATIC.get(self.api, key, self._counter)
            if hit is not None:
                self._cache.put(key, hit)
        if hit is None:
            self._mark = len(self._blocks)
            return key
        if isinstance(position, int):  # a message: its blocks start here
            self._starts.append(len(self._blocks))
            self._last_msg = position
        self._blocks.extend(hit)
        self._digests.extend([b.digest for b in hit])
        return None

    def reuse_items(self, field: str, items: list[Any]) -> int:
        """With a cache, re-use the blocks of the leading items of the ``field`` list (``messages``, ``input``)
        whose source text is exactly the last request's: returns how many (the caller goes on from there)."""
        cache = self._cache
        text = cache.raw_text(items) if cache is not None else None
        if cache is None or text is None:
            return 0
        self._run = (field, text, len(self._blocks))
        run = cache.runs.get(field)
        if run is None:
            return 0
        prefix, count, blocks, starts, digests, base = run
        if count > len(items) or not text.startswith(prefix):
            return 0
        rest = text[len(prefix) :].lstrip()
        if not rest or rest[0] not in ",]":
            return 0  # the last old item was only the start of a longer one
        here = len(self._blocks)
        self._starts.extend(starts if here == base else [s - base + here for s in starts])
        self._blocks.extend(blocks)
        self._digests.extend(digests)
        self._last_msg = count - 1
        return count

    def store(self, key: tuple[str | int, str]) -> None:
        """File the blocks added since :meth:`reuse` returned ``key``."""
        if self._cache is not None:
            blocks = tuple(self._blocks[self._mark :])
            self._cache.put(key, blocks)
            if isinstance(key[0], str):
                _STATIC.put(self.api, key, self._counter, blocks)

    def option(self, key: str, value: Any) -> None:
        """Add an option block (zero tokens) named by its top-level key."""
        data = _encoded(value, key).encode()
        d = digest(b"option", key.encode(), data)
        self._blocks.append(Block(key, "option", "option", data, b"", d, 0, name=key))
        self._digests.append(d)

    def add(
        self,
        path: str,
        section: Section,
        unit: Any,
        *,
        env: bytes = b"",
        message: int | None = None,
        name: str | None = None,
        markers: bool = True,
    ) -> None:
        """Add one content unit. Its marker, where the API defines one at ``path``
        (:func:`~agentcache.model._canonical.marker_at`; ``markers=False``: none), is read off ``unit``'s top level
        and stripped from its bytes; any other key is content. A unit that comes whole from the body's source text
        (a tool, a system block) is checked for repeated keys (:meth:`BlockCache.check`)."""
        marker: Marker | None = None
        if self._cache is not None and isinstance(unit, dict) and (text := self._cache.raw_text(unit)) is not None:
            self._cache.check(text, remember=True)
        key = None
        if markers and isinstance(unit, dict) and ("cache_control" in unit or "prompt_cache_breakpoint" in unit):
            key = marker_at(self.api, path)
        if key is not None and key in unit:
            raw = unit[key]
            if raw:
                ttl = raw.get("ttl", "5m") if isinstance(raw, dict) else "5m"
                marker = Marker(ttl=str(ttl), raw=raw)
            unit = {k: v for k, v in unit.items() if k != key}
        data = _encoded(unit, path).encode()
        d = digest(env, data)
        kind, text, empty = _kind_and_text(unit)
        tokens = self._counter.count(d, text if text is not None else data.decode())
        if message is not None and message != self._last_msg:
            self._starts.append(len(self._blocks))
            self._last_msg = message
        self._blocks.append(Block(path, section, kind, data, env, d, tokens, message, name, marker, empty))
        self._digests.append(d)

    def build(
        self,
        *,
        cache_key: str | None = None,
        retention: str | None = None,
        top_marker: Marker | None = None,
        extra: Mapping[str, Any] | None = None,
    ) -> CanonicalRequest:
        """Freeze the blocks into a :class:`CanonicalRequest` with its chain and cumulative tokens."""
        blocks = tuple(self._blocks)
        refs = self._cache.last if self._cache is not None else []
        digests = tuple(self._digests)
        chain, cum = chain_of(blocks, refs, digests)
        req = CanonicalRequest(
            self.api,
            self.model,
            blocks,
            chain,
            cum,
            cache_key,
            retention,
            top_marker,
            dict(extra or {}),
            tuple(self._starts),
            tuple(i for i, b in enumerate(blocks) if b.marker is not None),
            digests,
        )
        if self._cache is not None:
            self._cache.tick()
            self._cache.remember(req)
            if self._run is not None:
                field, text, first = self._run
                starts = tuple(s for s in self._starts if s >= first)
                run = (text.rstrip()[:-1].rstrip(), len(starts), blocks[first:], starts, digests[first:], first)
                self._cache.runs[field] = run
        return req


def _encoded(value: Any, where: str) -> str:
    """``value`` as compact JSON text; InputError for what JSON cannot hold (a NaN or infinite float from a
    caller's dict) and :class:`NestingTooDeep` for a value too deep to encode: bad input, not agentcache's bug."""
    try:
        return _encode(value)
    except ValueError as exc:
        raise InputError(f"{where}: {exc}") from None
    except RecursionError:
        raise NestingTooDeep(f"{where} is nested too deeply") from None


def shared_run(a: Sequence[Any], b: Sequence[Any]) -> int:
    """Length of the common prefix of two sequences (digest tuples, token-id lists or arrays): a binary search on
    slice comparisons, which run in C. The one longest-common-prefix of the process."""
    lo, hi = 0, min(len(a), len(b))
    if a[:hi] == b[:hi]:
        return hi
    while lo < hi:
        mid = (lo + hi + 1) // 2
        if a[:mid] == b[:mid]:
            lo = mid
        else:
            hi = mid - 1
    return lo


def chain_of(
    blocks: Sequence[Block], refs: Sequence[CanonicalRequest] = (), digests: tuple[bytes, ...] | None = None
) -> tuple[tuple[bytes, ...], tuple[int, ...]]:
    """The chain hashes and cumulative token counts of ``blocks`` (whose ``digests`` may be given), re-using those
    of the reference request in ``refs`` that shares the most leading digests (chain and sums depend only on the
    digests, and tokens are memoised per digest), so building costs only the new blocks."""
    ds = digests if digests is not None else tuple(b.digest for b in blocks)
    start, best = 0, None
    for ref in refs:
        k = shared_run(ds, ref.digests)
        if k > start:
            start, best = k, ref
    chain = list(best.chain[:start]) if best is not None else []
    cum = list(best.cum_tokens[:start]) if best is not None else []
    prev = chain[-1] if chain else b""
    total = cum[-1] if cum else 0
    for b in blocks[start:]:
        prev = digest(prev, b.digest)
        chain.append(prev)
        total += b.tokens
        cum.append(total)
    return tuple(chain), tuple(cum)


def rebuild(
    req: CanonicalRequest,
    blocks: Sequence[Block],
    refs: Sequence[CanonicalRequest] = (),
    head: int | None = None,
) -> CanonicalRequest:
    """``req`` with its blocks replaced by ``blocks`` (the same request after agentcache re-sent some units in an
    earlier form, reordered tools or moved markers): chain, token sums, message starts and marked blocks
    recomputed, re-using the chain of ``req`` and of ``refs`` where the leading digests agree. ``head``: the
    number of leading blocks that replaced ``req``'s head when every message block is ``req``'s own (the message
    structure is then shifted, not scanned again)."""
    out = tuple(blocks)
    if head is not None:
        old = req.msg_start[0] if req.msg_start else len(req.blocks)
        delta = head - old
        digests = tuple(b.digest for b in out[:head]) + req.digests[old:]
        chain, cum = chain_of(out, (req, *refs), digests)
        starts = req.msg_start if delta == 0 else tuple(s + delta for s in req.msg_start)
        marked = tuple(i for i in range(head) if out[i].marker is not None) + tuple(
            m + delta for m in req.marked if m >= old
        )
        return req.evolve(blocks=out, chain=chain, cum_tokens=cum, msg_start=starts, marked=marked, digests=digests)
    digests = tuple(b.digest for b in out)
    chain, cum = chain_of(out, (req, *refs), digests)
    begins: list[int] = []
    last: int | None = None
    marks: list[int] = []
    for i, b in enumerate(out):
        if b.message is not None and b.message != last:
            begins.append(i)
            last = b.message
        if b.marker is not None:
            marks.append(i)
    return req.evolve(
        blocks=out, chain=chain, cum_tokens=cum, msg_start=tuple(begins), marked=tuple(marks), digests=digests
    )


def _kind_and_text(unit: Any) -> tuple[str, str | None, bool]:
    if isinstance(unit, str):
        return "text", unit, unit == ""
    if unit is None:
        return "empty", "", True
    if isinstance(unit, dict):
        t = unit.get("type")
        kind = t if isinstance(t, str) else "object"
        if kind in ("text", "input_text", "output_text") and isinstance(unit.get("text"), str):
            return "text", unit["text"], unit["text"] == ""
        return kind, None, False
    return "object", None, False


# ---- semantic values: used only where blocks diverge, never on the hot path --------------------
