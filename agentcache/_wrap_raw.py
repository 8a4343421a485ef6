"""Raw and streaming responses for :func:`agentcache.wrap`: usage read from the HTTP body the caller reads.

``....with_raw_response.create(...)`` (LangChain's ChatAnthropic and ChatOpenAI, litellm) and
``....with_streaming_response.create(...)`` (the OpenAI Agents SDK's streamed Responses) return the SDK's own
``APIResponse`` / ``LegacyAPIResponse`` (``anthropic._response``, ``openai._legacy_response``, ``openai._response``),
whose ``http_response`` is the httpx (or httpx2) response. The caller reads that body however it likes
(``parse()``, ``read()``, ``iter_lines()``, ``iter_bytes()``...), and every one of those goes through the
response's ``stream`` attribute (httpx ``Response.iter_raw``). So :func:`tap_raw_response`:

* when the body was already read (``with_raw_response`` without ``stream=True``: httpx read it before the SDK
  returned), reads usage from ``http_response.content`` and the turn succeeds at once;
* otherwise (``stream=True``, or ``with_streaming_response``) commits the turn and replaces ``http_response.stream``
  with a tee that hands each chunk to the byte-level :class:`~agentcache.model._bodytap.UsageTap` (gzip/deflate,
  SSE lines, or the whole JSON body) as the caller pulls it, and finishes the turn when the body ends, is closed
  (early closes included: the request was sent) or breaks (a cut: a retry is counted).

The response object is returned untouched otherwise; a body in an encoding the tap cannot decode (``br``,
``zstd``) gives no usage. Never raises: when it cannot tap, the turn finishes without usage.
"""

from __future__ import annotations

from collections.abc import AsyncIterator, Iterator
from typing import Any

from ._log import get_logger
from .model._bodytap import UsageTap
from .session import Turn

__all__ = ["tap_raw_response"]

log = get_logger("agentcache.wrap")

#: The httpx/httpx2 stream interfaces ``Response.iter_raw``/``aiter_raw`` check with ``isinstance``.
_STREAM_BASES = ("SyncByteStream", "AsyncByteStream")


class _Tee:
    """Stands in for an httpx response stream: yields the inner stream's chunks unchanged, feeding the tap, and
    ends the turn once (body done, closed, or broken)."""

    def __init__(self, inner: Any, tap: UsageTap, turn: Turn) -> None:
        self._inner, self._tap, self._turn, self._done = inner, tap, turn, False

    def _end(self, exc: BaseException | None) -> None:
        if self._done:
            return
        self._done = True
        try:
            # An exception mid-body is a cut response; cancellation or an early close ends it like a close.
            self._turn.finish(self._tap.result(), cut=isinstance(exc, Exception))
        except Exception as err:  # fail open
            log.warning("wrap.failed_open", stage="raw_response_end", error=type(err).__name__)

    def __iter__(self) -> Iterator[bytes]:
        try:
            for chunk in self._inner:
                self._tap.feed(chunk)
                yield chunk
        except GeneratorExit:
            self._end(None)
            raise
        except BaseException as exc:
            self._end(exc)
            raise
        self._end(None)

    def close(self) -> None:
        try:
            self._inner.close()
        finally:
            self._end(None)

    async def __aiter__(self) -> AsyncIterator[bytes]:
        try:
            async for chunk in self._inner:
                self._tap.feed(chunk)
                yield chunk
        except GeneratorExit:
            self._end(None)
            raise
        except BaseException as exc:
            self._end(exc)
            raise
        self._end(None)

    async def aclose(self) -> None:
        try:
            await self._inner.aclose()
        finally:
            self._end(None)


_TEES: dict[type, type] = {}


def _tee_class(stream: Any) -> type | None:
    """A :class:`_Tee` that is also an instance of the httpx stream bases ``stream`` is (one class per type)."""
    cls = type(stream)
    tee = _TEES.get(cls)
    if tee is None:
        bases = tuple(b for b in cls.__mro__ if b.__name__ in _STREAM_BASES)
        if not bases:
            return None
        tee = _TEES[cls] = type("AgentcacheTee", (_Tee, *bases), {})
    return tee


def tap_raw_response(response: Any, turn: Turn) -> Any:
    """Record ``turn``'s usage from the SDK raw/streaming ``response`` (module docstring) and return it, the
    same object. Never raises."""
    try:
        http = response.http_response
        headers = http.headers
        content_type = headers.get("content-type", "")
        if http.is_stream_consumed:  # already read: the caller's parse() reads this same content
            tap = UsageTap(turn.api, content_type)
            tap.feed(http.content)
            turn.succeed(tap.result())
            return response
        turn.commit()
        tee = _tee_class(http.stream)
        if tee is None:
            log.debug("wrap.raw_untapped", stream=type(http.stream).__name__)
            turn.finish(None)
            return response
        tap = UsageTap(turn.api, content_type, headers.get("content-encoding", ""))
        http.stream = tee(http.stream, tap, turn)
    except Exception as exc:  # fail open: the response goes back as it came, the turn ends without usage
        log.warning("wrap.failed_open", stage="raw_response", error=type(exc).__name__)
        if turn.committed is None:
            turn.succeed(None)
        elif not turn.done:
            turn.finish(None)
    return response
