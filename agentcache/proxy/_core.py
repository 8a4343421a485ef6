"""The proxy's request path for the three pipeline routes, and session lifecycle over HTTP.

For ``/v1/messages``, ``/v1/chat/completions`` and ``/v1/responses``: read the body (413 over the limit, 400 for
malformed JSON, in the caller's error format; valid JSON that is no object is forwarded unchanged, the
upstream's to judge) → the session core (:meth:`agentcache.Sessions.abegin`: identity
from headers and body, the session's target, one pipeline pass) → forward the prepared body → on a 2xx answer
commit the turn → relay the response, reading usage on the way → after the last byte, :meth:`Turn.finish` (the
turn report and event: metrics), the live report and one log line with the four fields. Any failure of
agentcache's own (including an unreachable shared store) sends the client's original bytes upstream unchanged
and is logged and counted (fail open); once the upstream has answered, nothing of agentcache's may lose the
answer (its own headers are valid field values, and one that is not would be left out, see
:class:`~agentcache.proxy._forward.UpstreamResponse`). Every request is counted once, under the status the
client got. Relayed paths stream the body both ways, also within ``max_body_bytes``. With ``--record``, each
answered pipeline request is queued as one line after its last byte (:mod:`agentcache.proxy._record`).
"""

from __future__ import annotations

import time
from collections.abc import AsyncIterator
from typing import Any

from starlette.requests import Request
from starlette.responses import Response

from .._exceptions import InputError
from .._log import enabled, get_logger
from ..model._fields import TurnReport
from ..model._rawjson import NestingTooDeep
from ..model._splice import dumps_spliced
from ..model._types import Api, TargetKind
from ..model._usage import CacheUsage
from ..policies import KeepWarmDecision
from ..session import Turn
from ..session._coalesce import Ticket
from ._boundary import BodyTimeout
from ._errors import Style, style_for
from ._forward import StreamOutcome, UpstreamResponse, UsageTap, request_headers, with_raw_headers
from ._record import exchange_of
from ._sessions import client_of, header_value, identity_of, tenant_of
from ._state import ProxyState
from ._trace import tracing_sink

__all__ = ["handle_api", "read_body", "relay"]

log = get_logger("agentcache.proxy")


class BodyTooLarge(Exception):
    """The request body is over the configured limit."""


async def read_body(request: Request, limit: int) -> bytes:
    """The whole request body; raises :class:`BodyTooLarge` as soon as it exceeds ``limit`` bytes."""
    declared = request.headers.get("content-length", "")
    if declared.isdigit() and int(declared) > limit:
        raise BodyTooLarge
    buf = bytearray()
    async for chunk in request.stream():
        buf += chunk
        if len(buf) > limit:
            raise BodyTooLarge
    return bytes(buf)


