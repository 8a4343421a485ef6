"""The one definition of agentcache's turn-level Prometheus metrics: :class:`PrometheusSink`.

A library user registers it (``Sessions(sinks=[PrometheusSink()])``); the proxy registers one on its own registry
beside its HTTP-level instruments (:mod:`agentcache.proxy._metrics`). So both export the same names, with the
same labels, for the same things. The instruments have two feeds:

* the session core's lifecycle events (every door): one sink call per :class:`~agentcache.LifecycleEvent`; a
  ``turn`` event also adds its report's usage and priced cost;
* what a ledger (:class:`agentcache.analysis._ledger.Ledger`) found for a committed turn, through
  :meth:`PrometheusSink.record`: cost of the simulated arms, breaks, misses and the USD saved. The proxy's live
  report feeds it. A library sink keeps these at 0 unless its owner feeds it from a ledger.

======================================  ====================================================================
metric (namespace ``agentcache``)       labels / meaning
======================================  ====================================================================
``agentcache_session_events_total``     ``event``: ``open``, ``turn``, ``retry``, ``fork``, ``close``
                                        (events; every series exported from 0)
``agentcache_prompt_tokens_total``      ``provider``, ``model``, ``kind`` (``cache_read``, ``cache_write``,
                                        ``uncached``: together the whole prompt), ``source`` (see below)
``agentcache_cost_usd_total``           ``provider``, ``model``, ``arm``: ``reported`` (the turn's usage at
                                        its target's prices; events), ``as_sent`` and ``agentcache``
                                        (simulated; ledger)
``agentcache_breaks_total``             ``provider``, ``cause``, ``repaired`` (ledger)
``agentcache_misses_total``             ``provider``, ``arm``, ``cause`` (simulated arms, and ``reported``:
                                        the upstream read less than the client's own requests could; ledger)
``agentcache_saved_usd``                USD saved: simulated ``as_sent`` − ``agentcache`` (ledger)
``agentcache_usage_unreported_total``   ``provider``: committed turns whose response carried no usage (an
                                        OpenAI Chat stream without ``stream_options.include_usage``): the
                                        tokens and ``reported`` cost above leave them out (events)
``agentcache_provider_miss_reasons_``   ``provider``, ``reason`` (the provider's own cache-miss reason:
``total``                               :mod:`agentcache.model._provider`; ``other`` if undocumented),
                                        ``agrees`` (``true``/``false`` with agentcache's cause for the same
                                        requests, ``unknown`` when the provider could not compare); events
``agentcache_coalesce_held_requests_``  ``outcome``: ``released``, ``timeout``, ``writer_failed``,
``total``                               ``cancelled`` (requests held for a sibling's first byte: coalescer)
``agentcache_coalesce_hold_seconds``    seconds each held request waited (histogram)
``agentcache_coalesce_saved_write_``    estimated prompt tokens not written again because a held request
``tokens_total``                        read its sibling's entry instead (released holds)
======================================  ====================================================================

Token ``source`` values: ``turn`` is a committed turn, counted from its ``turn`` event. It is the only value a
library sink counts, so the same traffic gives the same series in the library and in the proxy. The proxy also
relays requests that are not turns. The upstream still processed and billed their prompts, so their tokens are
counted too, under another ``source``, and never as turns:

* ``uncommitted``: a 2xx response whose turn was not committed. Either the response arrived late for a closed
  or older generation (``agentcache_proxy_stale_commits_total``) or the commit failed
  (``agentcache_proxy_fail_open_total{stage="commit"}``);
* ``untracked``: a request agentcache tracked no turn for (it failed open before the session core answered, or
  it could not read the body);
* ``keep_warm``: keep-warm requests (``agentcache_proxy_keep_warm_requests_total``).

``sum without (source)`` is every prompt token the upstream reported. Cost counts turns only.

Labels are bounded: ``provider`` is ``engine`` for a session planned for a local engine. Otherwise it is the
provider whose API the request speaks (:func:`provider_label`). That is the session's target name unless a
provider target was forced onto the other provider's API. ``model`` is the price table's name of a known model,
else ``other`` (:func:`model_label`). Client-chosen strings never become label values, so a caller cannot blow
up the series count.
"""

