"""Coalescing sibling requests: hold a request whose new shared prefix another request is writing right now.

A provider cache entry is readable once the request that writes it has started its response (Anthropic:
platform.claude.com/docs/en/build-with-claude/prompt-caching, "the cache entry becomes available after the first
response begins"; docs/design.md, provider rules). So N subagents an agent launches at once, sharing a prefix no
entry covers yet, each pay that prefix's write. The :class:`Coalescer` (one per session manager, shared by the
proxy and ``wrap()`` around async clients) lets the first one write and holds the others until its first response
byte, bounded by ``timeout`` seconds.

Rules, per cache scope (tenant and model):

* a request's *entries* are the prefixes it writes: its breakpoints (Anthropic) or its message boundaries
  (OpenAI's automatic prefix cache), each at least the model's minimum cacheable length (``models.toml``);
* a request is held when an entry another request is writing (sent, no first byte yet) is readable by it (the
  same prefix; for Anthropic, within the 20-block lookback of one of its breakpoints) and no live entry (one
  whose writer answered, TTL alive) covers it, and the part of that prefix no live entry covers is at least the
  minimum cacheable length: a smaller saving is not worth a wait of a whole time to first byte;
* never held: a request for a local engine (an engine shares in-flight prefill itself), one below the minimum,
  one whose readable prefix is already cached, and any request when ``enabled`` is off;
* fail open: a hold ends at the writer's first byte, at ``timeout``, or when the writer failed or was cancelled
  before its first byte; the held request is then sent as it is. A writer that has not reported back within
  ``timeout`` (a stream its caller never read) is forgotten: nobody waits on it again. A held request that is
  cancelled is simply cancelled (its client went away).

The door calls :meth:`Coalescer.claim` after the session core prepared the request, awaits :meth:`Ticket.wait`,
sends, calls :meth:`Ticket.first_byte` when the upstream's first response byte arrives, and :meth:`Ticket.release`
in any case afterwards (idempotent). ``on_hold`` receives one :class:`Hold` per held request (the session
manager hands it to its sinks: :meth:`agentcache.PrometheusSink.coalesced`).
"""

from __future__ import annotations

import asyncio
import threading
import time
from collections import OrderedDict
from collections.abc import Callable
from dataclasses import dataclass

from .._log import get_logger
from ..model._canonical import CanonicalRequest
from ..model._rules import anthropic_rules, normalize_model, openai_rules

__all__ = ["DEFAULT_HOLD_SECONDS", "HOLD_OUTCOMES", "Coalescer", "Hold", "Ticket", "entry_points"]

log = get_logger("agentcache.session")

#: Default bound of one hold, seconds (setting ``coalesce_timeout``).
DEFAULT_HOLD_SECONDS = 3.0
#: Live entries one coalescer remembers (least recently written dropped first): ~100 bytes each.
DEFAULT_MAX_ENTRIES = 65_536
#: How long an entry of a request without explicit TTLs stays readable (OpenAI's in-memory cache: 5-10 min).
_DEFAULT_TTL = 300.0

#: The ``outcome`` values of a :class:`Hold`.
HOLD_OUTCOMES = ("released", "timeout", "writer_failed", "cancelled")


@dataclass(frozen=True, slots=True)
class Hold:
    """One held request. ``outcome``: ``released`` (the writer's first byte came), ``timeout`` (the bound passed),
    ``writer_failed`` (the writer failed or was cancelled before its first byte) or ``cancelled`` (the held
    request itself was). ``waited_s``: seconds held. ``saved_tokens``: estimated prompt tokens the hold saves
    writing again (the shared prefix no live entry covered; 0 unless ``released``). ``scope``: the cache scope
    (``tenant/model``)."""

    outcome: str
    waited_s: float
    saved_tokens: int
    scope: str


class _Writer:
    """A request in flight that writes entries nobody had yet."""

    __slots__ = ("event", "keys", "loop", "ok", "started", "ttls")

    def __init__(self, loop: asyncio.AbstractEventLoop, started: float) -> None:
        self.loop, self.started = loop, started
        self.event = asyncio.Event()
        self.keys: list[tuple[str, bytes]] = []
        self.ttls: list[float] = []
        self.ok = False


