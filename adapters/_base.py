"""The :class:`Wire`: everything agentcache knows about one wire API, in one object.

One subclass per API (``anthropic_messages.AnthropicMessages``, ``openai_chat.OpenAIChat``,
``openai_responses.OpenAIResponses``), one instance each (``WIRE`` in its module), reached by
:func:`agentcache.adapters.wire_for`. Code outside ``adapters/`` asks the wire instead of comparing API names:

=======================  =====================================================================================
fact                     members
=======================  =====================================================================================
body ⇄ canonical model   :meth:`Wire.canonicalize`, :meth:`Wire.apply`, :meth:`Wire.reshaped`
where requests arrive    :attr:`Wire.route` (the proxy's), :attr:`Wire.sdk`, :attr:`Wire.sdk_resource`,
                         :attr:`Wire.sdk_methods` and :attr:`Wire.sdk_path` (the SDK client, the resource and
                         methods that send it, its low-level ``post`` path)
usage                    :attr:`Wire.usage_form` (the usage shape of a whole response),
                         :meth:`Wire.read_usage`; streams: :attr:`Wire.terminal_events`,
                         :meth:`Wire.stream_event`
                         :meth:`Wire.usage_doc` (the ``usage`` object of given counts, for logs that keep counts)
error bodies             :attr:`Wire.error_style`, :meth:`Wire.error_body`
replay                   :meth:`Wire.to_chat`, :meth:`Wire.from_chat`, :attr:`Wire.replay_target`; sending
                         and reading back (:class:`Endpoint`, which SGLang's native ``/generate`` is too):
                         :meth:`Endpoint.replay_body`, :meth:`Endpoint.replay_headers`,
                         :meth:`Endpoint.stream_error`, :meth:`Endpoint.first_output`, :meth:`Endpoint.generated`
conversation items       :attr:`Wire.items_field`, :meth:`Wire.conversation`, :meth:`Wire.prefix_units`,
                         :meth:`Wire.routing_key`
=======================  =====================================================================================
"""

from __future__ import annotations

import json
from abc import ABC, abstractmethod
from collections.abc import Callable, Mapping
from typing import TYPE_CHECKING, Any, ClassVar, Literal

from agentcache._exceptions import InputError
from agentcache.model._build import BlockCache
from agentcache.model._canonical import Block, CanonicalRequest, Marker
from agentcache.model._plan import WirePlan
from agentcache.model._tokens import TokenCounter
from agentcache.model._usage_read import CacheUsage, UsageForm, as_dict, read_field, read_usage

if TYPE_CHECKING:
    from agentcache.model._usage_stream import UsageAccumulator

#: An error document's format: Anthropic's ``{"type": "error", "error": {...}}`` or OpenAI's ``{"error": {...}}``.
ErrorStyle = Literal["anthropic", "openai"]

#: The roles whose messages are the system prompt, not the conversation (OpenAI Chat and Responses).
SYSTEM_ROLES = frozenset({"system", "developer"})


