"""Errors the proxy itself answers, in the caller's API error format.

The proxy answers only for failures that are its own to report: a body it cannot read (400), a body over the
limit (413), an upstream it could not reach or that stopped answering before the response started (502 / 504),
and admin-endpoint auth (401 / 403). Everything the upstream answers reaches the client verbatim.

Formats: each wire's (:meth:`agentcache.adapters.Wire.error_body`): Anthropic's
``{"type": "error", "error": {"type": ..., "message": ...}}``, OpenAI's ``{"error": {"message", "type", "param",
"code"}}``.
"""

from __future__ import annotations

import socket
import ssl
from collections.abc import Mapping

import httpx
from starlette.responses import Response

from ..adapters import WIRES, ErrorStyle, error_wire, wire_for_route
from ..adapters.anthropic_messages import ERROR_TYPES as ANTHROPIC_TYPES

__all__ = [
    "ANTHROPIC_TYPES",
    "Style",
    "api_for_path",
    "error_body",
    "error_response",
    "failure_reason",
    "style_for",
    "upstream_failure",
]

Style = ErrorStyle

#: The wire API of each pipeline route.
ROUTES: dict[str, str] = {w.route: w.api for w in WIRES}


def api_for_path(path: str) -> str | None:
    """The wire API (``anthropic.messages``, ``openai.chat``, ``openai.responses``) of a pipeline route."""
    wire = wire_for_route(path)
    return wire.api if wire is not None else None


def style_for(path: str, upstream_kind: str, headers: Mapping[str, str] | None = None) -> Style:
    """Error format for a request: its route's wire's; else Anthropic for ``/v1/messages*``, for a request carrying
    Anthropic's headers (``anthropic-version`` or ``x-api-key``, as the Anthropic SDKs send on every call,
    ``GET /v1/models`` included) or for an Anthropic upstream; else OpenAI."""
    wire = wire_for_route(path)
    if wire is not None:
        return wire.error_style
    if path.startswith("/v1/messages") or upstream_kind == "anthropic":
        return "anthropic"
    if headers is not None and ("anthropic-version" in headers or "x-api-key" in headers):
        return "anthropic"
    return "openai"


def error_body(style: Style, status: int, message: str) -> bytes:
    """The JSON error document for ``status`` in ``style`` (the wire's :meth:`~agentcache.adapters.Wire.error_body`
    whose format that is)."""
    return error_wire(style).error_body(status, message)


def error_response(style: Style, status: int, message: str) -> Response:
    """A JSON error response; marked ``x-agentcache-error: 1`` so it is never mistaken for the upstream's."""
    return Response(
        error_body(style, status, message),
        status_code=status,
        media_type="application/json",
        headers={"x-agentcache-error": "1"},
    )


def upstream_failure(exc: httpx.HTTPError) -> tuple[int, str, str]:
    """``(status, message, kind)`` for an upstream failure before any response: 504 for a timeout, else 502;
    ``message`` says why (:func:`failure_reason`); ``kind`` is ``timeout``, ``connect`` or ``other`` (the metric
    label)."""
    reason = failure_reason(exc)
    if isinstance(exc, httpx.TimeoutException):
        return 504, f"upstream timed out ({reason})", "timeout"
    kind = "connect" if isinstance(exc, httpx.ConnectError) else "other"
    return 502, f"upstream unavailable ({reason})", kind


#: Words for the timeouts httpx tells apart.
_TIMEOUTS: tuple[tuple[type[httpx.TimeoutException], str], ...] = (
    (httpx.ConnectTimeout, "connect timeout"),
    (httpx.ReadTimeout, "read timeout"),
    (httpx.WriteTimeout, "write timeout"),
    (httpx.PoolTimeout, "pool timeout: no free upstream connection"),
)


def failure_reason(exc: BaseException) -> str:
    """Why a request to the upstream failed, in a few words: ``connection refused``, ``DNS lookup failed (Name or
    service not known)``, ``connect timeout``, ``TLS error (...)``, else the exception's class and message (at
    most 200 characters). Reads the exception's causes: httpx reports a refused connection as "All connection
    attempts failed"; the socket error under it says which."""
    for kind, words in _TIMEOUTS:
        if isinstance(exc, kind):
            return words
    for cause in _causes(exc):
        if isinstance(cause, socket.gaierror):
            return f"DNS lookup failed ({cause.strerror or cause})"
        if isinstance(cause, ConnectionRefusedError):
            return "connection refused"
        if isinstance(cause, ConnectionResetError):
            return "connection reset by the upstream"
        if isinstance(cause, ssl.SSLError):
            return f"TLS error ({cause.reason or cause})"
    text = " ".join(str(exc).split())[:200]
    return f"{type(exc).__name__}: {text}" if text else type(exc).__name__


def _causes(exc: BaseException) -> list[BaseException]:
    """``exc`` and its chain of causes (``__cause__``, else ``__context__``), at most 10 deep."""
    chain: list[BaseException] = []
    node: BaseException | None = exc
    while node is not None and len(chain) < 10:
        chain.append(node)
        node = node.__cause__ or node.__context__
    return chain