class Ticket:
    """A request's part in coalescing (see the module docstring). ``held``: it waits for another request's first
    byte (:meth:`wait`); ``saved_tokens``: the estimate if it does. ``hold``: the :class:`Hold` once it waited."""

    __slots__ = ("_co", "_done", "_wait_on", "_writer", "hold", "saved_tokens", "scope")

    def __init__(self, co: Coalescer, scope: str, writer: _Writer | None, wait_on: _Writer | None, saved: int) -> None:
        self._co, self.scope, self._writer, self._wait_on = co, scope, writer, wait_on
        self.saved_tokens = saved
        self.hold: Hold | None = None
        self._done = False

    @property
    def held(self) -> bool:
        """True when :meth:`wait` will wait for another request."""
        return self._wait_on is not None

    async def wait(self) -> Hold | None:
        """Wait for the writer's first byte, at most the coalescer's timeout; None when not held. Never raises
        except :class:`asyncio.CancelledError` when the caller is cancelled (recorded as ``cancelled``)."""
        writer = self._wait_on
        if writer is None:
            return None
        co = self._co
        started = co.clock()
        outcome = "released"
        try:
            await asyncio.wait_for(writer.event.wait(), co.timeout)
            if not writer.ok:
                outcome = "writer_failed"
        except TimeoutError:
            outcome = "timeout"
        except asyncio.CancelledError:
            outcome = "cancelled"
            raise
        finally:
            saved = self.saved_tokens if outcome == "released" else 0
            self.hold = Hold(outcome, co.clock() - started, saved, self.scope)
            co.observe(self.hold)
        return self.hold

    def first_byte(self) -> None:
        """The upstream's first response byte for this request arrived: its entries become readable and the
        requests held on it go. Idempotent; never raises."""
        writer = self._writer
        if self._done or writer is None:
            self._done = True
            return
        self._done = True
        self._co._written(writer)

    def release(self) -> None:
        """The request ended (or failed, or was cancelled) — if no first byte came, its entries are dropped and
        the requests held on it go at once (fail open). Idempotent; never raises."""
        if self._done:
            return
        self._done = True
        if self._writer is not None:
            self._co._dropped(self._writer)


def entry_points(req: CanonicalRequest, provider: str) -> list[tuple[int, float]]:
    """The prefixes ``req`` writes, as ``(block index, TTL seconds)``: for Anthropic its effective breakpoints
    (explicit markers and a top-level ``cache_control``), for OpenAI the end of its head (tools, instructions) and of
    each message; only those at least the model's minimum cacheable length (``models.toml``)."""
    if provider == "anthropic":
        from ..simulate import breakpoints  # the simulator's reading of markers: one definition

        rules = anthropic_rules(req.model)
        out = [(i, rules.ttl_1h_seconds if m.ttl == "1h" else rules.ttl_5m_seconds) for i, m in breakpoints(req)]
        minimum = rules.min_cacheable_tokens
    else:
        minimum = openai_rules(req.model).min_cacheable_tokens
        ends = {s - 1 for s in req.msg_start if s > 0}
        ends.add(len(req.blocks) - 1)
        out = [(i, _DEFAULT_TTL) for i in sorted(ends) if i >= 0]
    return [(i, ttl) for i, ttl in out if req.tokens_before(i + 1) >= minimum]


