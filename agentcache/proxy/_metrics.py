"""Prometheus metrics of the proxy (``/metrics``), in one registry per app.

The proxy's own, HTTP-level instruments:

======================================================  ==========================================================
metric                                                  labels / meaning
======================================================  ==========================================================
``agentcache_proxy_requests_total``                     ``route`` (a pipeline route, ``passthrough``, or
                                                        ``agentcache`` for refusals in its own namespace),
                                                        ``provider``, ``model``, ``status``: the HTTP code the
                                                        client got, agentcache's own 400/413/500... included,
                                                        or ``error`` when no response was relayed
``agentcache_proxy_upstream_latency_seconds``           ``route``: request sent → last byte relayed
``agentcache_proxy_upstream_ttfb_seconds``              ``route``: request sent → response headers
``agentcache_proxy_upstream_errors_total``              ``route``, ``kind``: ``timeout``, ``connect``,
                                                        ``stream_cut``, ``other``
``agentcache_proxy_stale_connections_total``            ``action``: ``resent`` (a pooled connection the upstream had
                                                        closed, found before the request was written: sent on
                                                        another), ``closed_after_stream`` (closed after a streamed
                                                        response of an upstream that closes them; see
                                                        ``_transport.py``)
``agentcache_proxy_fail_open_total``                    ``stage``: agentcache's own failures, request sent as is
                                                        (``prepare``, ``parse``, ``commit``, ``respond``,
                                                        ``report``...; ``response_header``: a header of ours
                                                        left out; ``response_start``: a response lost;
                                                        ``unhandled``: answered with a 500)
``agentcache_proxy_store_errors_total``                 ``op``: shared-store failures (fail open)
``agentcache_proxy_stale_commits_total``                responses for a closed or older generation (ignored)
``agentcache_proxy_live_sessions``                      sessions this process holds
``agentcache_proxy_state_bytes``                        ``part``: estimated bytes each part of the memory budget
                                                        holds (:mod:`~agentcache.proxy._budget`)
``agentcache_proxy_state_budget_bytes``                 ``part``: that part's share of ``max_state_mb``
``agentcache_proxy_keep_warm_requests_total``           ``outcome``: ``sent`` (2xx), ``failed``, ``dropped``
``agentcache_proxy_record_lines_total``                 ``outcome`` (``--record``, :mod:`~agentcache.proxy._record`):
                                                        ``written``; ``dropped`` (the write queue was full);
                                                        ``failed`` (the write failed: disk full, permissions...);
                                                        ``skipped`` (not recorded: answered with no 2xx, or no
                                                        session because agentcache failed open on it)
======================================================  ==========================================================

and, on the same registry, the turn-level ones every door shares (:class:`~agentcache.PrometheusSink`, defined
once in :mod:`agentcache.session._metrics`, fed by the session core's lifecycle events and the live report's
ledger):

======================================================  ==========================================================
``agentcache_session_events_total``                     ``event``: lifecycle events
``agentcache_prompt_tokens_total``                      ``provider``, ``model``, ``kind``: ``cache_read``,
                                                        ``cache_write``, ``uncached`` (reported by the upstream);
                                                        ``source``: ``turn``, or ``uncommitted`` / ``untracked`` /
                                                        ``keep_warm`` for requests that are no turn
``agentcache_cost_usd_total``                           ``provider``, ``model``, ``arm``: ``as_sent`` and
                                                        ``agentcache`` (simulated), ``reported`` (priced usage)
``agentcache_breaks_total``                             ``provider``, ``cause``, ``repaired``
``agentcache_misses_total``                             ``provider``, ``arm``, ``cause`` (simulated)
``agentcache_saved_usd``                                USD saved, simulated ``as_sent`` − ``agentcache``
======================================================  ==========================================================

With ``--workers N`` (:mod:`agentcache.proxy._multiproc`) every worker writes its values to a shared directory and
``/metrics`` answers with all the workers' together: counters and histograms summed, the gauges ``livesum`` (the
running workers' values added: live sessions, bytes held and budgets of every worker), ``agentcache_saved_usd``
``sum``. Callback gauges do not reach those files, so there the measured gauges (live sessions, state bytes) are
set by :meth:`ProxyMetrics.refresh`: by the scraped worker just before it collects, and by each worker once a
second (:class:`~agentcache.proxy._workers.WorkerApp`), so another worker's value is at most a second old. Setting
them on every change instead would put hooks on the request path of the store, the report and the memos.

``model`` is the price-table name of a known model, else ``other`` (:func:`model_label`: client-chosen strings
never become label values, so a caller cannot blow up the series count).
"""

from __future__ import annotations

from collections.abc import Callable
from typing import Any

