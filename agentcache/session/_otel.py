"""OpenTelemetry export (setting ``otel``, ``AGENTCACHE_OTEL=1``; the ``otel`` extra): one span per turn, per
failed try and per request the proxy relays, exported over OTLP/HTTP by the standard SDK and exporter.

:class:`OtelSink` is a lifecycle sink (:mod:`._lifecycle`), so every door that finishes turns through the session
core (``wrap()``, the proxy, ``replay``) exports the same spans; :class:`~agentcache.session.Sessions` adds it when
the setting is on. Nothing here is configured by agentcache: the exporter, its endpoint, headers and timeouts come
from the standard ``OTEL_EXPORTER_OTLP_*`` variables, the batching from ``OTEL_BSP_*``, the resource from
``OTEL_SERVICE_NAME`` / ``OTEL_RESOURCE_ATTRIBUTES`` (``service.name`` defaults to ``agentcache``). When the host
application already installed an SDK tracer provider, the spans go to it instead.

A turn's span (kind ``CLIENT``, named ``chat {model}``, from send to the end of the response) carries the GenAI
semantic conventions' attributes: ``gen_ai.operation.name`` (``chat``), ``gen_ai.provider.name`` (and the older
``gen_ai.system``), ``gen_ai.request.model``, ``gen_ai.conversation.id`` (the session id),
``gen_ai.usage.input_tokens`` (the whole prompt, cached tokens included), ``gen_ai.usage.output_tokens``,
``gen_ai.usage.cache_read.input_tokens`` and ``gen_ai.usage.cache_creation.input_tokens``; and agentcache's own:
``agentcache.session``, ``.generation``, ``.attempt``, ``.turn``, ``.parent``, ``.lineage``, ``.cause`` and
``.where`` (the break, when the prefix diverged), ``.repaired``, ``.tokens_lost``, ``.tokens_lost_unrepaired``,
``.matched_tokens``, ``.repairs``, ``.ttl``, ``.cost_usd`` and ``.usd_lost`` (what the lost tokens cost beyond
reading them); ``gen_ai.response.model`` is the model the response names (its ``model``: a whole body's, a
stream's first usage event's), unset when it names none. Only ids, names and numbers are exported: never prompt
text, never an API key.

The parent span is the client's: the proxy hands its ``traceparent`` / ``tracestate`` headers over through
:data:`TRACE_HEADERS` (W3C trace context); without them, the context current where the turn finishes (``wrap()``
inside an instrumented application). Fail open: spans are exported by a background thread; an exporter that fails
or hangs never touches a request, and the SDK's own warnings go to the ``opentelemetry`` loggers (silent unless
the host configures logging).
"""

from __future__ import annotations

import logging
from typing import Any

from opentelemetry import trace
from opentelemetry.sdk.resources import Resource
from opentelemetry.sdk.trace import TracerProvider
from opentelemetry.sdk.trace.export import BatchSpanProcessor
from opentelemetry.trace import SpanKind, Status, StatusCode
from opentelemetry.trace.propagation.tracecontext import TraceContextTextMapPropagator

from .._log import get_logger
from ..analysis._inferred import usd_beyond_reading
from ..model._fields import LifecycleEvent, SessionSignal, TurnReport
from ..model._types import Api
from ..targets import cost_usd
from ._lifecycle import TRACE_HEADERS

__all__ = ["TRACE_HEADERS", "OtelSink"]

log = get_logger("agentcache.session")
_SCOPE = "agentcache"
_NS = 1_000_000_000


def _provider() -> trace.TracerProvider:
    """The host's SDK tracer provider when it installed one, else a new one exporting over OTLP/HTTP."""
    current = trace.get_tracer_provider()
    if isinstance(current, TracerProvider):
        return current
    from opentelemetry.exporter.otlp.proto.http.trace_exporter import OTLPSpanExporter

    resource = Resource.create()
    if str(resource.attributes.get("service.name", "")).startswith("unknown_service"):
        resource = resource.merge(Resource({"service.name": "agentcache"}))
    provider = TracerProvider(resource=resource)
    provider.add_span_processor(BatchSpanProcessor(OTLPSpanExporter()))
    for name in ("opentelemetry.sdk", "opentelemetry.exporter"):  # silent unless the host configures logging
        logger = logging.getLogger(name)
        if not logger.handlers:
            logger.addHandler(logging.NullHandler())
    return provider


