"""Recorded request bodies in the target wire format: OpenAI Chat Completions ⇄ Anthropic Messages (messages,
tools, tool choice, the usual sampling options), OpenAI Responses → Chat (the wires' conversions,
:mod:`agentcache.adapters._convert`), and any of them → SGLang ``/generate`` token ids (for a model directory
without a tokenizer).
"""

from __future__ import annotations

import json
from collections.abc import Sequence
from typing import Any

from .._exceptions import InputError
from ..adapters import REPLAY_ENDPOINTS, find_wire
from ..adapters._convert import anthropic_to_chat, chat_to_anthropic, responses_to_chat, text_of

__all__ = [
    "TARGET_APIS",
    "anthropic_to_chat",
    "chat_to_anthropic",
    "convert",
    "first_divergence",
    "responses_to_chat",
    "to_token_ids",
]

#: ``--api`` value → the wire format sent.
TARGET_APIS: dict[str, str] = {e.replay_name: e.api for e in REPLAY_ENDPOINTS if e.replay_name is not None}


def _to_chat(api: str, body: dict[str, Any]) -> dict[str, Any]:
    """``body`` (wire format ``api``) as a Chat body (``body`` itself for Chat). Raises InputError for an api
    without a wire."""
    source = find_wire(api)
    if source is None:
        raise InputError(f"cannot replay {api} requests")
    return source.to_chat(body)


def convert(api: str, body: dict[str, Any], target: str) -> dict[str, Any]:
    """``body`` (wire format ``api``) in wire format ``target`` (``openai.chat`` or ``anthropic.messages``), through
    Chat: ``api``'s wire's :meth:`~agentcache.adapters.Wire.to_chat`, then ``target``'s
    :meth:`~agentcache.adapters.Wire.from_chat`.

    Raises InputError for a conversion that is not supported.
    """
    if api == target:
        return dict(body)
    chat = _to_chat(api, body)
    sink = find_wire(target)
    if sink is None or not sink.replay_target:
        raise InputError(f"cannot convert {api} requests to {target}")
    return sink.from_chat(chat)


# -- any → token ids (SGLang /generate without a tokenizer) ----------------------------------------------------


def _segments(chat: dict[str, Any]) -> list[str]:
    """The prompt as ChatML-like text segments, tools first, one per message (so a longer conversation's
    segments extend a shorter one's)."""
    out = []
    if chat.get("tools"):
        out.append("<|tools|>\n" + json.dumps(chat["tools"], sort_keys=True, ensure_ascii=False) + "\n")
    for msg in chat.get("messages") or []:
        text = text_of(msg.get("content"))
        for call in msg.get("tool_calls") or []:
            text += "\n<tool_call>" + json.dumps(call.get("function"), sort_keys=True, ensure_ascii=False)
        out.append(f"<|{msg.get('role')}|>\n{text}\n")
    return out


def to_token_ids(api: str, body: dict[str, Any], vocab_size: int, encode: Any = None) -> list[int]:
    """Prompt token ids for SGLang ``/generate`` when the model has no tokenizer (random weights): the body
    rendered as text, tokenized with tiktoken ``o200k_base`` segment by segment (a prefix always encodes to
    a prefix), ids folded into ``vocab_size``. ``encode``: a ``str -> list[int]`` (default: tiktoken, else
    UTF-8 bytes)."""
    if encode is None:
        from ..model._tokens import default_counter

        encoder = default_counter()._load()
        encode = encoder.encode_ordinary if encoder is not None else (lambda s: list(s.encode()))
    chat = _to_chat(api, body)
    ids: list[int] = []
    for segment in _segments(chat):
        ids.extend(t % vocab_size for t in encode(segment))
    return ids


def first_divergence(a: Sequence[int], b: Sequence[int]) -> int:
    """Length of the common prefix of two id lists (tests)."""
    n = 0
    for x, y in zip(a, b, strict=False):
        if x != y:
            break
        n += 1
    return n
