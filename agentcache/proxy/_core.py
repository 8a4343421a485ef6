"""The proxy's request path for the three pipeline routes, and session lifecycle over HTTP.

For ``/v1/messages``, ``/v1/chat/completions`` and ``/v1/responses``: read the body (413 over the limit, 400
for malformed JSON, in the caller's error format) → find the session (:mod:`._sessions`) → run the session's
:class:`~agentcache.session._pipeline.SessionPipeline` → forward the prepared body → on a 2xx answer commit the
request to the session → relay the response, reading usage on the way → after the last byte, metrics, the
live report and one log line with the four fields. Any failure of agentcache's own (including an unreachable
shared store) sends the client's original bytes upstream unchanged and is logged and counted (fail open).
"""

from __future__ import annotations

import time
from dataclasses import dataclass
from typing import Any

from starlette.requests import Request
from starlette.responses import Response

from .._exceptions import InputError
from .._log import get_logger
from ..analysis._diagnose import diagnose
from ..model._canonical import CanonicalRequest, common_prefix
from ..model._fields import LifecycleEvent, PrefixIdentity, ReuseBoundary, SessionSignal, StorageTier, TurnReport
from ..model._rawjson import RawBody, dumps_spliced, loads
from ..model._usage import CacheUsage, cost_usd
from ..session._lifecycle import emit
from ..session._pipeline import Prepared
from ..session._sinks import SGLangSink
from ..session._turn import Saved, learning, restore
from ._errors import Style, error_response, style_for
from ._forward import StreamOutcome, UpstreamResponse, UsageTap, request_headers
from ._sessions import STATE_BYTES_PER_BODY_BYTE, LiveSession, checkpoints_of, new_session_id, tenant_of
from ._state import ProxyState

__all__ = ["Turn", "handle_api", "read_body", "relay"]

log = get_logger("agentcache.proxy")
_MAX_SESSION_ID = 256


@dataclass(slots=True)
class Turn:
    """One pipeline request in flight: its session, the pipeline's decision and what was sent."""

    api: str
    tenant: str
    session: LiveSession
    generation: int
    signal: SessionSignal
    prepared: Prepared
    client_body: dict[str, Any]
    checkpoints: tuple[bytes, ...]
    prev_sent: CanonicalRequest | None
    wire: dict[str, Any]
    saved: Saved
    close_after: bool = False
    committed: bool = False
    size: int = 0


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
    style: Style = "anthropic" if api == "anthropic.messages" else "openai"
    if request.headers.get("content-encoding", "identity").strip().lower() != "identity":
        return await relay(state, request)  # a compressed body: relayed untouched
    try:
        raw = await read_body(request, state.config.max_body_bytes)
    except BodyTooLarge:
        return error_response(style, 413, f"request body exceeds {state.config.max_body_bytes} bytes")
    try:
        body, texts = loads(raw)
    except (ValueError, UnicodeDecodeError) as exc:
        return error_response(style, 400, f"request body is not valid JSON: {exc}")
    if not isinstance(body, dict):
        return error_response(style, 400, "request body must be a JSON object")
    now = time.time()
    turn: Turn | None = None
    content = raw
    try:
        turn = await _prepare(state, request, api, body, texts, now)
        if turn.wire is not body:
            content = dumps_spliced(turn.wire, texts)
        turn.size = len(content) * STATE_BYTES_PER_BODY_BYTE
    except InputError as exc:  # the upstream is the judge of the request's validity
        log.info("proxy.unreadable_request", api=api, error=str(exc))
    except Exception as exc:
        state.fail_open("prepare", exc)
    headers = request_headers(request.headers.raw, pipeline=True)
    req = state.client.build_request(request.method, state.url(request), headers=headers, content=content)
    started = time.perf_counter()
    upstream = await state.send(req, route, style)
    if isinstance(upstream, Response):
        if turn is not None:
            _failed(state, turn, f"upstream_{upstream.status_code}")
        model = str(body.get("model") or "")
        state.count_request(route, state.config.provider_for(api), model, "error")
        return upstream
    state.metrics.ttfb.labels(route).observe(time.perf_counter() - started)
    ok = 200 <= upstream.status_code < 300
    extra: list[tuple[bytes, bytes]] = []
    if turn is not None:
        if ok:
            await _commit(state, turn)
            if turn.committed and state.settings.keep_warm:
                _keep_warm(state, turn, str(req.url), headers)
        else:
            _failed(state, turn, f"http_{upstream.status_code}")
        extra = [
            (b"x-agentcache-session", turn.session.sid.encode("latin-1", "replace")),
            (b"x-agentcache-generation", str(turn.generation).encode()),
        ]
    tap = None
    if ok:
        tap = UsageTap(api, upstream.headers.get("content-type", ""), upstream.headers.get("content-encoding", ""))

    async def done(outcome: StreamOutcome) -> None:
        await _finish(state, api, route, body, turn, upstream.status_code, started, outcome)

    return UpstreamResponse(upstream, started=started, tap=tap, extra_headers=extra, on_done=done)


