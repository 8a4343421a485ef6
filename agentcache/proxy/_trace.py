"""The proxy's side of OpenTelemetry export (setting ``otel``; the spans themselves:
:mod:`agentcache.session._otel`). :class:`TraceContext` hands each request's W3C ``traceparent`` / ``tracestate``
headers to the sinks for as long as the request is served (its response streamed included), so the turn's span
continues the client's trace. Nothing here imports OpenTelemetry: with the setting off it costs one header lookup
per request."""

from __future__ import annotations

from typing import Any

from starlette.types import ASGIApp, Receive, Scope, Send

from ..session._lifecycle import TRACE_HEADERS

__all__ = ["TraceContext", "tracing_sink"]

_NAMES = (b"traceparent", b"tracestate")


class TraceContext:
    """ASGI middleware: :data:`~agentcache.session._lifecycle.TRACE_HEADERS` holds the request's trace-context
    headers while it is served, and is reset after (an in-process client shares its context with the app)."""

    def __init__(self, app: ASGIApp) -> None:
        self.app = app

    async def __call__(self, scope: Scope, receive: Receive, send: Send) -> None:
        found = {k.decode("latin-1"): v.decode("latin-1") for k, v in scope.get("headers") or () if k.lower() in _NAMES}
        if scope["type"] != "http" or "traceparent" not in found:
            await self.app(scope, receive, send)
            return
        token = TRACE_HEADERS.set(found)
        try:
            await self.app(scope, receive, send)
        finally:
            TRACE_HEADERS.reset(token)


def tracing_sink(sinks: list[Any]) -> Any:
    """The sink among ``sinks`` that records relayed requests (the OpenTelemetry sink: it has ``relayed``), or
    None."""
    return next((s for s in sinks if callable(getattr(s, "relayed", None))), None)
