"""The proxy's request path for the three pipeline routes, and the relay of every other path.

For ``/v1/messages``, ``/v1/chat/completions`` and ``/v1/responses`` (:func:`handle_api`), one step a function
over one :class:`~agentcache.proxy._exchange.Exchange`: read the body (413 over the limit, 408 when the client
stops sending, 400 for malformed JSON, in the caller's error format; valid JSON that is no object is forwarded
unchanged, the upstream's to judge) → parse → begin the turn in the session core (:meth:`agentcache.Sessions.
abegin`: identity from headers and body, the session's target, one pipeline pass) → build the upstream request
→ claim (and wait on) the coalescing ticket → send → on a 2xx answer commit the turn, and respond, relaying the
body and reading usage on the way → after the last byte, :func:`~agentcache.proxy._finish.finish` (the turn
report and event: metrics, the live report, one log line with the four fields, the recorded exchange).

Any failure of agentcache's own (including an unreachable shared store) goes through the one fail-open boundary
(:func:`~agentcache.proxy._exchange.guarded`): it is logged and counted, and the client's original bytes go
upstream unchanged; once the upstream has answered, nothing of agentcache's may lose the answer (its own headers
are valid field values, and one that is not would be left out, see :class:`~agentcache.proxy._forward.
UpstreamResponse`). Every request is counted once, under the status the client got. Relayed paths
(:func:`relay`) stream the body both ways, also within ``max_body_bytes``.
"""

from __future__ import annotations

import time
from collections.abc import AsyncIterator
from functools import partial

import httpx
from starlette.requests import Request
from starlette.responses import Response

from .._log import get_logger
from ..adapters import wire_for
from ..model._rawjson import NestingTooDeep
from ..model._splice import dumps_spliced
from ..model._types import Api, TargetKind
from ..policies import KeepWarmDecision
from ..session import Turn
from ._boundary import BodyTimeout
from ._caller import client_of, header_value, identity_of, tenant_of
from ._errors import Style, style_for
from ._exchange import (
    BadJSON,
    BodyTooLarge,
    Exchange,
    Refused,
    count_response,
    guarded,
    limited,
    over_limit,
    read_body,
)
from ._exchange import refused as refused_answer
from ._finish import finish
from ._forward import StreamOutcome, UpstreamResponse, UsageTap, request_headers, with_raw_headers
from ._state import ProxyState
from ._trace import tracing_sink
from ._transport import ONE_WRITE

__all__ = ["handle_api", "read_body", "relay"]

log = get_logger("agentcache.proxy")


async def handle_api(state: ProxyState, request: Request, api: str, route: str) -> Response:
    """Serve one pipeline route (see the module docstring)."""
    if request.headers.get("content-encoding", "identity").strip().lower() != "identity":
        return await relay(state, request)  # a compressed body: relayed untouched (within the limit)
    ex = _exchange(state, request, Api(api), route)
    try:
        ex.raw = ex.content = await read_body(request, state.config.max_body_bytes)
        await guarded(ex, "parse", None, lambda: _parse(ex))
    except (Refused, BodyTimeout) as exc:
        return refused_answer(state, route, ex.provider, ex.style, exc)
    if ex.is_object:
        await _begin(ex)
    req = _upstream_request(ex)
    if ex.turn is not None:
        ex.ticket = await guarded(ex, "coalesce", None, partial(state.sessions.claim, ex.turn))
    upstream = await _send(ex, req)
    if isinstance(upstream, Response):
        return _unavailable(ex, upstream)
    ok = 200 <= upstream.status_code < 300
    none: list[tuple[bytes, bytes]] = []
    extra = await guarded(ex, "respond", none, lambda: _respond(ex, upstream, ok, str(req.url)))
    if ex.ticket is not None and not ok:
        ex.ticket.release()  # a refused request wrote nothing
    return UpstreamResponse(
        upstream,
        started=ex.started,
        tap=ex.tap,
        extra_headers=extra,
        on_done=partial(finish, ex, upstream.status_code, req.url),
        on_error=state.response_failed,
        on_first_byte=ex.ticket.first_byte if ex.ticket is not None and ok else None,
    )


def _exchange(state: ProxyState, request: Request, wire: Api, route: str) -> Exchange:
    """A new exchange for ``request`` on ``route``: its error style, provider, tenant and client."""
    style: Style = wire_for(wire).error_style
    tenant, client = tenant_of(request.headers, state.config.tenant_salt), client_of(request.headers)
    return Exchange(state, request, wire, route, style, str(wire.provider), tenant, client)