from __future__ import annotations

import importlib
from typing import TYPE_CHECKING, Any

from .._exceptions import ConfigError
from .._install import install_hint
from ..model._fields import EVENTS, LifecycleEvent
from ..model._provider import reason_label
from ..model._rules import anthropic_rules, openai_rules
from ..model._types import Api
from ..model._usage import CacheUsage
from ._coalesce import HOLD_OUTCOMES

if TYPE_CHECKING:
    from ..analysis._ledger import Recorded
    from ._coalesce import Hold

__all__ = ["TOKEN_SOURCES", "PrometheusSink", "model_label", "provider_label"]

#: The ``source`` label values of ``agentcache_prompt_tokens_total`` (see the module docstring).
TOKEN_SOURCES = ("turn", "uncommitted", "untracked", "keep_warm")


def model_label(provider: str, model: str | None) -> str:
    """The ``model`` label: the price table's name for a known model, else ``other``."""
    if not model:
        return "other"
    rules = anthropic_rules(model) if provider == "anthropic" else openai_rules(model)
    return rules.model if rules.known else "other"


#: Each API's provider label (:func:`provider_label`): a dict lookup where ``Api(api)`` was ~1.5 µs a request.
_API_PROVIDER: dict[str, str] = {str(a): a.provider.value for a in Api}


def provider_label(api: str, engine: bool) -> str:
    """The ``provider`` label of a request speaking ``api``: ``engine`` when its session plans for a local engine,
    else the provider whose API it is (``anthropic`` for Messages, ``openai`` for Chat Completions and
    Responses; ``other`` for an unknown API)."""
    if engine:
        return "engine"
    return _API_PROVIDER.get(api, "other")


