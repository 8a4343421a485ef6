"""After a pipeline request's last byte (:func:`finish`): the turn report and event, metrics, the live report,
the request's one ``proxy.request`` log line (with ``miss``, the live report's miss of what agentcache sent, beside
the break's ``reuse_boundary.cause``), a requested close, and the recorded exchange (``--record``). Runs
behind the fail-open boundary: reporting never breaks the request path, and the line never delays the response.
"""

from __future__ import annotations

from typing import Any

import httpx

from .._log import enabled, get_logger
from ..model._fields import TurnReport
from ..model._usage import CacheUsage
from ..session import Turn
from ..session._coalesce import Ticket
from ._exchange import Exchange, count_response, guarded
from ._forward import StreamOutcome
from ._record import exchange_of

__all__ = ["finish"]

log = get_logger("agentcache.proxy")


async def finish(ex: Exchange, status: int, url: httpx.URL, outcome: StreamOutcome) -> None:
    """After the last byte of the upstream's answer (``status``, sent to ``url``): release the coalescing ticket,
    report (:func:`_report`) and record the exchange, each behind the fail-open boundary."""
    if ex.ticket is not None:
        ex.ticket.release()
    await guarded(ex, "report", None, lambda: _report(ex, status, outcome))
    recorder = ex.state.recorder
    if recorder is not None:  # after the last byte: the line never delays the response
        await guarded(ex, "record", None, lambda: recorder.submit(_exchange_line(ex, status, url, outcome)))


def _exchange_line(ex: Exchange, status: int, url: httpx.URL, outcome: StreamOutcome) -> Any:
    return exchange_of(
        ex.turn, api=str(ex.api), route=ex.route, headers=ex.request.headers, body=ex.raw, sent=ex.content,
        at=ex.now, status=status, url=url, started=ex.started, outcome=outcome, tap=ex.tap,
    )  # fmt: skip


async def _report(ex: Exchange, status: int, outcome: StreamOutcome) -> None:
    """The turn report and event, metrics, live report, the request's log line, and a requested close."""
    state, turn = ex.state, ex.turn
    hold = ex.ticket.hold if ex.ticket is not None else None
    latency = count_response(state, ex.route, ex.provider, ex.model, status, outcome, ex.started)
    usage = outcome.usage
    if usage is not None and (turn is None or not turn.committed):  # a committed turn's: from its event
        state.count_usage(ex.provider, ex.model, usage, "untracked" if turn is None else "uncommitted")
    logged = enabled("agentcache.proxy")  # the line's fields are built only when it is written
    fields: dict[str, Any] = {}
    if turn is not None:
        report = (
            turn.finish(usage, duration=latency, cut=outcome.status == "upstream_error") if turn.committed else None
        )
        miss = None
        if report is not None:
            miss = state.report.record(f"{ex.tenant}/{turn.session.session_id}", ex.tenant, turn, usage, ex.client,
                                       ex.warm, hold)  # fmt: skip
        if logged:
            fields = _turn_fields(turn, report or turn.report(usage, latency), ex.tenant, usage)
            if miss is not None:  # the live report's diagnosis of what was sent: a miss is not a break
                fields["miss"] = {"cause": str(miss.cause), "tokens_lost": miss.tokens_lost, "where": miss.where}
        if report is not None and ex.close_after:
            await state.close(ex.tenant, turn.session.session_id, "closed")
    if logged:
        _log_request(ex.route, status, outcome, latency, fields, ex.ticket)


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
