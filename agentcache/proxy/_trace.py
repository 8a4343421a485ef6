"""The proxy's side of OpenTelemetry export (setting ``otel``; the spans themselves:
:mod:`agentcache.session._otel`). Each request's W3C ``traceparent`` / ``tracestate`` headers
(:func:`trace_headers`) are the sinks' for as long as the request is served (its response streamed included), so
the turn's span continues the client's trace. Nothing here imports OpenTelemetry: with the setting off it costs
one header lookup per request."""

from __future__ import annotations

from typing import Any

from starlette.types import Scope

__all__ = ["trace_headers", "tracing_sink"]

_NAMES = (b"traceparent", b"tracestate")


def trace_headers(scope: Scope) -> dict[str, str] | None:
    """The request's ``traceparent`` / ``tracestate`` headers (names lower-case), or None without a
    ``traceparent``. The entry (:class:`~agentcache.proxy._entry.ProxyApp`) sets them in
    :data:`~agentcache.session._lifecycle.TRACE_HEADERS` while the request is served and resets them after (an
    in-process client shares its context with the app)."""
    found = {k.decode("latin-1"): v.decode("latin-1") for k, v in scope.get("headers") or () if k.lower() in _NAMES}
    return found if "traceparent" in found else None


def tracing_sink(sinks: list[Any]) -> Any:
    """The sink among ``sinks`` that records relayed requests (the OpenTelemetry sink: it has ``relayed``), or
    None."""
    return next((s for s in sinks if callable(getattr(s, "relayed", None))), None)