class OtelSink:
    """The lifecycle sink that exports spans (see the module docstring). ``provider``: a tracer provider (tests);
    default the host's SDK provider, else one exporting over OTLP/HTTP as the ``OTEL_*`` variables say."""

    def __init__(self, provider: trace.TracerProvider | None = None) -> None:
        self.provider = provider or _provider()
        self._own = provider is None and self.provider is not trace.get_tracer_provider()
        self.tracer = self.provider.get_tracer(_SCOPE)

    def __call__(self, event: LifecycleEvent) -> None:
        """A ``turn`` event becomes a span; a ``retry`` with a report-less failure a span with an error status."""
        if event.event == "turn" and event.report is not None:
            self._turn(event.report, event.at)
        elif event.event == "retry":
            attrs = _signal_attributes(event.session_signal)
            self._span("retry", event.at, 0.0, attrs, error=event.reason or "retry")

    def relayed(self, method: str, route: str, status: int, at: float, duration: float) -> None:
        """A request the proxy relayed untouched: ``method``, its metric ``route`` (never the path, which may
        carry ids), the HTTP ``status``, when it ended (unix seconds) and how long it took (seconds). Never raises:
        a failure is logged (fail open)."""
        attrs = {"http.request.method": method, "http.response.status_code": status, "agentcache.route": route}
        try:
            self._span(f"{method} relay", at, duration, attrs, error=str(status) if status >= 500 else None)
        except Exception as exc:
            log.warning("otel.span_failed", error=type(exc).__name__, detail=str(exc))

    def flush(self, timeout_s: float = 5.0) -> None:
        """Export what is pending (at most ``timeout_s`` seconds)."""
        flush = getattr(self.provider, "force_flush", None)
        if flush is not None:
            flush(int(timeout_s * 1000))

    def shutdown(self) -> None:
        """Flush, and stop the provider when this sink made it."""
        self.flush()
        if self._own:
            getattr(self.provider, "shutdown", lambda: None)()

    def _turn(self, report: TurnReport, at: float) -> None:
        duration = report.duration_s or 0.0
        self._span(f"chat {report.model}", at, duration, turn_attributes(report))

    def _span(self, name: str, end: float, duration: float, attrs: dict[str, Any], error: str | None = None) -> None:
        parent = None
        headers = TRACE_HEADERS.get()
        if headers:
            parent = TraceContextTextMapPropagator().extract(headers)
        start = int((end - max(duration, 0.0)) * _NS)
        span = self.tracer.start_span(name, context=parent, kind=SpanKind.CLIENT, attributes=attrs, start_time=start)
        if error is not None:
            span.set_status(Status(StatusCode.ERROR, error))
        span.end(end_time=int(end * _NS))


def _signal_attributes(s: SessionSignal) -> dict[str, Any]:
    out: dict[str, Any] = {
        "agentcache.session": s.session_id,
        "agentcache.generation": s.generation,
        "agentcache.attempt": s.attempt,
        "agentcache.turn": s.turn,
        "agentcache.lineage": s.lineage,
        "gen_ai.conversation.id": s.session_id,
    }
    if s.parent is not None:
        out["agentcache.parent"] = s.parent
    return out


def turn_attributes(report: TurnReport) -> dict[str, Any]:
    """The span attributes of one turn (see the module docstring): ids, names and numbers only."""
    try:
        provider = str(Api(report.api).provider)
    except ValueError:
        provider = report.api
    b, s, u = report.reuse_boundary, report.session_signal, report.usage
    out = _signal_attributes(s)
    out |= {
        "gen_ai.operation.name": "chat",
        "gen_ai.provider.name": provider,
        "gen_ai.system": provider,
        "gen_ai.request.model": report.model,
        "agentcache.repaired": b.repaired,
        "agentcache.tokens_lost": b.tokens_lost,
        "agentcache.tokens_lost_unrepaired": b.tokens_lost_unrepaired,
        "agentcache.matched_tokens": b.matched_tokens,
        "agentcache.repairs": list(report.repairs),
    }
    if b.cause is not None:
        out["agentcache.cause"] = b.cause
        out["agentcache.where"] = b.where or ""
    if report.storage_tier.ttl is not None:
        out["agentcache.ttl"] = report.storage_tier.ttl
    if report.cost_usd is not None:
        out["agentcache.cost_usd"] = report.cost_usd
    if u is not None:
        out["gen_ai.usage.input_tokens"] = u.prompt_tokens
        if u.response_model is not None:
            out["gen_ai.response.model"] = u.response_model
        out["gen_ai.usage.cache_read.input_tokens"] = u.cache_read_tokens
        out["gen_ai.usage.cache_creation.input_tokens"] = u.cache_write_tokens
        if u.output_tokens is not None:
            out["gen_ai.usage.output_tokens"] = u.output_tokens
        lost = min(b.tokens_lost, u.cache_write_tokens + u.uncached_tokens)
        usd = usd_beyond_reading(u, lost, lambda v: cost_usd(v, provider, report.model))
        if lost > 0 and usd is not None:
            out["agentcache.usd_lost"] = usd
    return out