from prometheus_client import CollectorRegistry, generate_latest

from ..session._instruments import Counter, Gauge, Histogram
from ..session._metrics import PrometheusSink, model_label
from ._multiproc import collect_workers

__all__ = ["ProxyMetrics", "model_label"]

_LATENCY_BUCKETS = (0.001, 0.0025, 0.005, 0.01, 0.025, 0.05, 0.1, 0.25, 0.5, 1, 2.5, 5, 10, 30, 60, 120, 300, 600)


class ProxyMetrics:
    """The proxy's HTTP-level instruments and the shared turn-level :attr:`sink`, in a private
    ``CollectorRegistry`` (see the module docstring). ``multiprocess_dir``: the workers' shared directory
    (:func:`~agentcache.proxy._multiproc.worker_metrics_dir`), or None for one process."""

    def __init__(self, registry: CollectorRegistry | None = None, multiprocess_dir: str | None = None) -> None:
        self.multiprocess_dir = multiprocess_dir
        self._measures: list[tuple[Any, Callable[[], float]]] = []
        self.registry = registry if registry is not None else CollectorRegistry(auto_describe=True)
        reg = self.registry
        ns = "agentcache_proxy"
        self.requests = Counter(
            "requests", "Requests relayed", ["route", "provider", "model", "status"], namespace=ns, registry=reg
        )
        self.latency = Histogram(
            "upstream_latency_seconds",
            "Upstream request sent to last byte relayed",
            ["route"],
            namespace=ns,
            registry=reg,
            buckets=_LATENCY_BUCKETS,
        )
        self.ttfb = Histogram(
            "upstream_ttfb_seconds",
            "Upstream request sent to response headers",
            ["route"],
            namespace=ns,
            registry=reg,
            buckets=_LATENCY_BUCKETS,
        )
        self.upstream_errors = Counter(
            "upstream_errors", "Upstream failures", ["route", "kind"], namespace=ns, registry=reg
        )
        self.stale_connections = Counter(
            "stale_connections",
            "Pooled upstream connections found closed before a request was written (resent), or closed after a "
            "streamed response because the upstream closes them (closed_after_stream)",
            ["action"],
            namespace=ns,
            registry=reg,
        )
        self.fail_open = Counter(
            "fail_open", "agentcache failures on a request (sent unchanged)", ["stage"], namespace=ns, registry=reg
        )
        self.store_errors = Counter("store_errors", "Shared-store failures", ["op"], namespace=ns, registry=reg)
        self.stale = Counter(
            "stale_commits", "Responses for a closed or older generation, ignored", namespace=ns, registry=reg
        )
        self.live_sessions = Gauge(
            "live_sessions", "Live sessions in this process", namespace=ns, registry=reg, multiprocess_mode="livesum"
        )
        self.state_bytes = Gauge(
            "state_bytes",
            "Estimated bytes each part of the memory budget holds",
            ["part"],
            namespace=ns,
            registry=reg,
            multiprocess_mode="livesum",
        )
        self.state_budget = Gauge(
            "state_budget_bytes",
            "Each part's share of max_state_mb",
            ["part"],
            namespace=ns,
            registry=reg,
            multiprocess_mode="livesum",
        )
        self.keep_warm = Counter(
            "keep_warm_requests",
            "Keep-warm requests (settings keep_warm): sent (2xx), failed, or dropped (session moved on or closed)",
            ["outcome"],
            namespace=ns,
            registry=reg,
        )
        self.record_lines = Counter(
            "record_lines",
            "Pipeline requests the recorder (--record) wrote, dropped (queue full), failed to write, or skipped",
            ["outcome"],
            namespace=ns,
            registry=reg,
        )
        #: The turn-level instruments (the one definition every door shares), registered as a session sink.
        self.sink = PrometheusSink(registry=reg, namespace="agentcache")

    def measure(self, gauge: Any, read: Callable[[], float]) -> None:
        """Let ``gauge`` (a ``Gauge`` or one of its labelled children) show ``read()``: read at each collection in
        one process; in multiprocess mode set now and at each :meth:`refresh` (see the module docstring)."""
        if self.multiprocess_dir is None:
            gauge.set_function(read)
        else:
            self._measures.append((gauge, read))
            gauge.set(read())

    def refresh(self) -> None:
        """Set every measured gauge from its reader (multiprocess mode; nothing to do in one process)."""
        for gauge, read in self._measures:
            gauge.set(read())

    def render(self) -> bytes:
        """The text exposition format: this registry, or in multiprocess mode every worker's values together."""
        if self.multiprocess_dir is None:
            return generate_latest(self.registry)
        self.refresh()
        return collect_workers(self.multiprocess_dir)