async def handle_api(state: ProxyState, request: Request, api: str, route: str) -> Response:
    """Serve one pipeline route (see the module docstring)."""
    wire = Api(api)
    style: Style = "anthropic" if wire == Api.ANTHROPIC_MESSAGES else "openai"
    if request.headers.get("content-encoding", "identity").strip().lower() != "identity":
        return await relay(state, request)  # a compressed body: relayed untouched (within the limit)
    provider = str(wire.provider)
    limit = state.config.max_body_bytes
    try:
        raw = await read_body(request, limit)
    except BodyTooLarge:
        return state.own_error(route, provider, style, 413, f"request body exceeds {limit} bytes")
    except BodyTimeout as exc:
        return state.own_error(route, provider, style, 408, str(exc))
    parsed: Any = None
    texts: Any = None
    tenant, client = tenant_of(request.headers, state.config.tenant_salt), client_of(request.headers)
    try:
        parsed, texts = state.parse_memo.loads(raw, hint=tenant)
    except NestingTooDeep as exc:  # fail open: forwarded as sent, the upstream judges a body this deep
        log.info("proxy.unreadable_request", api=api, error=str(exc))
    except ValueError as exc:  # UnicodeDecodeError and InputError included
        return state.own_error(route, provider, style, 400, f"request body is not valid JSON: {exc}")
    except Exception as exc:  # our parser's own limit: the client's bytes go as they are
        state.fail_open("parse", exc)
    # Valid JSON that is no object (``[1,2]``, ``"x"``, ``5``, ``null``) is the upstream's to judge: forwarded as is.
    body: dict[str, Any] = parsed if isinstance(parsed, dict) else {}
    now = time.time()
    turn: Turn | None = None
    content = raw
    if isinstance(parsed, dict):
        try:
            identity = identity_of(wire, request.headers, body, tenant)
            turn = await state.store_call(
                state.sessions.abegin(
                    wire,
                    body,
                    identity=identity,
                    now=now,
                    raw=texts,
                    base_url=state.config.upstream_url,
                    target=state.target_for(wire),
                    size=len(raw),
                ),
            )
            state.keep_warm.cancel(f"{tenant}/{turn.session.session_id}")  # the session moved on: keep-warm is moot
            if turn.body is not body:
                content = dumps_spliced(turn.body, texts)
        except InputError as exc:  # the upstream is the judge of the request's validity
            log.info("proxy.unreadable_request", api=api, error=str(exc))
        except Exception as exc:
            state.fail_open("prepare", exc)
        if turn is not None and content is raw and turn.body is not body:
            turn = _original(state, turn, body)  # the prepared body could not be written: the turn is what goes out
    headers = request_headers(request.headers.raw, pipeline=True)
    if turn is not None and turn.prepared.headers:  # planned headers (provider diagnostics' beta header)
        headers = with_raw_headers(headers, turn.prepared.headers)
    req = state.client.build_request(request.method, state.url(request), headers=headers, content=content)
    ticket = _claim(state, turn)
    try:
        if ticket is not None and ticket.held:  # a sibling is writing this prefix: wait for its first byte
            await ticket.wait()
        started = time.perf_counter()
        upstream = await state.send(req, route, style)
    except BaseException:  # cancelled (the client went away): the requests held on this one go
        if ticket is not None:
            ticket.release()
        raise
    if turn is not None and turn.session.provider:
        provider = turn.session.provider
    model = body.get("model")
    model = model if isinstance(model, str) else ""
    if isinstance(upstream, Response):
        if ticket is not None:
            ticket.release()
        if turn is not None:
            turn.fail(f"upstream_{upstream.status_code}")
        state.count_request(route, provider, model, "error")
        log.info(  # the request's one line, as for an answered one (the upstream's failure is logged apart)
            "proxy.request",
            route=route,
            status=upstream.status_code,
            outcome="upstream_unavailable",
            latency_ms=round((time.perf_counter() - started) * 1000, 3),
            session_id=turn.session.session_id if turn is not None else None,
        )
        return upstream
    state.metrics.ttfb.labels(route).observe(time.perf_counter() - started)
    ok = 200 <= upstream.status_code < 300
    extra: list[tuple[bytes, bytes]] = []
    tap, warm = None, None
    close_after = False
    try:  # from here on the upstream has answered: nothing of ours may lose that answer
        if turn is not None:
            if ok:
                await _commit(state, turn)
                if turn.committed and state.settings.keep_warm:
                    warm = _keep_warm(state, turn, tenant, str(req.url), headers)
            else:
                turn.fail(f"http_{upstream.status_code}")
            extra = [
                (b"x-agentcache-session", header_value(turn.session.session_id)),
                (b"x-agentcache-generation", str(turn.generation).encode()),
            ]
        if ok:
            content_type = upstream.headers.get("content-type", "")
            tap = UsageTap(api, content_type, upstream.headers.get("content-encoding", ""))
        close_after = request.headers.get("x-agentcache-close", "").strip().lower() in ("1", "true", "yes")
    except Exception as exc:
        state.fail_open("respond", exc)
        extra = []

    if ticket is not None and not ok:
        ticket.release()  # a refused request wrote nothing

    async def done(outcome: StreamOutcome) -> None:
        if ticket is not None:
            ticket.release()
        await _finish(
            state, route, provider, model, turn, (tenant, client, warm), upstream.status_code, started, outcome,
            close_after, ticket,
        )  # fmt: skip
        if state.recorder is not None:  # after the last byte: the line never delays the response
            try:
                line = exchange_of(
                    turn, api=api, route=route, headers=request.headers, body=raw, sent=content, at=now,
                    status=upstream.status_code, url=req.url, started=started, outcome=outcome, tap=tap,
                )  # fmt: skip
                state.recorder.submit(line)
            except Exception as exc:
                state.fail_open("record", exc)

    return UpstreamResponse(
        upstream,
        started=started,
        tap=tap,
        extra_headers=extra,
        on_done=done,
        on_error=state.response_failed,
        on_first_byte=ticket.first_byte if ticket is not None and ok else None,
    )


