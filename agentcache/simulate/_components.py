"""Cache rules as components with a veto, after SGLang's unified radix cache (``TreeComponent``).

Each rule of a provider's cache is one component (docs/simulators.md, "Components"). For one request against a
cache scope at a time (a *probe*: the request, the scope's state, ``now``) a component

* accepts or refuses each block as a read point, the prefix up to and including it: :meth:`Rule.validator`
  returns a fresh predicate for this request (SGLang's ``create_match_validator``), or None when the rule refuses
  no single block;
* may cap the tokens read at the boundary (:meth:`Rule.tokens`: OpenAI's 128-token steps);
* names the miss cause it stands for (``cause``, from :mod:`agentcache.model._causes`; None for a loss the cause
  list has no name for, such as OpenAI's rounding to 128 tokens).

The reuse boundary is the deepest block every component accepts (:func:`deepest`). When it is short of the
matched prefix (the longest prefix sent earlier in the scope), the simulator asks the components why, in its
documented order, at a series of *sites*, most general first (:data:`Site`); the first component that refuses a
site is the cause (:func:`first_refusal`). Anthropic's components are here; OpenAI's are in
:mod:`agentcache.simulate._components_openai`.
"""

from __future__ import annotations

from bisect import bisect_left
from collections.abc import Callable, Iterable, Mapping, Sequence
from dataclasses import dataclass, field
from itertools import accumulate
from typing import ClassVar, Generic, Literal, NamedTuple, Protocol, TypeVar

from ..model import _causes as C
from ..model._canonical import CanonicalRequest, Marker
from ..model._rules import AnthropicRules

P = TypeVar("P")
P_contra = TypeVar("P_contra", contravariant=True)

Site = Literal["request", "entry", "live", "end"]
"""Where a loss is explained, in the order asked: ``request`` the request as a whole (block index -1);
``entry`` each stored entry past the boundary within the matched prefix, shallowest first; ``live`` the deepest of
those no component refused at ``entry`` (alive, readable, yet not read); ``end`` the last matched block."""

Validator = Callable[[int], bool]
"""Accepts block ``i`` (the prefix of blocks ``0..i``) as a read point, as far as one rule goes."""

_NO_MARKER_KINDS = frozenset({"thinking", "redacted_thinking"})


class Refusal(NamedTuple):
    """Why reuse stopped short of the matched prefix: ``cause`` (None: a loss with no cause name) and ``where``,
    the block path it concerns (or a field name such as ``prompt_cache_key``; None when no block applies)."""

    cause: C.Cause | None
    where: str | None


class Component(Protocol[P_contra]):
    """One cache rule with a veto (see the module docstring)."""

    @property
    def cause(self) -> C.Cause | None: ...

    def validator(self, probe: P_contra) -> Validator | None: ...

    def tokens(self, probe: P_contra, tokens: int) -> int: ...

    def refusal(self, probe: P_contra, site: Site, i: int) -> Refusal | None: ...


class Rule(Generic[P]):
    """Defaults for a :class:`Component`: no block refused, no tokens capped, no site refused. A rule overrides
    only the hooks it needs (as SGLang's components do)."""

    cause: ClassVar[C.Cause | None] = None

    def validator(self, probe: P) -> Validator | None:
        """A fresh predicate over block indices for ``probe``, or None (refuses no block)."""
        return None

    def tokens(self, probe: P, tokens: int) -> int:
        """The tokens this rule lets be read of a ``tokens``-long reusable prefix (all of them by default)."""
        return tokens

    def refusal(self, probe: P, site: Site, i: int) -> Refusal | None:
        """This rule's refusal at ``site`` (block ``i``; -1 for ``request``), or None."""
        return None

    def refuse(self, where: str | None) -> Refusal:
        """A refusal naming this rule's cause at ``where``."""
        return Refusal(self.cause, where)


def validators(components: Iterable[Component[P]], probe: P) -> list[Validator]:
    """The predicates of every component that refuses single blocks, in ``components`` order."""
    return [v for c in components if (v := c.validator(probe)) is not None]


def deepest(blocks: Iterable[int], checks: Sequence[Validator]) -> int:
    """The first index of ``blocks`` (give them deepest first) that every check accepts, or -1."""
    for i in blocks:
        for check in checks:
            if not check(i):
                break
        else:
            return i
    return -1