class Endpoint:
    """How a request of one wire format is sent and its stream read back (replay): the part of a :class:`Wire`
    that SGLang's native ``/generate`` (token ids in, no canonical model) has too. The defaults are OpenAI Chat's
    (the format OpenAI-compatible servers speak)."""

    #: The format's name (``agentcache.model.Api`` value, or ``sglang.generate``).
    api: ClassVar[str]
    #: The path requests of this format are sent to (and arrive on at the proxy).
    route: ClassVar[str]
    #: The name ``agentcache replay --api`` gives it (None: not a replay target).
    replay_name: ClassVar[str | None] = None
    #: The API a replayed body is converted to and planned in before it is sent (:meth:`replay_body`).
    plans_as: ClassVar[str] = "openai.chat"
    #: Whether the request carries token ids (no chat template renders it).
    sends_token_ids: ClassVar[bool] = False

    def replay_headers(self, api_key: str | None) -> dict[str, str]:
        """The headers a replayed request carries (Chat: ``authorization: Bearer <key>`` when a key is given)."""
        return {"authorization": f"Bearer {api_key}"} if api_key else {}

    def replay_body(
        self, body: dict[str, Any], max_tokens: int, *, want_ids: bool, token_ids: Callable[[dict[str, Any]], list[int]]
    ) -> dict[str, Any]:
        """The request replay sends for ``body`` (the replay's own copy, in :attr:`plans_as`; finished in place):
        streamed, at most ``max_tokens`` generated. Chat: usage in the stream (``stream_options``) and, when
        ``want_ids`` and the body has no tools, ``logprobs`` (the generated ids; llama.cpp gives none with tools and
        streaming). ``token_ids``: the body's prompt as token ids (for a format that sends them)."""
        body.pop("max_completion_tokens", None)
        body["max_tokens"] = max_tokens
        body["stream"] = True
        body["stream_options"] = {"include_usage": True}
        if want_ids and not body.get("tools"):
            body["logprobs"] = True
        return body

    def stream_error(self, event: Mapping[str, Any]) -> bool:
        """Whether stream ``event`` (a parsed ``data:`` payload) reports an error (Chat: an ``error`` field)."""
        return event.get("type") == "error" or "error" in event

    def first_output(self, event: Mapping[str, Any]) -> bool:
        """Whether stream ``event`` carries generated output (Chat: a choice's delta with content, reasoning or
        tool calls)."""
        for choice in event.get("choices") or []:
            delta = choice.get("delta") or {}
            if delta.get("content") or delta.get("reasoning_content") or delta.get("tool_calls"):
                return True
        return False

    def generated(self, event: Mapping[str, Any]) -> tuple[str, list[int]]:
        """``(text, token ids)`` stream ``event`` generated (Chat: the delta's content; llama.cpp's per-token
        ``logprobs`` ids, with ``logprobs`` on)."""
        ids: list[int] = []
        text = ""
        for choice in event.get("choices") or []:
            for entry in (choice.get("logprobs") or {}).get("content") or []:
                if isinstance(entry, dict) and isinstance(entry.get("id"), int):
                    ids.append(entry["id"])
            content = (choice.get("delta") or {}).get("content")
            if isinstance(content, str):
                text += content
        return text, ids