def _original(state: ProxyState, turn: Turn, body: dict[str, Any]) -> Turn | None:
    """``turn`` as the client's own ``body``, sent unchanged; None (untracked) when even that fails."""
    try:
        turn.send_original(body)
        return turn
    except Exception as exc:
        state.fail_open("prepare", exc)
        return None


def _claim(state: ProxyState, turn: Turn | None) -> Ticket | None:
    """The coalescing ticket of a prepared ``turn`` (see :mod:`agentcache.session._coalesce`), or None."""
    if turn is None:
        return None
    try:
        return state.sessions.claim(turn)
    except Exception as exc:
        state.fail_open("coalesce", exc)
        return None


async def _commit(state: ProxyState, turn: Turn) -> None:
    try:
        ok = await state.store_call(turn.acommit())
    except Exception as exc:
        turn.committed = False
        state.fail_open("commit", exc)
        return
    if not ok:
        state.metrics.stale.inc()
        log.info("proxy.stale_response", session_id=turn.session.session_id, generation=turn.generation)


def _keep_warm(
    state: ProxyState, turn: Turn, tenant: str, url: str, headers: list[tuple[bytes, bytes]]
) -> KeepWarmDecision | None:
    """After a committed Anthropic turn, schedule keep-warm requests when the TTL policy says they pay; the
    decision (None when there was none to make)."""
    sess = turn.session
    if turn.api != Api.ANTHROPIC_MESSAGES or sess.target is None or sess.target.kind != TargetKind.ANTHROPIC:
        return None  # a local engine has no TTL to bridge
    try:
        decision = sess.pipeline.keep_warm()
        body = sess.pipeline.keep_warm_body()
        if decision is None or body is None:
            return None
        generation, turns = sess.generation, sess.turns

        def current() -> bool:
            return not sess.closed and sess.generation == generation and sess.turns == turns

        state.keep_warm.schedule(f"{tenant}/{sess.session_id}", decision, url, headers, body, current)
        return decision
    except Exception as exc:
        state.fail_open("keep_warm", exc)
        return None


async def _finish(
    state: ProxyState,
    route: str,
    provider: str,
    model: str,
    turn: Turn | None,
    who: tuple[str, str | None, KeepWarmDecision | None],
    status: int,
    started: float,
    outcome: StreamOutcome,
    close_after: bool,
    ticket: Ticket | None = None,
) -> None:
    """After the last byte: the turn report and event, metrics, live report, the request's log line, and a
    requested close. ``who``: the caller's tenant, its client (:func:`~._sessions.client_of`) and the turn's
    keep-warm decision."""
    tenant, client, warm = who
    hold = ticket.hold if ticket is not None else None
    try:
        latency = time.perf_counter() - started
        state.metrics.latency.labels(route).observe(latency)
        state.count_request(route, provider, model, outcome.counted_status(status))
        if outcome.status == "upstream_error":
            state.metrics.upstream_errors.labels(route, "stream_cut").inc()
        usage = outcome.usage
        if usage is not None and (turn is None or not turn.committed):  # a committed turn's: from its event
            state.count_usage(provider, model, usage, "untracked" if turn is None else "uncommitted")
        logged = enabled("agentcache.proxy")  # the line's fields are built only when it is written
        fields: dict[str, Any] = {}
        if turn is not None:
            report = (
                turn.finish(usage, duration=latency, cut=outcome.status == "upstream_error") if turn.committed else None
            )
            if logged:
                fields = _turn_fields(turn, report or turn.report(usage, latency), tenant, usage)
            if report is not None:
                state.report.record(f"{tenant}/{turn.session.session_id}", tenant, turn, usage, client, warm, hold)
                if close_after:
                    await state.close(tenant, turn.session.session_id, "closed")
        if logged:
            _log_request(route, status, outcome, latency, fields, ticket)
    except Exception as exc:  # reporting never breaks the request path
        state.fail_open("report", exc)


