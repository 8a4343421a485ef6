"""What the proxy's routes share: :class:`Exchange` (one pipeline request as its steps fill it in), the one
fail-open boundary (:func:`guarded`), the refusals agentcache answers itself (:func:`refused`), reading a body
within the limit, and the metrics of a finished response (:func:`count_response`).

Every step of the request path that is agentcache's own runs through :func:`guarded`: a failure is counted and
logged (``proxy.fail_open``, labelled with the step) and the step's fallback is used, so the client's request
goes on unchanged. A body the upstream is the judge of (agentcache cannot read it: :class:`~agentcache.InputError`
while preparing, a JSON text nested too deep while parsing) is logged as ``proxy.unreadable_request`` instead.
A refusal (:class:`Refused`, :class:`~agentcache.proxy._boundary.BodyTimeout`) passes through: the route answers
it in the caller's error format.
"""

from __future__ import annotations

import inspect
import time
from collections.abc import AsyncIterator, Awaitable, Callable
from dataclasses import dataclass, field
from typing import Any, TypeVar

from starlette.requests import Request
from starlette.responses import Response

from .._exceptions import InputError
from .._log import get_logger
from ..model._types import Api
from ..policies import KeepWarmDecision
from ..session import Turn
from ..session._coalesce import Ticket
from ._boundary import BodyTimeout
from ._errors import Style
from ._forward import StreamOutcome, UsageTap
from ._state import ProxyState

__all__ = [
    "BadJSON",
    "BodyTooLarge",
    "Exchange",
    "Refused",
    "count_response",
    "guarded",
    "limited",
    "read_body",
    "refused",
]

log = get_logger("agentcache.proxy")

T = TypeVar("T")

#: Steps where an unreadable body is the upstream's to judge (logged as such, not as agentcache's failure).
_JUDGED_STEPS = frozenset({"parse", "prepare"})


class Refused(Exception):
    """A request agentcache answers itself with ``status`` (in the caller's error format)."""

    status = 400


class BodyTooLarge(Refused):
    """The request body is over the configured limit."""

    status = 413


class BadJSON(Refused):
    """The request body is no JSON text (``str(exc)``: why)."""


@dataclass(slots=True)
class Exchange:
    """One pipeline request as the route's steps fill it in. ``raw``: the body as sent; ``texts``: its source texts
    (the parse memo's); ``body``: the parsed JSON object (``{}`` when it is none, ``is_object`` False);
    ``content``: the bytes sent upstream; ``headers``: those sent upstream; ``started``: perf-counter seconds at
    the send; ``now``: wall-clock seconds when the turn began; ``tap``, ``warm``, ``close_after``: what the
    response step decided (usage tap, keep-warm decision, a requested close)."""

    state: ProxyState
    request: Request
    api: Api
    route: str
    style: Style
    provider: str
    tenant: str
    client: str | None
    raw: bytes = b""
    texts: Any = None
    body: dict[str, Any] = field(default_factory=dict)
    is_object: bool = False
    model: str = ""
    now: float = 0.0
    turn: Turn | None = None
    content: bytes = b""
    headers: list[tuple[bytes, bytes]] = field(default_factory=list)
    ticket: Ticket | None = None
    started: float = 0.0
    tap: UsageTap | None = None
    warm: KeepWarmDecision | None = None
    close_after: bool = False


async def guarded(ex: Exchange, step: str, fallback: T, fn: Callable[[], T | Awaitable[T]]) -> T:
    """``fn()`` (awaited when it returns an awaitable), or ``fallback`` when it raised: the one fail-open boundary
    (see the module docstring). Re-raises :class:`Refused`, :class:`BodyTimeout` and what is no ``Exception``
    (a cancelled request)."""
    try:
        out = fn()
        return await out if inspect.isawaitable(out) else out
    except (Refused, BodyTimeout):
        raise
    except Exception as exc:
        if step in _JUDGED_STEPS and isinstance(exc, InputError):
            log.info("proxy.unreadable_request", api=str(ex.api), error=str(exc))
        else:
            ex.state.fail_open(step, exc)
    return fallback


def refused(state: ProxyState, route: str, provider: str, style: Style, exc: Exception) -> Response:
    """The answer to a refused request (:class:`Refused`: its status; :class:`BodyTimeout`: 408)."""
    limit = state.config.max_body_bytes
    if isinstance(exc, BodyTooLarge):
        return state.own_error(route, provider, style, 413, f"request body exceeds {limit} bytes")
    status = 408 if isinstance(exc, BodyTimeout) else exc.status if isinstance(exc, Refused) else 400
    return state.own_error(route, provider, style, status, str(exc))


def over_limit(request: Request, limit: int) -> bool:
    """The request declares a body over ``limit`` bytes (``content-length``)."""
    declared = request.headers.get("content-length", "")
    return declared.isdigit() and int(declared) > limit


async def read_body(request: Request, limit: int) -> bytes:
    """The whole request body; raises :class:`BodyTooLarge` as soon as it exceeds ``limit`` bytes."""
    if over_limit(request, limit):
        raise BodyTooLarge
    buf = bytearray()
    async for chunk in request.stream():
        buf += chunk
        if len(buf) > limit:
            raise BodyTooLarge
    return bytes(buf)


async def limited(stream: AsyncIterator[bytes], limit: int) -> AsyncIterator[bytes]:
    """``stream``'s chunks as they come; raises :class:`BodyTooLarge` once more than ``limit`` bytes passed."""
    total = 0
    async for chunk in stream:
        total += len(chunk)
        if total > limit:
            raise BodyTooLarge
        yield chunk


def count_response(
    state: ProxyState, route: str, provider: str, model: str, status: int, outcome: StreamOutcome, started: float
) -> float:
    """Count a response after its last byte (latency, the request under the status the client got, a cut
    stream); returns the latency in seconds since ``started`` (perf-counter seconds)."""
    latency = time.perf_counter() - started
    state.metrics.latency.labels(route).observe(latency)
    state.count_request(route, provider, model, outcome.counted_status(status))
    if outcome.status == "upstream_error":
        state.metrics.upstream_errors.labels(route, "stream_cut").inc()
    return latency