def _parse(ex: Exchange) -> None:
    """Parse the body (with its source texts); raises :class:`BadJSON` for a body that is no JSON text. Valid JSON
    that is no object (``[1,2]``, ``"x"``, ``5``, ``null``) is the upstream's to judge: forwarded as is."""
    try:
        parsed, ex.texts = ex.state.parse_memo.loads(ex.raw, hint=ex.tenant)
    except NestingTooDeep:
        raise  # forwarded as sent: the upstream judges a body this deep
    except ValueError as exc:  # UnicodeDecodeError and InputError included
        raise BadJSON(f"request body is not valid JSON: {exc}") from exc
    if isinstance(parsed, dict):
        ex.body, ex.is_object = parsed, True
        model = parsed.get("model")
        ex.model = model if isinstance(model, str) else ""


async def _begin(ex: Exchange) -> None:
    """Begin the turn and write the prepared body; the client's bytes (untracked, or the turn as the client's own
    body) wherever a step fails."""
    ex.now = time.time()
    ex.turn = await guarded(ex, "prepare", None, lambda: _abegin(ex))
    if ex.turn is None:
        return
    ex.content = await guarded(ex, "prepare", ex.raw, lambda: _write(ex))
    if ex.content is ex.raw and ex.turn.body is not ex.body:  # the prepared body could not be written
        ex.turn = await guarded(ex, "prepare", None, lambda: _original(ex))


async def _abegin(ex: Exchange) -> Turn:
    state = ex.state
    identity = identity_of(ex.api, ex.request.headers, ex.body, ex.tenant)
    call = state.sessions.abegin(
        ex.api, ex.body, identity=identity, now=ex.now, raw=ex.texts, base_url=state.config.upstream_url,
        target=state.target_for(ex.api), size=len(ex.raw),
    )  # fmt: skip
    return await state.store_call(call)


def _write(ex: Exchange) -> bytes:
    """The bytes to send for the begun turn; cancels the session's keep-warm (the session moved on)."""
    assert ex.turn is not None
    ex.state.keep_warm.cancel(f"{ex.tenant}/{ex.turn.session.session_id}")
    return dumps_spliced(ex.turn.body, ex.texts) if ex.turn.body is not ex.body else ex.raw


def _original(ex: Exchange) -> Turn:
    """The turn as the client's own body, sent unchanged."""
    assert ex.turn is not None
    ex.turn.send_original(ex.body)
    return ex.turn


def _upstream_request(ex: Exchange) -> httpx.Request:
    """The request to the upstream: the client's headers (with the turn's planned ones) and the content."""
    ex.headers = request_headers(ex.request.headers.raw, pipeline=True)
    if ex.turn is not None and ex.turn.prepared.headers:  # planned headers (provider diagnostics' beta header)
        ex.headers = with_raw_headers(ex.headers, ex.turn.prepared.headers)
    state = ex.state
    return state.client.build_request(ex.request.method, state.url(ex.request), headers=ex.headers, content=ex.content)


async def _send(ex: Exchange, req: httpx.Request) -> httpx.Response | Response:
    """Wait for a sibling writing this prefix (the ticket is held), then send; the ticket is released when the
    request is cancelled (the client went away)."""
    try:
        if ex.ticket is not None and ex.ticket.held:
            await ex.ticket.wait()
        ex.started = time.perf_counter()
        upstream = await ex.state.send(req, ex.route, ex.style)
    except BaseException:
        if ex.ticket is not None:
            ex.ticket.release()
        raise
    if ex.turn is not None:
        ex.turn.mark_sent()
        ex.provider = ex.turn.session.provider or ex.provider
    if not isinstance(upstream, Response):
        ex.state.metrics.ttfb.labels(ex.route).observe(time.perf_counter() - ex.started)
    return upstream


def _unavailable(ex: Exchange, upstream: Response) -> Response:
    """No answer from the upstream (``upstream``: agentcache's 502/504): the turn failed; the request's one line,
    as for an answered one (the upstream's failure is logged apart)."""
    if ex.ticket is not None:
        ex.ticket.release()
    if ex.turn is not None:
        ex.turn.fail(f"upstream_{upstream.status_code}")
    ex.state.count_request(ex.route, ex.provider, ex.model, "error")
    log.info(
        "proxy.request",
        route=ex.route,
        status=upstream.status_code,
        outcome="upstream_unavailable",
        latency_ms=round((time.perf_counter() - ex.started) * 1000, 3),
        session_id=ex.turn.session.session_id if ex.turn is not None else None,
    )
    return upstream


