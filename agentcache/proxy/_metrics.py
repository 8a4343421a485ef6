"""Prometheus metrics of the proxy (``/metrics``), in one registry per app.

======================================================  ==========================================================
metric                                                  labels / meaning
======================================================  ==========================================================
``agentcache_proxy_requests_total``                     ``route``, ``provider``, ``model``, ``status`` (HTTP code,
                                                        or ``error`` when no response was relayed)
``agentcache_proxy_tokens_total``                       ``provider``, ``model``, ``kind``: ``prompt``,
                                                        ``cache_read``, ``cache_write``, ``uncached`` (reported
                                                        by the upstream)
``agentcache_proxy_breaks_total``                       ``provider``, ``cause``, ``repaired``
``agentcache_proxy_misses_total``                       ``provider``, ``arm``, ``cause`` (simulated)
``agentcache_proxy_cost_usd_total``                     ``provider``, ``model``, ``arm``: ``as_sent`` and
                                                        ``agentcache`` (simulated), ``reported`` (priced usage)
``agentcache_proxy_saved_usd``                          USD saved, simulated ``as_sent`` − ``agentcache``
``agentcache_proxy_upstream_latency_seconds``           ``route``: request sent → last byte relayed
``agentcache_proxy_upstream_ttfb_seconds``              ``route``: request sent → response headers
``agentcache_proxy_upstream_errors_total``              ``route``, ``kind``: ``timeout``, ``connect``,
                                                        ``stream_cut``, ``other``
``agentcache_proxy_fail_open_total``                    ``stage``: agentcache's own failures, request sent as is
``agentcache_proxy_store_errors_total``                 ``op``: shared-store failures (fail open)
``agentcache_proxy_stale_commits_total``                responses for a closed or older generation (ignored)
``agentcache_proxy_live_sessions``                      sessions this process holds
``agentcache_session_events_total``                     ``event``: lifecycle events (:class:`PrometheusSink`)
======================================================  ==========================================================

``model`` is the price-table name of a known model, else ``other`` (client-chosen strings never become label
values, so a caller cannot blow up the series count).
"""

from __future__ import annotations

from prometheus_client import CollectorRegistry, Counter, Gauge, Histogram, generate_latest

from ..model._rules import anthropic_rules, openai_rules
from ..session._sinks import PrometheusSink

__all__ = ["ProxyMetrics", "model_label"]

_LATENCY_BUCKETS = (0.001, 0.0025, 0.005, 0.01, 0.025, 0.05, 0.1, 0.25, 0.5, 1, 2.5, 5, 10, 30, 60, 120, 300, 600)


def model_label(provider: str, model: str | None) -> str:
    """The ``model`` label: the price table's name for a known model, else ``other``."""
    if not model:
        return "other"
    rules = anthropic_rules(model) if provider == "anthropic" else openai_rules(model)
    return rules.model if rules.known else "other"


class ProxyMetrics:
    """The proxy's instruments in a private ``CollectorRegistry`` (see the module docstring)."""

    def __init__(self, registry: CollectorRegistry | None = None) -> None:
        self.registry = registry if registry is not None else CollectorRegistry(auto_describe=True)
        reg = self.registry
        ns = "agentcache_proxy"
        self.requests = Counter(
            "requests", "Requests relayed", ["route", "provider", "model", "status"], namespace=ns, registry=reg
        )
        self.tokens = Counter(
            "tokens",
            "Prompt tokens reported by the upstream",
            ["provider", "model", "kind"],
            namespace=ns,
            registry=reg,
        )
        self.breaks = Counter(
            "breaks", "Prefix breaks diagnosed", ["provider", "cause", "repaired"], namespace=ns, registry=reg
        )
        self.misses = Counter(
            "misses", "Cache-mechanics misses (simulated)", ["provider", "arm", "cause"], namespace=ns, registry=reg
        )
        self.cost = Counter(
            "cost_usd", "Input-side cost in USD", ["provider", "model", "arm"], namespace=ns, registry=reg
        )
        self.saved = Gauge("saved_usd", "USD saved: simulated as_sent minus agentcache", namespace=ns, registry=reg)
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
        self.fail_open = Counter(
            "fail_open", "agentcache failures on a request (sent unchanged)", ["stage"], namespace=ns, registry=reg
        )
        self.store_errors = Counter("store_errors", "Shared-store failures", ["op"], namespace=ns, registry=reg)
        self.stale = Counter(
            "stale_commits", "Responses for a closed or older generation, ignored", namespace=ns, registry=reg
        )
        self.live_sessions = Gauge("live_sessions", "Live sessions in this process", namespace=ns, registry=reg)
        self.keep_warm = Counter(
            "keep_warm_requests",
            "Keep-warm requests (settings keep_warm): sent (2xx), failed, or dropped (session moved on or closed)",
            ["outcome"],
            namespace=ns,
            registry=reg,
        )
        self.sink = PrometheusSink(registry=reg, namespace="agentcache")
        self._saved = 0.0

    def add_saved(self, usd: float) -> None:
        """Accumulate simulated savings (may be negative for one request)."""
        self._saved += usd
        self.saved.set(self._saved)

    def render(self) -> bytes:
        """The text exposition format."""
        return generate_latest(self.registry)
