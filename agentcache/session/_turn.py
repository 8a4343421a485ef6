"""One request in flight: :class:`Turn`, and the turn report every door builds the same way.

:meth:`agentcache.Session.begin` prepares a request and returns a :class:`Turn` carrying the wire body to send.
A turn owns its state (:class:`TurnState`): ``prepared`` → ``sent`` → ``committed`` or ``failed`` → ``finished``.
In every door:

* the door sends the body (:meth:`Turn.mark_sent`, optional: a commit implies it);
* the upstream accepted it (a 2xx answer; the SDK returned): :meth:`Turn.commit` records it as sent. It is
  refused (returns False, changes nothing, the turn is finished) when the turn is stale: its session was closed
  or restarted, or another turn of it was committed since (a late response never changes state);
* the upstream refused it or the call failed before any answer: :meth:`Turn.fail` records a retry (``attempt``
  + 1, same generation, ``retry`` event); nothing is committed;
* after the last byte: :meth:`Turn.finish` builds the :class:`~agentcache.TurnReport` with the reported usage,
  adds the usage to the session's and lineage's totals and emits the ``turn`` event (committed turns only). A
  response cut after it was accepted stays committed (the prompt was processed and cached) and also counts a
  retry (``cut=True``): the client will send the turn again.

:meth:`Turn.succeed` is commit + finish for a response that arrives whole. Repeating a step is harmless (a second
commit returns the first one's answer); a step out of order raises :class:`TurnStateError` (a door's bug:
committing a failed turn, failing a committed one, finishing one that was neither committed nor failed).
"""

from __future__ import annotations

import time
from enum import StrEnum
from typing import TYPE_CHECKING, Any

from ..analysis._diagnose import diagnose
from ..model._canonical import CanonicalRequest, common_prefix
from ..model._fields import (
    BYTES_ESTIMATE,
    ENGINE_TOKENIZER,
    PROVIDER_TOKENIZER,
    TIKTOKEN_ESTIMATE,
    PrefixIdentity,
    ReuseBoundary,
    SessionSignal,
    TurnReport,
)
from ..model._provider import ProviderDiagnosis, ProviderMiss, compare
from ..model._tokens import default_counter
from ..model._types import Api, TargetKind
from ..model._usage import CacheUsage
from ._identity import NO_CHECKPOINTS, Checkpoints

if TYPE_CHECKING:
    from ._pipeline import Prepared
    from ._session import Session

__all__ = ["Turn", "TurnState", "TurnStateError", "build_report"]


class TurnState(StrEnum):
    """Where a :class:`Turn` is: ``prepared`` (built, not sent), ``sent``, ``committed`` (accepted, recorded),
    ``failed`` (refused or broken before an answer) and ``finished`` (reported, or refused as stale)."""

    PREPARED = "prepared"
    SENT = "sent"
    COMMITTED = "committed"
    FAILED = "failed"
    FINISHED = "finished"


class TurnStateError(RuntimeError):
    """A :class:`Turn` step out of order (the message names the step and the turn's state)."""


_OPEN = (TurnState.PREPARED, TurnState.SENT)