class Wire(Endpoint, ABC):
    """One wire API's facts (see the module docstring). Subclasses set the class attributes and the three abstract body
    functions; the defaults are OpenAI Chat's."""

    plans_as: ClassVar[str]  # its own api (set by __init_subclass__)
    #: The SDK (``anthropic`` / ``openai``) whose clients send it, and the path its low-level ``post`` uses.
    sdk: ClassVar[str]
    sdk_path: ClassVar[str]
    #: The SDK client's attributes down to the resource whose :attr:`sdk_methods` send it (``chat.completions``).
    sdk_resource: ClassVar[tuple[str, ...]]
    sdk_methods: ClassVar[tuple[str, ...]] = ("create",)
    #: The body field holding the conversation (``messages`` / ``input``).
    items_field: ClassVar[str] = "messages"
    #: How the usage of a whole response reads (:func:`agentcache.model._usage_read.read_usage`).
    usage_form: ClassVar[UsageForm] = "chat"
    #: The stream event ``type`` values after which nothing more is sent (Chat: the ``[DONE]`` sentinel).
    terminal_events: ClassVar[frozenset[str]] = frozenset({"[DONE]"})
    error_style: ClassVar[ErrorStyle] = "openai"
    #: The system prompt is a top-level field whose changing lines ``move_volatile`` can move out of the cached
    #: prefix (:func:`agentcache.policies.volatility.move_volatile` reads Anthropic's ``system``).
    moves_volatile: ClassVar[bool] = False
    #: A cached prefix can be kept warm by re-sending it with ``max_tokens: 1`` (the keep-warm policy builds
    #: Anthropic Messages bodies; OpenAI's cache has no TTL to bridge that a client controls).
    keeps_warm: ClassVar[bool] = False
    #: OpenAI error ``type`` and ``code`` per status code.
    _ERROR_TYPES: ClassVar[Mapping[int, tuple[str, str | None]]] = {
        400: ("invalid_request_error", None),
        401: ("invalid_request_error", "invalid_api_key"),
        403: ("invalid_request_error", None),
        404: ("invalid_request_error", None),
        413: ("invalid_request_error", "request_too_large"),
        502: ("server_error", "bad_gateway"),
        504: ("server_error", "timeout"),
    }

    def __init_subclass__(cls, **kwargs: Any) -> None:
        super().__init_subclass__(**kwargs)
        if "api" in cls.__dict__:
            cls.plans_as = cls.api  # a wire's bodies are planned as they are

    def __init__(self) -> None:
        #: The bytes a terminal event's SSE ``data:`` payload holds (JSON escaping keeps text from matching).
        self.sse_end_markers: tuple[bytes, ...] = tuple(
            b"[DONE]" if k == "[DONE]" else f'"{k}"'.encode() for k in sorted(self.terminal_events)
        )

    def __repr__(self) -> str:
        return f"<Wire {self.api}>"

    # body ⇄ canonical model: the subclass's module functions
    @abstractmethod
    def canonicalize(
        self, body: dict[str, Any], counter: TokenCounter | None = None, cache: BlockCache | None = None
    ) -> CanonicalRequest:
        """Canonical request of a wire ``body``. Raises InputError if malformed."""

    @abstractmethod
    def apply(self, body: dict[str, Any], plan: WirePlan) -> dict[str, Any]:
        """A new wire body with ``plan`` applied (``body`` is not mutated)."""

    @abstractmethod
    def reshaped(self, block: Block, marker: Marker | None) -> Block:
        """The canonical block of string unit ``block`` once a marker turned it into a text block."""

    # usage
    def read_usage(self, data: Any) -> CacheUsage | None:
        """The usage of a whole response of this API (dict or SDK object; or its ``usage`` alone); None when
        absent. Never raises on odd input."""
        return read_usage(data, self.usage_form)

    def stream_event(self, acc: UsageAccumulator, kind: Any, event: Any) -> None:
        """Take what stream ``event`` (its ``type`` is ``kind``) says about usage into ``acc``. Chat: the last
        chunk's ``usage``, llama.cpp's ``timings``, SGLang's ``meta_info`` (most chunks carry none of them)."""
        if (usage := read_field(event, "usage")) is not None:
            acc.usage_fields = as_dict(usage) or acc.usage_fields
            acc.note_model(event)  # the usage chunk names the model as every chunk does
        if (timings := read_field(event, "timings")) is not None:
            acc.timings = as_dict(timings) or acc.timings
        if (meta := read_field(event, "meta_info")) is not None:
            acc.meta_info = as_dict(meta) or acc.meta_info

    def usage_doc(self, prompt: int, read: int, write: int = 0, output: int | None = None) -> dict[str, Any]:
        """The ``usage`` object this API returns for a call of ``prompt`` tokens in all, ``read`` of them read from
        the cache and ``write`` written to it, ``output`` generated (Chat: ``prompt_tokens`` is the whole
        prompt)."""
        out: dict[str, Any] = {
            "prompt_tokens": prompt,
            "prompt_tokens_details": {"cached_tokens": read},
            "cache_write_tokens": write,
        }
        if output is not None:
            out["completion_tokens"] = output
        return out

    # replay: conversion through Chat
    #: Whether a body of another API can be converted to this one (:meth:`from_chat`).
    replay_target: ClassVar[bool] = True

    def to_chat(self, body: dict[str, Any]) -> dict[str, Any]:
        """``body`` as an OpenAI Chat Completions body (:mod:`agentcache.adapters._convert`); Chat's is itself."""
        return body

    def from_chat(self, chat: dict[str, Any]) -> dict[str, Any]:
        """A Chat Completions body ``chat`` as a body of this API (a new dict); only where :attr:`replay_target`."""
        return dict(chat)

    # errors
    def error_body(self, status: int, message: str) -> bytes:
        """The JSON error document this API's clients expect for ``status`` (OpenAI's format:
        ``{"error": {"message", "type", "param", "code"}}``)."""
        kind, code = self._ERROR_TYPES.get(status, ("server_error" if status >= 500 else "invalid_request_error", None))
        return json.dumps({"error": {"message": message, "type": kind, "param": None, "code": code}}).encode()

    # conversation items (session identity)
    def routing_key(self, body: Mapping[str, Any]) -> Any:
        """The client's cache routing key in ``body`` (OpenAI's ``prompt_cache_key``), as sent; None without one."""
        return body.get("prompt_cache_key")

    def conversation(self, body: Mapping[str, Any]) -> list[Any]:
        """The conversation items of ``body``: its ``items_field`` list without system/developer messages.
        Raises InputError when the body has none."""
        items = body.get(self.items_field)
        if not isinstance(items, list):
            raise InputError(f"{self.api} body needs a list of {self.items_field}")
        return [m for m in items if not (isinstance(m, dict) and m.get("role") in SYSTEM_ROLES)]

    def prefix_units(self, body: Mapping[str, Any]) -> list[Any]:
        """What precedes the conversation in ``body``: tools, ``instructions``, the system/developer messages."""
        units: list[Any] = [body.get("tools"), body.get("instructions")]
        items = body.get(self.items_field)
        if isinstance(items, list):
            units += [m for m in items if isinstance(m, dict) and m.get("role") in SYSTEM_ROLES]
        return units