def _log_request(
    route: str, status: int, outcome: StreamOutcome, latency: float, fields: dict[str, Any], ticket: Ticket | None
) -> None:
    """The request's one ``proxy.request`` line: ``fields`` (the turn's, :func:`_turn_fields`), the coalescer's hold,
    and how the response went (``latency`` in seconds, logged in ms)."""
    hold = ticket.hold if ticket is not None else None
    if hold is not None:
        fields["coalesce"] = {
            "outcome": hold.outcome,
            "hold_ms": round(hold.waited_s * 1000, 3),
            "saved_write_tokens": hold.saved_tokens,
        }
    log.info(
        "proxy.request",
        route=route,
        status=status,
        outcome=outcome.status,
        error=outcome.error,
        bytes=outcome.bytes,
        latency_ms=round(latency * 1000, 3),
        first_byte_ms=None if outcome.first_byte_s is None else round(outcome.first_byte_s * 1000, 3),
        **fields,
    )


def _turn_fields(turn: Turn, report: TurnReport, tenant: str, usage: CacheUsage | None) -> dict[str, Any]:
    """The four fields (and usage, cost, repairs) of a turn's ``report``, for its log line."""
    tier = _flat(report.storage_tier)
    tier["tiers"] = dict(report.storage_tier.tiers)
    return {
        "model": report.model,
        "prefix_identity": _flat(report.prefix_identity),
        "reuse_boundary": _flat(report.reuse_boundary),
        "session_signal": _flat(report.session_signal),
        "storage_tier": tier,
        "usage": usage.to_dict() if usage is not None else None,
        "cost_usd": report.cost_usd,
        "repairs": list(report.repairs),
        "markers": list(report.markers),
        "tenant": tenant,
        "committed": bool(turn.committed),
    }


def _flat(obj: Any) -> dict[str, Any]:
    """A flat dataclass as a dict (shallow: cheaper than ``asdict``)."""
    return {name: getattr(obj, name) for name in obj.__dataclass_fields__}


async def relay(state: ProxyState, request: Request, route: str = "passthrough") -> Response:
    """Relay a non-pipeline request untouched (body streamed, at most ``max_body_bytes``: 413 beyond, in the
    caller's error format), and its response chunk by chunk. ``route``: the metric label (``passthrough``, or
    the pipeline route of a compressed body)."""
    path = request.url.path
    style = style_for(path, state.config.upstream_kind, request.headers)
    provider = state.config.upstream_kind
    limit = state.config.max_body_bytes
    declared = request.headers.get("content-length", "")
    if declared.isdigit() and int(declared) > limit:
        return state.own_error(route, provider, style, 413, f"request body exceeds {limit} bytes")
    headers = request_headers(request.headers.raw, pipeline=False)
    has_body = "content-length" in request.headers or "transfer-encoding" in request.headers
    content = limited(request.stream(), limit) if has_body else None
    req = state.client.build_request(request.method, state.url(request), headers=headers, content=content)
    started = time.perf_counter()
    try:
        upstream = await state.send(req, route, style)
    except BodyTooLarge:  # a chunked body that grew past the limit: the upstream got no complete request
        return state.own_error(route, provider, style, 413, f"request body exceeds {limit} bytes")
    except BodyTimeout as exc:  # the client stopped sending its body: the upstream got no complete request
        return state.own_error(route, provider, style, 408, str(exc))
    if isinstance(upstream, Response):
        state.count_request(route, provider, "", "error")
        return upstream
    state.metrics.ttfb.labels(route).observe(time.perf_counter() - started)
    status = upstream.status_code

    async def done(outcome: StreamOutcome) -> None:
        latency = time.perf_counter() - started
        if (tracer := tracing_sink(state.sessions.sinks)) is not None:  # setting otel: a span (never raises)
            tracer.relayed(request.method, route, status, time.time(), latency)
        state.metrics.latency.labels(route).observe(latency)
        state.count_request(route, provider, "", outcome.counted_status(status))
        if outcome.status == "upstream_error":
            state.metrics.upstream_errors.labels(route, "stream_cut").inc()
        log.debug(
            "proxy.passthrough",
            method=request.method,
            path=path,
            status=status,
            outcome=outcome.status,
            latency_ms=round(latency * 1000, 3),
        )

    return UpstreamResponse(upstream, started=started, on_done=done, on_error=state.response_failed)


async def limited(stream: AsyncIterator[bytes], limit: int) -> AsyncIterator[bytes]:
    """``stream``'s chunks as they come; raises :class:`BodyTooLarge` once more than ``limit`` bytes passed."""
    total = 0
    async for chunk in stream:
        total += len(chunk)
        if total > limit:
            raise BodyTooLarge
        yield chunk