async def _respond(ex: Exchange, upstream: httpx.Response, ok: bool, url: str) -> list[tuple[bytes, bytes]]:
    """The upstream answered: commit (2xx) or fail the turn, keep-warm, the usage tap, a requested close; returns
    agentcache's response headers."""
    extra: list[tuple[bytes, bytes]] = []
    turn = ex.turn
    if turn is not None:
        if not ok:
            turn.fail(f"http_{upstream.status_code}")
        elif await guarded(ex, "commit", False, lambda: _commit(ex)) and ex.state.settings.keep_warm:
            ex.warm = await guarded(ex, "keep_warm", None, lambda: _keep_warm(ex, url))
        extra = [
            (b"x-agentcache-session", header_value(turn.session.session_id)),
            (b"x-agentcache-generation", str(turn.generation).encode()),
        ]
    if ok:
        ex.tap = UsageTap(str(ex.api), upstream.headers.get("content-type", ""),
                          upstream.headers.get("content-encoding", ""))  # fmt: skip
    ex.close_after = ex.request.headers.get("x-agentcache-close", "").strip().lower() in ("1", "true", "yes")
    return extra


async def _commit(ex: Exchange) -> bool:
    """Commit the turn (True: recorded); a stale one is counted and logged. A commit that broke before the store
    answered leaves the turn uncommitted."""
    turn = ex.turn
    assert turn is not None
    try:
        ok = await ex.state.store_call(turn.acommit())
    finally:
        if turn.committed is None and not turn.done:
            turn.settle(False)
    if not ok:
        ex.state.metrics.stale.inc()
        log.info("proxy.stale_response", session_id=turn.session.session_id, generation=turn.generation)
    return bool(turn.committed)


def _keep_warm(ex: Exchange, url: str) -> KeepWarmDecision | None:
    """After a committed Anthropic turn, schedule keep-warm requests to ``url`` when the TTL policy says they pay;
    the decision (None when there was none to make)."""
    assert ex.turn is not None
    sess = ex.turn.session
    if not wire_for(ex.turn.api).keeps_warm or sess.target is None or sess.target.kind != TargetKind.ANTHROPIC:
        return None  # a local engine has no TTL to bridge
    decision = sess.pipeline.keep_warm()
    body = sess.pipeline.keep_warm_body()
    if decision is None or body is None:
        return None
    generation, turns = sess.generation, sess.turns

    def current() -> bool:
        return not sess.closed and sess.generation == generation and sess.turns == turns

    ex.state.keep_warm.schedule(f"{ex.tenant}/{sess.session_id}", decision, url, ex.headers, body, current)
    return decision


async def relay(state: ProxyState, request: Request, route: str = "passthrough") -> Response:
    """Relay a non-pipeline request untouched (at most ``max_body_bytes``: 413 beyond, 408 when the client stops
    sending, in the caller's error format), and its response chunk by chunk. A body declared at most
    :data:`~agentcache.proxy._transport.ONE_WRITE` bytes is read whole, then sent in one write with the headers
    (it arrives in one or two reads anyway); a larger or chunked one is streamed as it comes. ``route``: the metric
    label."""
    style = style_for(request.url.path, state.config.upstream_kind, request.headers)
    provider, limit = state.config.upstream_kind, state.config.max_body_bytes
    declared = request.headers.get("content-length", "")
    headers = request_headers(request.headers.raw, pipeline=False)
    started = time.perf_counter()
    try:
        if over_limit(request, limit):
            raise BodyTooLarge
        content: bytes | AsyncIterator[bytes] | None = None
        if declared.isdigit() and int(declared) <= ONE_WRITE:
            content = await read_body(request, limit)
        elif declared or "transfer-encoding" in request.headers:
            content = limited(request.stream(), limit)
        req = state.client.build_request(request.method, state.url(request), headers=headers, content=content)
        upstream = await state.send(req, route, style)
    except (BodyTooLarge, BodyTimeout) as exc:  # over the limit, or the client stopped sending: the upstream got no
        return refused_answer(state, route, provider, style, exc)  # complete request
    if isinstance(upstream, Response):
        state.count_request(route, provider, "", "error")
        return upstream
    state.metrics.ttfb.labels(route).observe(time.perf_counter() - started)
    done = partial(_relayed, state, request, route, upstream.status_code, started)
    return UpstreamResponse(upstream, started=started, on_done=done, on_error=state.response_failed)


async def _relayed(
    state: ProxyState, request: Request, route: str, status: int, started: float, outcome: StreamOutcome
) -> None:
    """After a relayed response's last byte: a span (setting otel), metrics and a debug line."""
    latency = count_response(state, route, state.config.upstream_kind, "", status, outcome, started)
    if (tracer := tracing_sink(state.sessions.sinks)) is not None:  # never raises
        tracer.relayed(request.method, route, status, time.time(), latency)
    log.debug(
        "proxy.passthrough",
        method=request.method,
        path=request.url.path,
        status=status,
        outcome=outcome.status,
        latency_ms=round(latency * 1000, 3),
    )
