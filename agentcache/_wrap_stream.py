"""Streaming for :func:`agentcache.wrap`: read usage from events as they pass, never buffer.

:func:`tap_stream` replaces the SDK stream's private ``_iterator`` (``Stream``/``AsyncStream`` of both
SDKs, and Anthropic's ``MessageStream`` helper, have iterated through it since the 1.x releases) with
a generator that hands each event to a :class:`UsageTap` and yields it unchanged; the stream object the
caller holds is still the SDK's own. Usage comes from:

* Anthropic: ``message_start.message.usage`` (input and cache tokens), then each ``message_delta.usage``
  (cumulative; non-null fields win), as the SDK's accumulator does;
* OpenAI Chat Completions: a chunk with ``usage`` (sent when the request sets
  ``stream_options={"include_usage": true}``), and llama.cpp's ``timings`` on the final chunk (usage even
  without ``include_usage``);
* OpenAI Responses: ``response.completed`` (or ``response.incomplete``/``response.failed``) ``.response.usage``.

The SDK returning the stream means the upstream accepted the request: the turn is committed then
(:meth:`Turn.commit`). It finishes when the stream ends (:meth:`Turn.finish` with the usage seen: normally, or
closed early by the consumer, whose request was still sent); an exception from the stream (connection cut, SDK
error event) finishes it as cut (a retry is counted; the request stays committed) and propagates unchanged. A
stream that is never iterated is committed and never finished. When the stream has no ``_iterator`` to tap, the
turn finishes at once without usage.

:class:`StreamManagerProxy` stands in for Anthropic's ``messages.stream()`` manager, whose request is
sent on ``__enter__``/``__aenter__``: an error there is a retry; the ``MessageStream`` it yields is the
SDK's own, tapped.
"""

from __future__ import annotations

import inspect
from collections.abc import AsyncIterator, Iterator
from typing import Any

from ._log import get_logger
from .model._usage import CacheUsage
from .model._usage_stream import UsageAccumulator
from .session import Turn
from .session._coalesce import Ticket

__all__ = ["StreamManagerProxy", "UsageTap", "tap_stream"]

log = get_logger("agentcache.wrap")


class UsageTap:
    """Collects usage from the events of one stream of ``api`` (SDK event objects or dicts) with a
    :class:`~agentcache.model._usage_stream.UsageAccumulator`; :attr:`usage` is the latest known."""

    __slots__ = ("_acc", "api")

    def __init__(self, api: str) -> None:
        self.api = api
        self._acc = UsageAccumulator(api)

    @property
    def usage(self) -> CacheUsage | None:
        """The usage read so far, or None."""
        return self._acc.usage

    def observe(self, event: Any) -> None:
        """Read one event (any SDK event object or dict); never raises."""
        self._acc.add_event(event)


def _complete(turn: Turn, tap: UsageTap, exc: BaseException | None, ticket: Ticket | None = None) -> None:
    if ticket is not None:
        ticket.release()
    try:
        # An exception mid-stream is a cut response; cancellation or an interrupt ends it like an early close.
        turn.finish(tap.usage, cut=isinstance(exc, Exception))
    except Exception as err:  # fail open
        log.warning("wrap.failed_open", stage="stream_end", error=type(err).__name__)


def _tap_sync(inner: Iterator[Any], turn: Turn, tap: UsageTap) -> Iterator[Any]:
    try:
        for item in inner:
            tap.observe(item)
            yield item
    except GeneratorExit:
        _complete(turn, tap, None)
        raise
    except BaseException as exc:
        _complete(turn, tap, exc)
        raise
    _complete(turn, tap, None)


async def _tap_async(
    inner: AsyncIterator[Any], turn: Turn, tap: UsageTap, ticket: Ticket | None = None
) -> AsyncIterator[Any]:
    try:
        async for item in inner:
            if ticket is not None:
                ticket.first_byte()  # the upstream began answering: siblings held on this prefix may go
            tap.observe(item)
            yield item
    except GeneratorExit:
        _complete(turn, tap, None, ticket)
        raise
    except BaseException as exc:
        _complete(turn, tap, exc, ticket)
        raise
    _complete(turn, tap, None, ticket)


def tap_stream(stream: Any, turn: Turn, ticket: Ticket | None = None) -> Any:
    """Tap ``stream`` (an SDK ``Stream``/``AsyncStream``/``MessageStream``) for ``turn``'s usage and
    return it (the same object). ``ticket``: the request's coalescing ticket (an async stream's first event is
    its first byte; released when the stream ends). Never raises: when it cannot tap, the turn succeeds without
    usage."""
    try:
        turn.commit()
        inner: Any = getattr(stream, "_iterator", None)
        tap = UsageTap(turn.api)
        if hasattr(inner, "__anext__"):
            stream._iterator = _tap_async(inner, turn, tap, ticket)
            return stream
        if ticket is not None:  # nothing to watch: the SDK's return is the first byte
            ticket.first_byte()
            ticket.release()
        if hasattr(inner, "__next__"):
            stream._iterator = _tap_sync(inner, turn, tap)
            return stream
        log.debug("wrap.stream_untapped", stream=type(stream).__name__)
        turn.finish(None)
    except Exception as exc:  # fail open: the stream goes back as it came
        log.warning("wrap.failed_open", stage="stream_tap", error=type(exc).__name__)
        if ticket is not None:
            ticket.release()
    return stream


class StreamManagerProxy:
    """Anthropic's ``messages.stream(...)`` manager, sent with the prepared body: entering it sends the
    request (an exception there is recorded as a retry and re-raised) and yields the SDK's own,
    tapped ``MessageStream``. Everything else is the SDK manager's."""

    def __init__(self, manager: Any, turn: Turn) -> None:
        self._manager, self._turn = manager, turn

    def __enter__(self) -> Any:
        try:
            stream = self._manager.__enter__()
        except Exception as exc:
            self._turn.fail(exc)
            raise
        return tap_stream(stream, self._turn)

    def __exit__(self, *exc: Any) -> Any:
        return self._manager.__exit__(*exc)

    async def __aenter__(self) -> Any:
        try:
            stream = await self._manager.__aenter__()
        except Exception as exc:
            self._turn.fail(exc)
            raise
        return tap_stream(stream, self._turn)

    async def __aexit__(self, *exc: Any) -> Any:
        return await self._manager.__aexit__(*exc)

    def __getattr__(self, name: str) -> Any:
        return getattr(self._manager, name)


def is_async_callable(fn: Any) -> bool:
    """True when ``fn`` is a coroutine function, seen through decorators (``functools.wraps``)."""
    try:
        return inspect.iscoroutinefunction(inspect.unwrap(fn))
    except ValueError:  # a __wrapped__ cycle
        return False