def first_refusal(components: Iterable[Component[P]], probe: P, site: Site, i: int = -1) -> Refusal | None:
    """The refusal of the first component, in ``components`` order, that refuses ``site`` (block ``i``)."""
    for c in components:
        r = c.refusal(probe, site, i)
        if r is not None:
            return r
    return None


def capped(components: Iterable[Component[P]], probe: P, tokens: int) -> int:
    """``tokens`` read at the boundary after every component's cap."""
    for c in components:
        tokens = c.tokens(probe, tokens)
    return tokens


# ---- Anthropic ----------------------------------------------------------------------------------------------------


@dataclass(slots=True)
class Entry:
    """One Anthropic cache entry: when it expires, its TTL, and when it becomes readable (its writer's first
    byte), all in simulator seconds."""

    expires: float
    ttl: float
    readable: float = 0.0


@dataclass(slots=True)
class AnthropicProbe:
    """One Anthropic request against one cache scope at ``now`` (seconds). ``entries``: the scope's entries by
    chain hash; ``trailing``: entries written on a block that was not its message's first, by the chain hash of
    the block before it, with their expiry. ``hold``: the seconds a coalescing simulator waits for a writer (-1:
    none). ``bps``: effective breakpoints ``(block index, TTL seconds)``. ``read_idx``, ``m_blocks``, ``matched``:
    the boundary (block index, -1 for none), the matched depth (blocks) and its tokens, set once the boundary is
    found."""

    req: CanonicalRequest
    rules: AnthropicRules
    entries: Mapping[bytes, Entry]
    trailing: Mapping[bytes, float]
    now: float
    hold: float
    bps: list[tuple[int, float]]
    read_idx: int = -1
    m_blocks: int = 0
    matched: int = 0
    _ordinal: list[int] | None = field(default=None, init=False, repr=False)

    @property
    def minimum(self) -> int:
        """The model's minimum cacheable prefix, tokens."""
        return self.rules.min_cacheable_tokens

    @property
    def ordinal(self) -> list[int]:
        """Content-block ordinal of every block (option blocks share their successor's ordinal). Computed on first
        use: a request without breakpoints is explained before anything counts blocks."""
        if self._ordinal is None:
            counted = list(accumulate([b.section != "option" for b in self.req.blocks], initial=0))  # one pass, in C
            counted.pop()
            self._ordinal = counted
        return self._ordinal


def markers_valid(
    req: CanonicalRequest, rules: AnthropicRules, effective: list[tuple[int, Marker]] | None = None
) -> bool:
    """True when Anthropic would accept ``req``'s markers (count, allowed blocks, TTL order). ``effective``:
    ``breakpoints(req)`` when the caller has it already."""
    marks = req.markers()
    if len(marks) + (1 if req.top_marker else 0) > rules.max_breakpoints:
        return False
    for i, m in marks:
        b = req.blocks[i]
        if b.empty or b.kind in _NO_MARKER_KINDS or m.ttl not in ("5m", "1h"):
            return False
    ttls = [m.ttl for _, m in (breakpoints(req) if effective is None else effective)]
    return "5m" not in ttls or "1h" not in ttls[ttls.index("5m") :]


def last_cacheable(req: CanonicalRequest) -> int | None:
    """Index of the last block a marker may sit on (not an option, empty or thinking block)."""
    for i in range(len(req.blocks) - 1, -1, -1):
        b = req.blocks[i]
        if not (b.is_option or b.empty or b.kind in _NO_MARKER_KINDS):
            return i
    return None


def breakpoints(req: CanonicalRequest) -> list[tuple[int, Marker]]:
    """Effective breakpoints ``(block index, Marker)`` in prefix order, the top-level one included."""
    marks = dict(req.markers())
    if req.top_marker is not None:
        last = last_cacheable(req)
        if last is not None and last not in marks:
            marks[last] = req.top_marker
    return sorted(marks.items())