class Coalescer:
    """Holds sibling requests until the one writing their shared prefix answers (see the module docstring).

    ``enabled``: off never holds (setting ``coalesce``). ``timeout``: seconds one hold lasts at most (setting
    ``coalesce_timeout``, default :data:`DEFAULT_HOLD_SECONDS`). ``on_hold``: called with each :class:`Hold`.
    ``clock``: monotonic seconds (tests pass a fake). ``lookback``: Anthropic's breakpoint lookback, blocks.
    """

    def __init__(
        self,
        *,
        enabled: bool = True,
        timeout: float = DEFAULT_HOLD_SECONDS,
        on_hold: Callable[[Hold], None] | None = None,
        clock: Callable[[], float] = time.monotonic,
        max_entries: int = DEFAULT_MAX_ENTRIES,
        lookback: int = 20,
    ) -> None:
        self.enabled, self.timeout, self.clock = enabled, max(0.0, timeout), clock
        self._on_hold = on_hold
        self._max = max(1, max_entries)
        self._lookback = lookback
        # Threads may each run an event loop (wrap() clients): the tables are shared, a hold never crosses loops.
        self._lock = threading.Lock()
        self._pending: dict[tuple[str, bytes], _Writer] = {}
        self._live: OrderedDict[tuple[str, bytes], tuple[float, float]] = OrderedDict()

    def claim(self, tenant: str, planned: CanonicalRequest, *, provider: str, engine: bool = False) -> Ticket | None:
        """The ticket of the request ``planned`` (what is sent, canonical) of ``tenant`` for ``provider``
        (``anthropic`` or ``openai``), or None when coalescing does not apply (off, a local engine, no running
        event loop, nothing cacheable). Never raises: a failure is logged and gives None (fail open)."""
        if not self.enabled or engine or provider not in ("anthropic", "openai"):
            return None
        try:
            loop = asyncio.get_running_loop()
        except RuntimeError:
            return None
        try:
            with self._lock:
                return self._claim(loop, tenant, planned, provider)
        except Exception as exc:
            log.warning("coalesce.failed_open", error=type(exc).__name__)
            return None

    def _claim(
        self, loop: asyncio.AbstractEventLoop, tenant: str, req: CanonicalRequest, provider: str
    ) -> Ticket | None:
        points = entry_points(req, provider)
        if not points:
            return None
        scope = f"{tenant}/{normalize_model(req.model)}"
        now = self.clock()
        if provider == "anthropic":
            candidates = sorted({e for b, _ in points for e in range(max(0, b - self._lookback), b + 1)})
        else:
            candidates = [b for b, _ in points]
        live, pending, writer_of = -1, -1, None
        for i in reversed(candidates):
            key = (scope, req.chain[i])
            w = self._pending.get(key)
            if w is not None and w.started + self.timeout < now:
                del self._pending[key]  # a writer that never reported back (a stream never read): forgotten
                w = None
            if pending < 0 and w is not None and w.loop is loop:
                pending, writer_of = i, w
            got = self._live.get(key)
            if got is not None:
                expires, ttl = got
                if expires > now:
                    live = i
                    self._live[key] = (now + ttl, ttl)  # a hit refreshes the entry (Anthropic: "refreshed on hit")
                    self._live.move_to_end(key)
                    break
                del self._live[key]
        minimum = (anthropic_rules if provider == "anthropic" else openai_rules)(req.model).min_cacheable_tokens
        saved = req.tokens_before(pending + 1) - req.tokens_before(live + 1) if pending > live else 0
        wait_on = writer_of if pending > live and saved >= minimum else None
        mine = _Writer(loop, now)
        for b, ttl in points:
            key = (scope, req.chain[b])
            if key in self._pending or (b <= live) or (b <= pending and wait_on is not None):
                continue
            got = self._live.get(key)
            if got is not None and got[0] > now:
                continue
            self._pending[key] = mine
            mine.keys.append(key)
            mine.ttls.append(ttl)
        return Ticket(self, scope, mine if mine.keys else None, wait_on, saved if wait_on is not None else 0)

    def _written(self, writer: _Writer) -> None:
        now = self.clock()
        with self._lock:
            for key, ttl in zip(writer.keys, writer.ttls, strict=True):
                if self._pending.get(key) is writer:
                    del self._pending[key]
                self._live[key] = (now + ttl, ttl)
                self._live.move_to_end(key)
            while len(self._live) > self._max:
                self._live.popitem(last=False)
        writer.ok = True
        writer.event.set()

    def _dropped(self, writer: _Writer) -> None:
        with self._lock:
            for key in writer.keys:
                if self._pending.get(key) is writer:
                    del self._pending[key]
        writer.event.set()  # ok stays False: the held requests go as they are

    def observe(self, hold: Hold) -> None:
        """Report ``hold`` to ``on_hold`` and the log (never raises)."""
        log.debug(
            "coalesce.hold",
            outcome=hold.outcome,
            hold_ms=round(hold.waited_s * 1000, 3),
            saved_write_tokens=hold.saved_tokens,
        )
        if self._on_hold is not None:
            try:
                self._on_hold(hold)
            except Exception as exc:
                log.warning("coalesce.sink_failed", error=type(exc).__name__)

    @property
    def pending(self) -> int:
        """Entries being written now (requests sent, no first byte yet)."""
        return len(self._pending)

    @property
    def live(self) -> int:
        """Entries remembered as written."""
        return len(self._live)
