"""Usage read off a streamed (or whole) response, event by event: :class:`UsageAccumulator`, the one reader
behind both the wrapper's SDK streams and the proxy's SSE tap, into :class:`~agentcache.model._usage.CacheUsage`."""

from __future__ import annotations

from collections.abc import Mapping
from contextlib import suppress
from dataclasses import replace
from typing import Any, ClassVar

from ..adapters import WIRES, usage_wire
from ..adapters.anthropic_messages import merge_anthropic_usage
from ._usage_read import CacheUsage, as_dict, read_field

__all__ = ["TERMINAL_EVENTS", "UsageAccumulator", "merge_anthropic_usage"]

#: The terminal event of a stream, per wire api: the ``type`` after which nothing more is sent (each wire's
#: :attr:`~agentcache.adapters._base.Wire.terminal_events`).
TERMINAL_EVENTS: Mapping[str, frozenset[str]] = {w.api: w.terminal_events for w in WIRES}
#: The fields of a whole response body that :meth:`UsageAccumulator.wire` keeps.
_WIRE_KEYS = ("id", "usage", "diagnostics", "prompt_cache_diagnostics", "timings", "meta_info")


class UsageAccumulator:
    """The usage of one response of wire ``api`` (``anthropic.messages``, ``openai.chat`` or
    ``openai.responses``; any other is read as Chat), fed stream event by stream event
    (:meth:`add_event`) or as one whole, non-streamed body (:meth:`add_body`).

    Events are dicts or SDK event objects, read with :func:`read_field` (so fields the SDK does not
    declare, like llama.cpp's ``timings``, are seen) by the api's wire
    (:meth:`~agentcache.adapters.Wire.stream_event`). What counts:

    * Anthropic (Messages "Streaming", SDK ``RawMessageStartEvent`` / ``RawMessageDeltaEvent``):
      ``message_start.message.usage``, updated by each ``message_delta.usage`` (cumulative; non-null
      fields win: :func:`merge_anthropic_usage`);
    * OpenAI Chat (``ChatCompletionChunk``): the last chunk's ``usage`` (sent with
      ``stream_options.include_usage``), the last llama.cpp ``timings`` (``llama-server`` puts them on
      the final chunk, ``usage`` or not; alone they give usage too) and SGLang ``meta_info``;
    * OpenAI Responses (``ResponseCompletedEvent`` …): ``.response.usage`` of the event carrying it
      (``response.completed`` / ``incomplete`` / ``failed``).

    :attr:`ended` turns true on the api's terminal event (:data:`TERMINAL_EVENTS`; Chat's sentinel is fed as
    the string ``"[DONE]"``), or on :meth:`end`. Never raises: an unreadable event or body gives no usage.
    """

    #: An SSE ``data:`` payload without one of these cannot carry usage: a framing need not parse it.
    SSE_USAGE_MARKERS: ClassVar[tuple[bytes, ...]] = (b'"usage"', b'"timings"')

    __slots__ = (
        "_body",
        "_diag",
        "_has_body",
        "_id",
        "_model",
        "_terminal",
        "_wire",
        "api",
        "ended",
        "meta_info",
        "sse_end_markers",
        "timings",
        "usage_fields",
    )

    def __init__(self, api: str) -> None:
        self.api = api
        #: The terminal event went past.
        self.ended = False
        self._wire = usage_wire(api)
        self._terminal = self._wire.terminal_events
        #: A ``data:`` payload of this api holding one of these is the terminal event: a framing may test them
        #: by substring (then call :meth:`end`) instead of parsing every line. Only the api's own: each costs a scan.
        self.sse_end_markers: tuple[bytes, ...] = self._wire.sse_end_markers
        #: The wire's events read so far (its :meth:`~agentcache.adapters._base.Wire.stream_event` fills them):
        #: ``usage`` (Anthropic: merged so far; Chat, Responses: the latest), llama.cpp ``timings``, SGLang
        #: ``meta_info``.
        self.usage_fields: dict[str, Any] | None = None
        self.timings: dict[str, Any] | None = None
        self.meta_info: dict[str, Any] | None = None
        self._body: Any = None
        self._has_body = False
        self._id: str | None = None  # the response id (Anthropic message_start, Responses events)
        self._model: str | None = None  # the model the response names (kept apart: recordings keep the wire doc)
        self._diag: dict[str, Any] = {}  # the provider's diagnostics fields, as sent

    def end(self) -> None:
        """Mark the terminal event seen (for a framing that spots it without parsing it)."""
        self.ended = True

    def add_event(self, event: Any) -> None:
        """Take one stream event: a dict, an SDK event object, or the string ``"[DONE]"`` (Chat's end)."""
        with suppress(Exception):  # an odd event carries no usage
            self._add(event)

    def _add(self, event: Any) -> None:
        if isinstance(event, str):
            self.ended = self.ended or event.strip() in self._terminal
            return
        kind = read_field(event, "type")
        if isinstance(kind, str) and kind in self._terminal:
            self.ended = True
        self._wire.stream_event(self, kind, event)

    def note(self, obj: Any, key: str) -> None:
        """Keep ``obj``'s ``id``, ``model`` and diagnostics field ``key`` (when it carries one)."""
        if obj is None:
            return
        rid = read_field(obj, "id")
        if isinstance(rid, str):
            self._id = rid
        self.note_model(obj)
        diag = read_field(obj, key)
        if diag is not None:
            self._diag[key] = as_dict(diag) or diag

    def note_model(self, obj: Any) -> None:
        """Keep the ``model`` ``obj`` names (the response's, or a stream chunk's), the first one seen."""
        if self._model is None and isinstance(model := read_field(obj, "model"), str):
            self._model = model

    def add_body(self, body: Any) -> None:
        """Take a whole non-streamed response body (a dict or SDK object); it replaces any events."""
        self._body, self._has_body = body, True

    @property
    def usage(self) -> CacheUsage | None:
        """The usage read so far (final once the stream has ended), or None."""
        try:
            if self._has_body:
                return self._wire.read_usage(self._body)
            doc = self._stream_doc()
            usage = self._wire.read_usage(doc) if doc is not None else None
            if usage is not None and self._model is not None:
                usage = replace(usage, response_model=self._model)
            return usage
        except Exception:  # never raises
            return None

    def wire(self) -> dict[str, Any] | None:
        """The response's usage-bearing fields as the wire had them (``id``, ``usage``, the provider's
        diagnostics, llama.cpp ``timings``, SGLang ``meta_info``): a response object :func:`normalize_usage` reads
        as it reads the whole response; for a stream, assembled from its events as :attr:`usage` reads them. None
        when nothing was read (or the body was no JSON object)."""
        if not self._has_body:
            return self._stream_doc()
        body = self._body
        if not isinstance(body, dict):
            return None
        return {k: body[k] for k in _WIRE_KEYS if k in body} or None

    def _stream_doc(self) -> dict[str, Any] | None:
        parts = {"usage": self.usage_fields, "timings": self.timings, "meta_info": self.meta_info}
        doc: dict[str, Any] = {k: v for k, v in parts.items() if v is not None}
        if not doc:
            return None
        if self.usage_fields is not None:
            doc.update(self._diag, **({"id": self._id} if self._id is not None else {}))
        return doc