class Turn:
    """One request in flight (see the module docstring). ``body``: the wire body to send. ``signal``: the
    session signal it was prepared under. ``state``: its :class:`TurnState`. ``committed``: None until
    :meth:`commit` answered, then its answer."""

    __slots__ = (
        "_committed",
        "api",
        "base",
        "body",
        "checkpoints",
        "generation",
        "prepared",
        "seq",
        "session",
        "signal",
        "size",
        "started",
        "state",
    )

    def __init__(
        self,
        session: Session,
        seq: int,
        api: Api,
        prepared: Prepared,
        body: dict[str, Any],
        checkpoints: Checkpoints = NO_CHECKPOINTS,
        size: int | None = None,
    ) -> None:
        self.session, self.seq, self.api, self.prepared, self.body = session, seq, api, prepared, body
        self.generation, self.base = session.generation, session.version
        self.signal: SessionSignal = session.signal
        self.checkpoints, self.size = checkpoints, size
        self.started = time.monotonic()
        self.state = TurnState.PREPARED
        self._committed: bool | None = None

    @property
    def committed(self) -> bool | None:
        """None until :meth:`commit` answered; then True (recorded) or False (stale, or the commit broke)."""
        return self._committed

    @property
    def done(self) -> bool:
        """Nothing more can change the session: the turn failed or is finished."""
        return self.state in (TurnState.FAILED, TurnState.FINISHED)

    def _refuse(self, step: str) -> TurnStateError:
        return TurnStateError(
            f"cannot {step} turn {self.seq} of session {self.session.session_id}: it is {self.state.value}"
        )

    def mark_sent(self) -> None:
        """The door sent :attr:`body` (``prepared`` → ``sent``; a repeat is harmless)."""
        if self.state not in _OPEN:
            raise self._refuse("send")
        self.state = TurnState.SENT

    def settle(self, ok: bool) -> None:
        """The store answered a commit (the manager's side of :meth:`commit`): ``committed`` when ``ok``, else
        finished (stale, or the commit broke: nothing was recorded)."""
        if self.state not in _OPEN:
            raise self._refuse("commit")
        self._committed = ok
        self.state = TurnState.COMMITTED if ok else TurnState.FINISHED

    def _answered(self) -> bool | None:
        """The answer of an earlier commit (a repeat), None when the commit is still to be made; raises
        :class:`TurnStateError` when the turn cannot be committed (it failed)."""
        if self.state in _OPEN:
            return None
        if self._committed is None:
            raise self._refuse("commit")
        return self._committed

    def send_original(self, body: dict[str, Any]) -> None:
        """The door sends the client's own ``body`` instead of :attr:`body` (writing the prepared body failed: fail
        open): the turn becomes that body, unchanged, so a commit records what actually went out."""
        if self.state not in _OPEN:
            raise self._refuse("replace the body of")
        self.prepared = self.session.pipeline.unchanged(self.prepared, body)
        self.body = body

    def commit(self) -> bool:
        """Record the request as sent (the upstream accepted it); False when the turn is stale."""
        answer = self._answered()
        return self.session.manager.commit_turn(self) if answer is None else answer

    async def acommit(self) -> bool:
        """:meth:`commit` through an asynchronous store (the proxy with Redis)."""
        answer = self._answered()
        return await self.session.manager.acommit_turn(self) if answer is None else answer

    def fail(self, reason: BaseException | str) -> None:
        """The upstream refused the request or the call failed before an answer: a retry, nothing committed.
        ``reason``: the exception, or a short label such as ``http_503``. A repeat, or a turn a commit refused,
        is left as it is; raises :class:`TurnStateError` for a committed turn (a cut response is
        ``finish(cut=True)``)."""
        if self._committed:
            raise self._refuse("fail")
        if self.state in _OPEN:
            self.state = TurnState.FAILED
            self.session.manager.fail_turn(self, reason if isinstance(reason, str) else type(reason).__name__)

    def finish(
        self, usage: CacheUsage | None = None, *, duration: float | None = None, cut: bool = False
    ) -> TurnReport | None:
        """After the last byte: the turn report (None when the turn was not committed). ``duration``: seconds
        from send to the end of the response (default: since :meth:`~agentcache.Session.begin`). ``cut``: the
        response broke after it was accepted. Raises :class:`TurnStateError` before a commit or a failure."""
        if self.state in _OPEN:
            raise self._refuse("finish")
        if self.state != TurnState.COMMITTED:
            self.state = TurnState.FINISHED
            return None
        self.state = TurnState.FINISHED
        return self.session.manager.finish_turn(self, usage, duration, cut)

    def succeed(self, usage: CacheUsage | None = None) -> TurnReport | None:
        """:meth:`commit` then :meth:`finish` (a response that arrived whole)."""
        if self.commit():
            return self.finish(usage)
        return None

    def report(self, usage: CacheUsage | None = None, duration: float | None = None) -> TurnReport:
        """This turn's report, committed or not (for a door's own log line)."""
        return build_report(self, usage, duration)


def build_report(turn: Turn, usage: CacheUsage | None, duration: float | None) -> TurnReport:
    """The turn report of ``turn`` with the upstream's ``usage`` (the four fields of docs/design.md)."""
    prep = turn.prepared
    planned, before, div = prep.planned, prep.before, prep.divergence
    matched = common_prefix(before, planned) if before is not None else 0
    matched_tokens = planned.tokens_before(matched)
    target = turn.session.target
    assert target is not None  # set when the turn was prepared
    reported = usage.cache_read_tokens if usage is not None else None
    cause = div.cause if div is not None else None
    boundary = ReuseBoundary(
        matched,
        matched_tokens,
        reported,
        cause,
        div.first_divergent if div is not None else None,
        max(0, before.tokens - matched_tokens) if before is not None and div is not None else 0,
        div.tokens_lost if div is not None else 0,
        cause is not None and cause in prep.repairs,
        TIKTOKEN_ESTIMATE if default_counter().exact else BYTES_ESTIMATE,
        None if reported is None else ENGINE_TOKENIZER if target.kind == TargetKind.ENGINE else PROVIDER_TOKENIZER,
    )
    return TurnReport(
        turn.api,
        planned.model,
        PrefixIdentity.of(planned),
        boundary,
        turn.signal,
        target.storage_tier(prep.plan, planned, usage),
        usage,
        target.cost(usage, planned.model) if usage is not None else None,
        prep.repairs,
        prep.markers,
        duration if duration is not None else time.monotonic() - turn.started,
        provider_miss(usage, prep.diagnosed, before, planned, target.name),
    )


def provider_miss(
    usage: CacheUsage | None,
    asked: bool,
    before: CanonicalRequest | None,
    planned: CanonicalRequest,
    provider: str,
) -> ProviderMiss | None:
    """The provider's diagnosis in ``usage`` beside agentcache's cause for the same pair of requests: what was
    sent (``planned``) against what the session sent before (``before``), as the provider compares them. A
    request that ``asked`` for Anthropic diagnostics and got none back had no divergence (``none``). None when
    there is no diagnosis."""
    diagnosis = usage.diagnosis if usage is not None else None
    if diagnosis is None and asked and provider == "anthropic" and usage is not None:
        diagnosis = ProviderDiagnosis("anthropic", "none")
    if diagnosis is None:
        return None
    ours = diagnose(before, planned).cause if before is not None else None
    return compare(diagnosis, str(ours) if ours is not None else None)