class PrometheusSink:
    """agentcache's turn-level Prometheus instruments, fed by lifecycle events (the sink call) and by a ledger
    (:meth:`record`); see the module docstring for names, labels and feeds. ``registry``: a
    ``prometheus_client.CollectorRegistry`` (default: the global one; registering the same names twice in one
    registry raises ``ValueError``). ``namespace``: the names' prefix."""

    def __init__(self, registry: Any = None, namespace: str = "agentcache") -> None:
        try:  # the instruments with memoised labels (one place: the proxy's own are made there too)
            instruments = importlib.import_module("agentcache.session._instruments")
        except ImportError:
            raise ConfigError(f"PrometheusSink needs prometheus_client: {install_hint('sinks')}") from None
        reg = registry if registry is not None else importlib.import_module("prometheus_client").REGISTRY
        counter, ns = instruments.Counter, namespace
        self.events = counter(
            "session_events", "agentcache session lifecycle events", ["event"], namespace=ns, registry=reg
        )
        self.tokens = counter(
            "prompt_tokens",
            "Prompt tokens reported by the upstream, by cache outcome (kind) and source",
            ["provider", "model", "kind", "source"],
            namespace=ns,
            registry=reg,
        )
        self.cost = counter(
            "cost_usd", "Input-side cost in USD, per arm", ["provider", "model", "arm"], namespace=ns, registry=reg
        )
        self.breaks = counter(
            "breaks", "Prefix breaks diagnosed", ["provider", "cause", "repaired"], namespace=ns, registry=reg
        )
        self.misses = counter(
            "misses",
            "Cache-mechanics misses (simulated arms; reported: the upstream's own)",
            ["provider", "arm", "cause"],
            namespace=ns,
            registry=reg,
        )
        self.provider_reasons = counter(
            "provider_miss_reasons",
            "Provider-reported cache-miss reasons, and whether agentcache's own cause agrees",
            ["provider", "reason", "agrees"],
            namespace=ns,
            registry=reg,
        )
        self.unreported = counter(
            "usage_unreported",
            "Committed turns whose response carried no usage (not in the token and reported cost series)",
            ["provider"],
            namespace=ns,
            registry=reg,
        )
        self.saved = instruments.Gauge(
            "saved_usd",
            "USD saved: simulated as_sent minus agentcache",
            namespace=ns,
            registry=reg,
            multiprocess_mode="sum",  # several processes (proxy --workers): their savings add up, dead ones' too
        )
        self.held = counter(
            "coalesce_held_requests",
            "Requests held until a sibling writing their shared prefix answered, by outcome",
            ["outcome"],
            namespace=ns,
            registry=reg,
        )
        self.hold_seconds = instruments.Histogram(
            "coalesce_hold_seconds",
            "Seconds a held request waited for its sibling's first byte",
            namespace=ns,
            registry=reg,
            buckets=(0.01, 0.05, 0.1, 0.25, 0.5, 0.75, 1, 1.5, 2, 3, 5, 10),
        )
        self.saved_write_tokens = counter(
            "coalesce_saved_write_tokens",
            "Estimated prompt tokens a held request read from its sibling's entry instead of writing them again",
            namespace=ns,
            registry=reg,
        )
        for name in EVENTS:  # export every series from the start, at 0
            self.events.labels(name)
        for outcome in HOLD_OUTCOMES:
            self.held.labels(outcome)

    def __call__(self, event: LifecycleEvent) -> None:
        """Count ``event``; for a turn, also its usage (``source="turn"``) and its cost (``arm="reported"``)."""
        self.events.labels(event.event).inc()
        report = event.report
        if report is None:
            return
        if (miss := report.provider_miss) is not None:
            agrees = "unknown" if miss.agrees is None else str(miss.agrees).lower()
            self.provider_reasons.labels(miss.provider, reason_label(miss.provider, miss.reason), agrees).inc()
        provider = provider_label(report.api, report.storage_tier.kind == "engine")
        if report.usage is None:
            if event.event == "turn":  # the upstream sent no usage: say so rather than count 0 tokens
                self.unreported.labels(provider).inc()
            return
        self.count_tokens(provider, report.model, report.usage, "turn")
        self.cost.labels(provider, model_label(provider, report.model), "reported").inc(report.cost_usd or 0.0)

    def coalesced(self, hold: Hold) -> None:
        """Count one held request (a :class:`~agentcache.session._coalesce.Hold`): its outcome, seconds held and
        the write tokens it saved (estimated)."""
        self.held.labels(hold.outcome).inc()
        self.hold_seconds.observe(hold.waited_s)
        self.saved_write_tokens.inc(hold.saved_tokens)

    def count_tokens(self, provider: str, model: str | None, usage: CacheUsage, source: str) -> None:
        """Add ``usage``'s prompt tokens by kind. ``provider`` is a :func:`provider_label` value, ``model`` the
        request's model (labelled by :func:`model_label`), ``source`` one of :data:`TOKEN_SOURCES`. Turns are
        counted from their events: call this only for requests that are not turns."""
        if source not in TOKEN_SOURCES:
            raise ValueError(f"unknown token source {source!r}; expected one of {', '.join(TOKEN_SOURCES)}")
        label = model_label(provider, model)
        for kind, value in (
            ("cache_read", usage.cache_read_tokens),
            ("cache_write", usage.cache_write_tokens),
            ("uncached", usage.uncached_tokens),
        ):
            self.tokens.labels(provider, label, kind, source).inc(value)

    def record(self, provider: str, model: str | None, recorded: Recorded) -> None:
        """Add what a ledger's ``record`` found for one committed turn: cost per simulated arm, the break, the
        misses, and the USD saved (``as_sent`` − ``agentcache``, when both are simulated). The ``reported`` arm
        comes from the turn's event, so ``recorded.reported`` is not counted again."""
        label = model_label(provider, model)
        if recorded.brk is not None:
            self.breaks.labels(provider, str(recorded.brk.cause), str(recorded.brk.repaired).lower()).inc()
        for miss in recorded.misses:  # causes as their label text: the memoised children take exact strs only
            self.misses.labels(provider, miss.arm, str(miss.cause)).inc()
        results = recorded.results
        for arm, res in results.items():
            self.cost.labels(provider, label, arm).inc(res.usage.cost_usd)
        if "as_sent" in results and "agentcache" in results:
            self.saved.inc(results["as_sent"].usage.cost_usd - results["agentcache"].usage.cost_usd)