async def _prepare(
    state: ProxyState, request: Request, api: str, body: dict[str, Any], texts: RawBody | None, now: float
) -> Turn:
    headers = request.headers
    tenant = tenant_of(headers, state.config.tenant_salt)
    sid = (headers.get("x-agentcache-session") or "").strip()[:_MAX_SESSION_ID]
    parent = (headers.get("x-agentcache-parent") or "").strip()[:_MAX_SESSION_ID] or None
    key = body.get("prompt_cache_key")
    if not sid and api != "anthropic.messages" and isinstance(key, str) and key:
        sid = key[:_MAX_SESSION_ID]
    cps: tuple[bytes, ...] = ()
    explicit = bool(sid)
    if not explicit:
        cps = checkpoints_of(api, body, texts)
        found: str | None = await state.store_call("find", state.store.find(tenant, cps))
        sid = found or new_session_id()
    provider = state.config.provider_for(api)
    opened = await state.store_call(
        "open", state.store.open(tenant, sid, parent=parent, provider=provider, explicit=explicit, now=now)
    )
    sess = opened.session
    state.keep_warm.cancel(f"{tenant}/{sess.sid}")  # the session moved on: a pending keep-warm is moot
    for old in opened.evicted:
        await state.closed(old, "evicted")
    if opened.reason is not None:
        emit(LifecycleEvent("open", sess.signal(), now, opened.reason), state.sinks)
    saved = learning(sess.pipe)
    prev_sent = sess.pipe.memory.sent
    prepared = sess.pipe.prepare(api, body, now=now, raw=texts)
    signal = sess.signal()
    wire = prepared.body
    if state.config.engine == "sglang":
        wire = {**wire, "session_id": SGLangSink.sglang_id(signal)}
    close_after = headers.get("x-agentcache-close", "").strip().lower() in ("1", "true", "yes")
    return Turn(api, tenant, sess, sess.generation, signal, prepared, body, cps, prev_sent, wire, saved, close_after)


async def _commit(state: ProxyState, turn: Turn) -> None:
    sess = turn.session
    try:
        if sess.generation != turn.generation:
            ok = False
        else:
            ok = await state.store_call(
                "commit", state.store.commit(sess, turn.prepared, turn.client_body, turn.checkpoints, turn.size)
            )
    except Exception as exc:
        state.fail_open("commit", exc)
        return
    turn.committed = ok
    if ok:
        sess.attempts = 0
    else:
        state.metrics.stale.inc()
        log.info("proxy.stale_response", session_id=sess.sid, generation=turn.generation)


def _keep_warm(state: ProxyState, turn: Turn, url: str, headers: list[tuple[bytes, bytes]]) -> None:
    """After a committed Anthropic turn, schedule keep-warm requests when the TTL policy says they pay."""
    if turn.api != "anthropic.messages" or state.config.engine != "none":
        return  # a local engine (--engine) has no TTL to bridge
    try:
        sess = turn.session
        decision = sess.pipe.keep_warm()
        body = sess.pipe.keep_warm_body()
        if decision is None or body is None:
            return
        generation, turns = sess.generation, sess.turns

        def current() -> bool:
            return not sess.closed and sess.generation == generation and sess.turns == turns

        state.keep_warm.schedule(f"{turn.tenant}/{sess.sid}", decision, url, headers, body, current)
    except Exception as exc:
        state.fail_open("keep_warm", exc)


def _failed(state: ProxyState, turn: Turn, reason: str) -> None:
    """The upstream did not accept the request: nothing is committed, the pipeline's learned hints are put
    back, and the session records a retry (``attempt`` + 1, same generation)."""
    sess = turn.session
    if sess.closed or sess.generation != turn.generation:
        return
    restore(sess.pipe, turn.saved)
    sess.attempts += 1
    emit(LifecycleEvent("retry", sess.signal(), time.time(), reason), state.sinks)


def _tier(state: ProxyState, turn: Turn, usage: CacheUsage | None) -> StorageTier:
    tiers = dict(usage.tiers) if usage is not None else {}
    if state.config.upstream_kind == "url":
        return StorageTier("engine", None, tiers)
    if turn.prepared.ttl is not None:
        return StorageTier("provider", turn.prepared.ttl.ttl, tiers)
    return StorageTier("provider", turn.prepared.planned.retention or "in_memory", tiers)


