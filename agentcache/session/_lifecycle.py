"""Session lifecycle signals: the four fields, turn reports, events, and where events go.

Every wrapped request yields a :class:`TurnReport` keyed by the four fields of docs/design.md:
``prefix_identity`` (:class:`PrefixIdentity`), ``reuse_boundary`` (:class:`ReuseBoundary`),
``session_signal`` (:class:`SessionSignal`) and ``storage_tier`` (:class:`StorageTier`). Sessions emit
a :class:`LifecycleEvent` for each of ``open``, ``turn``, ``retry``, ``fork`` and ``close``:

* to the ``agentcache.session`` logger (:mod:`agentcache._log`: silent unless the host configures logging),
  event ``session.<name>`` with the four fields as dicts: ``open``, ``retry``, ``fork`` and ``close`` at info
  level, ``turn`` (one per request; the proxy's ``proxy.request`` line already carries its fields) at debug.
  Only ids, hashes and counts are logged: never prompt text or credentials;
* to every registered sink: a plain callable ``sink(event)``, :class:`SGLangSink` or
  :class:`PrometheusSink`. A sink may also have ``annotate(body, signal, base_url) -> body``, called
  on each outgoing wire body (the SGLang sink adds ``session_id`` there). A failing sink is logged
  and skipped: sinks never break a request (fail open).

Retry versus new generation (the contract):

* **retry** (same ``generation``, ``attempt`` + 1): the same turn is sent again after a transient
  error (timeout, 5xx, 429, a stream cut mid-way). The session's committed history is untouched, so
  the retried request is diagnosed against the last request that succeeded. The wrappers record this
  automatically whenever the SDK raises; agentcache never retries by itself.
* **new generation** (``session.restart()``, ``generation`` + 1): the logical session starts over
  from scratch (a subagent relaunched, a conversation reset or re-seeded). The old incarnation is
  closed (``close``, reason ``restart``) and a fresh one opened (``open``, reason ``restart``) with the
  same ``session_id`` and lineage; responses that arrive late for the old generation never change the
  new one's state.
"""

from __future__ import annotations

import logging
from collections.abc import Callable, Mapping
from contextvars import ContextVar
from typing import Any, Protocol

from .._log import enabled, get_logger
from ..model._fields import LifecycleEvent, SessionSignal

__all__ = ["TRACE_HEADERS", "Sink", "annotate", "emit"]

#: The W3C trace-context headers (``traceparent``, ``tracestate``) of the request a door is serving, for sinks that
#: continue the client's trace (:class:`~agentcache.session._otel.OtelSink`): the proxy sets them per request (each
#: request runs in its own context); None outside a request that sent them.
TRACE_HEADERS: ContextVar[Mapping[str, str] | None] = ContextVar("agentcache_trace_headers", default=None)

log_name = "agentcache.session"
log = get_logger(log_name)


class Sink(Protocol):
    """Receives lifecycle events; a plain function ``(LifecycleEvent) -> None`` qualifies."""

    def __call__(self, event: LifecycleEvent, /) -> None: ...


def emit(event: LifecycleEvent, sinks: list[Sink] | tuple[Sink, ...]) -> None:
    """Log ``event`` and hand it to each sink; a sink that raises is logged and skipped."""
    level = logging.DEBUG if event.event == "turn" else logging.INFO
    if enabled(log_name, level):
        log.log(level, f"session.{event.event}", **event.log_fields())
    for sink in sinks:
        try:
            sink(event)
        except Exception as exc:  # fail open: a sink never breaks the request path
            log.warning("session.sink_failed", sink=type(sink).__name__, error=type(exc).__name__, detail=str(exc))


def annotate(
    body: dict[str, Any], signal: SessionSignal, base_url: str | None, sinks: tuple[Sink, ...]
) -> dict[str, Any]:
    """``body`` after every sink's optional ``annotate`` hook; a failing hook is logged and skipped."""
    for sink in sinks:
        hook: Callable[[dict[str, Any], SessionSignal, str | None], dict[str, Any]] | None = getattr(
            sink, "annotate", None
        )
        if hook is None:
            continue
        try:
            body = hook(body, signal, base_url)
        except Exception as exc:
            log.warning("session.sink_failed", sink=type(sink).__name__, error=type(exc).__name__, detail=str(exc))
    return body