class MarkerRules(Rule[AnthropicProbe]):
    """``markers.invalid``: Anthropic rejects a request whose markers it does not accept (:meth:`rejects`: the
    simulator asks first, before any probe, and counts the request as refused: nothing read or written). At the
    ``end`` site: the matched prefix ends where a message ends, and an entry still alive was written on a later
    block of that message, a trailing block this client dropped: the marker sat on it."""

    cause = C.MARKERS_INVALID

    @staticmethod
    def rejects(
        req: CanonicalRequest, rules: AnthropicRules, effective: list[tuple[int, Marker]] | None = None
    ) -> bool:
        """True when Anthropic answers ``req`` with HTTP 400 (:func:`markers_valid` is False; ``effective``: its
        breakpoints, when known)."""
        return not markers_valid(req, rules, effective)

    def refusal(self, probe: AnthropicProbe, site: Site, i: int) -> Refusal | None:
        if site != "end":
            return None
        blocks = probe.req.blocks
        last = blocks[i]
        ends = i + 1 == len(blocks) or blocks[i + 1].message != last.message
        if ends and last.message is not None and probe.trailing.get(probe.req.chain[i], 0.0) > probe.now:
            return self.refuse(last.path)
        return None


class Sized(Protocol):
    """A probe of any provider, as far as :class:`MinimumLength` looks: the request, its matched tokens and the
    model's minimum cacheable prefix (tokens)."""

    @property
    def req(self) -> CanonicalRequest: ...

    @property
    def matched(self) -> int: ...

    @property
    def minimum(self) -> int: ...


class MinimumLength(Rule[Sized]):
    """``below_minimum``: a prefix shorter than the model's minimum cacheable length is neither written nor read.
    ``per``: ``"block"`` refuses such blocks (:meth:`validator`: Anthropic, whose breakpoints write and read at
    blocks); ``"tokens"`` caps the tokens read to 0 instead (:meth:`tokens`: OpenAI, which reports a cached prefix
    in tokens, whatever block its entry sits on). The whole request is refused when its matched prefix is that
    short."""

    cause = C.BELOW_MINIMUM

    def __init__(self, per: Literal["block", "tokens"] = "block") -> None:
        self.per = per

    @staticmethod
    def reaches(probe: Sized) -> Validator:
        """Accepts the blocks whose prefix is at least the minimum long (what Anthropic's breakpoints write)."""
        first = bisect_left(probe.req.cum_tokens, probe.minimum)  # cum_tokens never decreases
        return lambda i: i >= first

    def validator(self, probe: Sized) -> Validator | None:
        return self.reaches(probe) if self.per == "block" else None

    def tokens(self, probe: Sized, tokens: int) -> int:
        return tokens if self.per == "block" or tokens >= probe.minimum else 0

    def refusal(self, probe: Sized, site: Site, i: int) -> Refusal | None:
        if site == "request" and probe.matched < probe.minimum:
            return self.refuse(None)
        return None


class EntryAlive(Rule[AnthropicProbe]):
    """``ttl.expired``: only an entry whose TTL has not run out is read; the first stored entry past the boundary
    that expired is the cause."""

    cause = C.TTL_EXPIRED

    def validator(self, probe: AnthropicProbe) -> Validator:
        entries, chain, now = probe.entries, probe.req.chain, probe.now

        def alive(i: int) -> bool:
            ent = entries.get(chain[i])
            return ent is not None and ent.expires > now

        return alive

    def refusal(self, probe: AnthropicProbe, site: Site, i: int) -> Refusal | None:
        if site == "entry" and probe.entries[probe.req.chain[i]].expires <= probe.now:
            return self.refuse(probe.req.blocks[i].path)
        return None


class EntryReadable(Rule[AnthropicProbe]):
    """``write.in_flight``: an entry is readable from its writer's first byte; a coalescing simulator also accepts
    one readable within its hold (and waits for it)."""

    cause = C.WRITE_IN_FLIGHT

    def validator(self, probe: AnthropicProbe) -> Validator:
        entries, chain, now, hold = probe.entries, probe.req.chain, probe.now, max(probe.hold, 0.0)

        def readable(i: int) -> bool:
            ent = entries.get(chain[i])
            return ent is not None and ent.readable - now <= hold

        return readable

    def refusal(self, probe: AnthropicProbe, site: Site, i: int) -> Refusal | None:
        if site == "entry" and probe.entries[probe.req.chain[i]].readable > probe.now:
            return self.refuse(probe.req.blocks[i].path)
        return None