async def _finish(
    state: ProxyState,
    api: str,
    route: str,
    body: dict[str, Any],
    turn: Turn | None,
    status: int,
    started: float,
    outcome: StreamOutcome,
) -> None:
    """After the last byte: metrics, live report, the request's log line, and a requested close."""
    try:
        latency = time.perf_counter() - started
        provider = state.config.provider_for(api)
        model = str(body.get("model") or "")
        state.metrics.latency.labels(route).observe(latency)
        state.count_request(route, provider, model, str(status))
        if outcome.status == "upstream_error":
            state.metrics.upstream_errors.labels(route, "stream_cut").inc()
        usage = outcome.usage
        if usage is not None:
            state.count_usage(provider, model, usage)
        fields: dict[str, Any] = {}
        if turn is not None:
            fields = _turn_fields(state, turn, usage, latency)
            if turn.committed:
                sess = turn.session
                repaired = None
                div = turn.prepared.divergence
                if div is not None and div.cause is not None and turn.prev_sent is not None:
                    repaired = not diagnose(turn.prev_sent, turn.prepared.planned).is_break
                key = f"{turn.tenant}/{sess.sid}"
                state.report.record(key, turn.tenant, provider, sess.turns - 1, turn.prepared, usage, repaired)
            if turn.close_after and turn.committed:
                await state.close(turn.tenant, turn.session.sid, "closed")
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
    except Exception as exc:  # reporting never breaks the request path
        state.fail_open("report", exc)


def _turn_fields(state: ProxyState, turn: Turn, usage: CacheUsage | None, latency: float) -> dict[str, Any]:
    """The four fields (and usage, cost, repairs) of a turn, for its log line and the turn sink."""
    planned = turn.prepared.planned
    shared = common_prefix(turn.prev_sent, planned) if turn.prev_sent is not None else 0
    div = turn.prepared.divergence
    boundary = ReuseBoundary(
        shared,
        planned.tokens_before(shared),
        usage.cache_read_tokens if usage is not None else None,
        div.cause if div is not None else None,
        div.first_divergent if div is not None else None,
        div.tokens_lost if div is not None else 0,
    )
    provider = state.config.provider_for(turn.api)
    cost = cost_usd(usage, provider, planned.model) if usage is not None else None
    report = TurnReport(
        turn.api,
        planned.model,
        PrefixIdentity.of(planned),
        boundary,
        turn.signal,
        _tier(state, turn, usage),
        usage,
        cost,
        turn.prepared.repairs,
        turn.prepared.markers,
        latency,
    )
    if turn.committed:
        state.metrics.sink(LifecycleEvent("turn", turn.signal, time.time(), None, report=report))
    tier = _flat(report.storage_tier)
    tier["tiers"] = dict(report.storage_tier.tiers)
    return {
        "model": report.model,
        "prefix_identity": _flat(report.prefix_identity),
        "reuse_boundary": _flat(report.reuse_boundary),
        "session_signal": _flat(report.session_signal),
        "storage_tier": tier,
        "usage": usage.to_dict() if usage is not None else None,
        "cost_usd": cost,
        "repairs": list(report.repairs),
        "markers": list(report.markers),
        "tenant": turn.tenant,
        "committed": turn.committed,
    }


def _flat(obj: Any) -> dict[str, Any]:
    """A flat dataclass as a dict (shallow: cheaper than ``asdict``)."""
    return {name: getattr(obj, name) for name in obj.__dataclass_fields__}


async def relay(state: ProxyState, request: Request) -> Response:
    """Relay a non-pipeline request untouched (body streamed), and its response chunk by chunk."""
    path = request.url.path
    style = style_for(path, state.config.upstream_kind)
    headers = request_headers(request.headers.raw, pipeline=False)
    has_body = "content-length" in request.headers or "transfer-encoding" in request.headers
    content = request.stream() if has_body else None
    req = state.client.build_request(request.method, state.url(request), headers=headers, content=content)
    started = time.perf_counter()
    upstream = await state.send(req, "passthrough", style)
    if isinstance(upstream, Response):
        state.metrics.requests.labels("passthrough", state.config.upstream_kind, "other", "error").inc()
        return upstream
    state.metrics.ttfb.labels("passthrough").observe(time.perf_counter() - started)
    status = upstream.status_code

    async def done(outcome: StreamOutcome) -> None:
        latency = time.perf_counter() - started
        state.metrics.latency.labels("passthrough").observe(latency)
        state.metrics.requests.labels("passthrough", state.config.upstream_kind, "other", str(status)).inc()
        if outcome.status == "upstream_error":
            state.metrics.upstream_errors.labels("passthrough", "stream_cut").inc()
        log.debug(
            "proxy.passthrough",
            method=request.method,
            path=path,
            status=status,
            outcome=outcome.status,
            latency_ms=round(latency * 1000, 3),
        )

    return UpstreamResponse(upstream, started=started, on_done=done)