class Lookback(Rule[AnthropicProbe]):
    """``lookback.exceeded``: a breakpoint reads only entries at most ``lookback_blocks`` content blocks before
    it (:meth:`windows`: the simulator searches each window for its breakpoint's read). Refuses the ``live``
    entry when breakpoints lie past it (all out of reach: one within reach would have read it), and the ``end``
    when it lies more than the window past the boundary."""

    cause = C.LOOKBACK_EXCEEDED

    @staticmethod
    def windows(probe: AnthropicProbe) -> list[range]:
        """Per breakpoint, the blocks it may read, deepest first."""
        ordinal, back = probe.ordinal, probe.rules.lookback_blocks
        return [range(b, bisect_left(ordinal, ordinal[b] - back) - 1, -1) for b, _ in probe.bps]

    def refusal(self, probe: AnthropicProbe, site: Site, i: int) -> Refusal | None:
        if site == "live":
            beyond = [b for b, _ in probe.bps if b >= i]
            return self.refuse(probe.req.blocks[beyond[0]].path) if beyond else None
        if site == "end":
            start = probe.ordinal[probe.read_idx] if probe.read_idx >= 0 else -1
            if probe.ordinal[i] - start > probe.rules.lookback_blocks:
                return self.refuse(probe.req.blocks[i].path)
        return None


class Breakpoints(Rule[AnthropicProbe]):
    """``markers.missing``: only a breakpoint reads or writes, and never on an option block. Refuses a request
    with no breakpoint, the ``live`` entry when no breakpoint lies at or past it, and any ``end`` no other
    component refused: nobody marked the matched prefix's end."""

    cause = C.MARKERS_MISSING

    def validator(self, probe: AnthropicProbe) -> Validator:
        blocks = probe.req.blocks
        return lambda i: not blocks[i].is_option

    def refusal(self, probe: AnthropicProbe, site: Site, i: int) -> Refusal | None:
        if site == "request":
            return None if probe.bps else self.refuse(None)
        if site == "live":
            return None if any(b >= i for b, _ in probe.bps) else self.refuse(probe.req.blocks[i].path)
        if site == "end":
            return self.refuse(probe.req.blocks[i].path)
        return None


#: Anthropic's components in the order a loss is explained (docs/simulators.md): at every site the first one
#: that refuses is the cause. The order keeps the simulator's reports as they were before components.
_MINIMUM, _ALIVE, _READABLE, _BREAKPOINTS = MinimumLength(), EntryAlive(), EntryReadable(), Breakpoints()
ANTHROPIC: tuple[Component[AnthropicProbe], ...] = (
    MarkerRules(),
    _MINIMUM,
    _ALIVE,
    _READABLE,
    Lookback(),
    _BREAKPOINTS,
)
#: The components that refuse single blocks, in the order a read point is checked: most blocks hold no entry, so
#: that check goes first (every one must accept: the order changes only the cost, never the boundary).
ANTHROPIC_CHECKS: tuple[Component[AnthropicProbe], ...] = (_ALIVE, _READABLE, _MINIMUM, _BREAKPOINTS)


def explain_anthropic(probe: AnthropicProbe, components: Sequence[Component[AnthropicProbe]] = ANTHROPIC) -> Refusal:
    """Why ``probe`` read less than its matched prefix: ``request``, each stored ``entry`` past the boundary, the
    ``live`` one, then the ``end`` (:data:`Site`); :class:`Breakpoints` refuses every ``end`` the others accept."""
    r = first_refusal(components, probe, "request")
    if r is not None:
        return r
    entries, chain, live = probe.entries, probe.req.chain, -1
    for i in range(probe.read_idx + 1, probe.m_blocks):
        if chain[i] not in entries:
            continue
        r = first_refusal(components, probe, "entry", i)
        if r is not None:
            return r
        live = i
    if live > probe.read_idx:
        r = first_refusal(components, probe, "live", live)
        if r is not None:
            return r
    return first_refusal(components, probe, "end", probe.m_blocks - 1) or Refusal(None, None)
