"""The canonical request model: one provider-neutral, immutable sequence of blocks in prefix order.

Adapters (``agentcache.adapters``) turn a wire body into a :class:`CanonicalRequest`; policies,
diagnosis and simulators only ever see this model. Prefix order is
``options(model) → tools → options(tools level) → system → options(messages level) → messages``,
and within a message its content blocks in wire order. Request options that are part of the cache key
are *option blocks* placed at the level they invalidate (e.g. Anthropic ``tool_choice`` sits after
``system``: changing it keeps tools+system cached but not messages), so one hash chain captures both
content and options.

A block carries:

* ``data``: the unit's canonical bytes, compact JSON in the key order it was sent, with its cache marker
  stripped where the API defines one (:func:`marker_at`), so moving a marker is not a content change; a key of
  the same name anywhere else (a schema property, a tool input, nested content) is content;
* ``env``: the bytes of its message envelope (role, ``tool_call_id``...), shared by the blocks of a message;
* ``digest``: blake2b-128 of ``env`` and ``data``; ``chain[i]`` hashes ``chain[i-1]`` with ``digest[i]``,
  a radix-tree path that names the whole prefix through block ``i``;
* ``tokens``: a tiktoken ``o200k_base`` estimate, memoised per digest.
"""

from __future__ import annotations

import re
from collections.abc import Mapping
from dataclasses import dataclass, field
from hashlib import blake2b
from typing import Any

from ._causes import Section
from ._rawjson import encode as _encode
from ._rawjson import encode_ascii, parse

#: Keys that mark cache breakpoints on the wire, in some API at some position (see :data:`MARKERS`).
MARKER_KEYS = ("cache_control", "prompt_cache_breakpoint")

#: Where each wire API defines its cache marker, the one place agentcache reads it: API → (marker key, the block
#: paths that may carry it). Anywhere else a key of that name, or the other API's, is content.
#:
#: * Anthropic ``cache_control`` (platform.claude.com/docs/en/build-with-claude/prompt-caching, "What can be
#:   cached"; SDK ``ToolParam``, ``TextBlockParam`` and the other ``*BlockParam`` types): on a tool, a system block
#:   and a message content block (``tool_result`` included), plus the top-level field (automatic caching, read by
#:   the adapter). The SDK's ``ToolResultBlockParam.content`` blocks may carry one too; agentcache keeps a tool
#:   result as one block, so such a nested marker stays in that block's bytes: moving it changes the block and is
#:   never repaired away.
#: * OpenAI ``prompt_cache_breakpoint`` (gpt-5.6+, ``agentcache.data/models.toml``): on a message content part
#:   (Chat ``messages[i].content[j]``; Responses ``input[i].content[j]`` of a message item), where the OpenAI
#:   target writes it (``adapters/openai_chat.set_markers``, ``openai_responses.set_markers``).
MARKERS: dict[str, tuple[str, re.Pattern[str]]] = {
    "anthropic.messages": ("cache_control", re.compile(r"tools\[\d+\]|system\[\d+\]|messages\[\d+\]\.content\[\d+\]")),
    "openai.chat": ("prompt_cache_breakpoint", re.compile(r"messages\[\d+\]\.content\[\d+\]")),
    "openai.responses": ("prompt_cache_breakpoint", re.compile(r"input\[\d+\]\.content\[\d+\]")),
}


def marker_at(api: str, path: str) -> str | None:
    """The marker key the wire ``api`` defines on the block at ``path`` (``"messages[3].content[0]"``), or None
    where it defines none (see :data:`MARKERS`)."""
    spec = MARKERS.get(api)
    return spec[0] if spec is not None and spec[1].fullmatch(path) else None


def _item_marks(api: str, item: Any) -> tuple[str, int]:
    """``(key, n)``: the marker key of ``api`` and how many content parts of conversation ``item`` carry it."""
    key = MARKERS[api][0] if api in MARKERS else ""
    if not isinstance(item, dict) or (api == "openai.responses" and not item.get("role")):
        return key, 0
    content = item.get("content")
    if not isinstance(content, list):
        return key, 0
    return key, sum(1 for c in content if isinstance(c, dict) and key in c)


def unmarked_item(api: str, item: Any) -> Any:
    """Conversation ``item`` (a message) without the markers ``api`` defines on its content parts."""
    key, n = _item_marks(api, item)
    if not n:
        return item
    content = [{k: v for k, v in c.items() if k != key} if isinstance(c, dict) else c for c in item["content"]]
    return {**item, "content": content}


# A marker member with its separating comma, whichever side of it the comma is on: markers are flat objects.
_MARKER_TEXT = {
    key: re.compile(
        rf'\s*,\s*"{key}"\s*:\s*(?:\{{[^{{}}]*\}}|"[^"]*"|true|false|null)|"{key}"\s*:\s*(?:\{{[^{{}}]*\}}|"[^"]*"|true|false|null)\s*,?\s*'
    )
    for key in MARKER_KEYS
}


def item_text(api: str, item: Any, text: str | None) -> str:
    """The text session inference hashes for a unit: a conversation ``item``, or a prefix unit (the tools list,
    the system list or string, ``instructions``, one system message). Its source ``text`` (None: not known) with
    the markers ``api`` defines on it (on content parts; on ``tools[i]``/``system[i]`` for Anthropic) cut out, so
    a unit reads the same whether or not the client marked it this turn. The source text is cut directly when
    every occurrence of the marker key in it is such a marker (the usual case: one string scan); otherwise the
    unit is encoded without them (the same choice every turn for the same unit, so its hash is stable)."""
    spec = MARKERS.get(api)
    if text is not None and (spec is None or spec[0] not in text):
        return text  # the usual case: one string scan
    bare, n = _unmarked_unit(api, item)
    if text is not None and spec is not None:
        key = spec[0]
        if text.count(f'"{key}"') == n:
            cut = _MARKER_TEXT[key].sub("", text)
            if f'"{key}"' not in cut:
                return cut
    return str(encode_ascii(bare))


def _unmarked_unit(api: str, unit: Any) -> tuple[Any, int]:
    """``(unit without the markers api defines on it, how many it had)`` (see :func:`item_text`)."""
    key = MARKERS[api][0] if api in MARKERS else ""
    if isinstance(unit, list) and api == "anthropic.messages":  # tools[i] and system[i] take a marker
        n = sum(1 for u in unit if isinstance(u, dict) and key in u)
        if not n:
            return unit, 0
        return [{k: v for k, v in u.items() if k != key} if isinstance(u, dict) else u for u in unit], n
    return unmarked_item(api, unit), _item_marks(api, unit)[1]  # a message: markers on its content parts


#: Content block types that carry media (``messages.media_changed``).
MEDIA_TYPES = frozenset({"image", "document", "image_url", "input_image", "input_file", "file", "input_audio"})


def dumps(value: Any) -> bytes:
    """Compact JSON bytes in the stored key order (the wire bytes of a unit)."""
    return _encode(value).encode()


def digest(*parts: bytes) -> bytes:
    """blake2b-128 over ``parts`` separated by a NUL byte."""
    return blake2b(b"\x00".join(parts), digest_size=16).digest()


@dataclass(frozen=True, slots=True)
class Marker:
    """A cache breakpoint on a block: Anthropic ``cache_control`` (``ttl`` ``"5m"`` or ``"1h"``)."""

    ttl: str = "5m"
    raw: Any = None


@dataclass(frozen=True, slots=True)
class Block:
    """One cacheable unit of a request, in prefix order. See the module docstring for the fields."""

    path: str
    section: Section
    kind: str
    data: bytes
    env: bytes
    digest: bytes
    tokens: int
    message: int | None = None
    name: str | None = None
    marker: Marker | None = None
    empty: bool = False

    @property
    def is_option(self) -> bool:
        """True for option blocks (zero tokens, not a content block for lookback counting)."""
        return self.section == "option"

    def with_marker(self, marker: Marker | None) -> Block:
        """This block carrying ``marker`` (a copy; cheaper than ``dataclasses.replace`` on the hot path)."""
        return Block(
            self.path, self.section, self.kind, self.data, self.env, self.digest, self.tokens, self.message,
            self.name, marker, self.empty,
        )  # fmt: skip

    def at(self, path: str, marker: Marker | None) -> Block:
        """This block at ``path`` carrying ``marker`` (a tool sent in another position)."""
        return Block(
            path, self.section, self.kind, self.data, self.env, self.digest, self.tokens, self.message, self.name,
            marker, self.empty,
        )  # fmt: skip

    def unit(self) -> Any:
        """The wire unit as sent (markers stripped), parsed again in its original key order (numbers as written)."""
        return parse(self.data)

    def text(self) -> str:
        """Human text of the block: the string for text units, else the JSON text."""
        u = self.unit()
        if isinstance(u, str):
            return u
        if isinstance(u, dict):
            for key in ("text", "content"):
                value = u.get(key)
                if isinstance(value, str):
                    return value
        return self.data.decode()


@dataclass(frozen=True, slots=True)
class CanonicalRequest:
    """A wire request as a chain of blocks plus the routing fields outside the chain.

    ``cum_tokens[i]`` is the number of prompt tokens in blocks ``0..i`` (inclusive).
    ``cache_key`` is OpenAI's ``prompt_cache_key`` (a partition, not content);
    ``top_marker`` is Anthropic's top-level ``cache_control`` (automatic caching), which takes one
    of the four breakpoint slots and lands on the last cacheable block. ``msg_start[k]`` is the index of
    the first block of message ``k`` (every message has at least one block; messages are consecutive);
    ``marked`` the indices of the blocks that carry a marker, ascending. ``digests``: each block's digest, in
    order (two requests share their first ``k`` blocks' bytes when their first ``k`` digests are equal).
    """

    api: str
    model: str
    blocks: tuple[Block, ...]
    chain: tuple[bytes, ...]
    cum_tokens: tuple[int, ...]
    cache_key: str | None = None
    retention: str | None = None
    top_marker: Marker | None = None
    extra: Mapping[str, Any] = field(default_factory=dict)
    msg_start: tuple[int, ...] = ()
    marked: tuple[int, ...] = ()
    digests: tuple[bytes, ...] = ()

    @property
    def tokens(self) -> int:
        """Prompt tokens of the whole request."""
        return self.cum_tokens[-1] if self.cum_tokens else 0

    def tokens_before(self, i: int) -> int:
        """Tokens in blocks ``0..i-1``."""
        return self.cum_tokens[i - 1] if i > 0 else 0

    def evolve(self, **changes: Any) -> CanonicalRequest:
        """A copy with ``changes`` (field name → value); cheaper than ``dataclasses.replace`` on the hot path."""
        f = {name: getattr(self, name) for name in _REQUEST_FIELDS}
        f.update(changes)
        return CanonicalRequest(**f)

    def markers(self) -> list[tuple[int, Marker]]:
        """Explicit block markers as ``(block index, marker)`` in prefix order."""
        return [(i, m) for i in self.marked if (m := self.blocks[i].marker) is not None]

    @property
    def head(self) -> tuple[Block, ...]:
        """The blocks before the first message: options, tools and system (Anthropic's ``system``, Responses'
        ``instructions``)."""
        return self.blocks[: self.msg_start[0]] if self.msg_start else self.blocks

    @property
    def messages(self) -> int:
        """Number of messages (conversation items)."""
        return len(self.msg_start)

    def message_span(self, k: int) -> tuple[int, int]:
        """``(first block index, last block index + 1)`` of message ``k``; raises IndexError past the end."""
        lo = self.msg_start[k]
        return lo, self.msg_start[k + 1] if k + 1 < len(self.msg_start) else len(self.blocks)


_REQUEST_FIELDS = (
    "api", "model", "blocks", "chain", "cum_tokens", "cache_key", "retention", "top_marker", "extra", "msg_start",
    "marked", "digests",
)  # fmt: skip


def common_prefix(a: CanonicalRequest, b: CanonicalRequest) -> int:
    """Number of leading blocks ``a`` and ``b`` share (by chain hash; binary search, O(log n))."""
    lo, hi = 0, min(len(a.chain), len(b.chain))
    # chain[i] equal implies every earlier block equal, so equality is monotone: binary search.
    while lo < hi:
        mid = (lo + hi + 1) // 2
        if a.chain[mid - 1] == b.chain[mid - 1]:
            lo = mid
        else:
            hi = mid - 1
    return lo


def unmarked(blocks: tuple[Block, ...]) -> tuple[Block, ...]:
    """``blocks`` without markers (the same tuple when none carries one)."""
    if all(b.marker is None for b in blocks):
        return blocks
    return tuple(b if b.marker is None else b.with_marker(None) for b in blocks)


def message_indices(req: CanonicalRequest) -> list[int]:
    """Message indices present in ``req``, ascending."""
    seen: list[int] = []
    for b in req.blocks:
        if b.message is not None and (not seen or seen[-1] != b.message):
            seen.append(b.message)
    return seen


def with_markers(req: CanonicalRequest, markers: Mapping[int, Marker], top: Marker | None = None) -> CanonicalRequest:
    """A copy of ``req`` whose block markers are exactly ``markers`` (block index → Marker) and whose
    top-level marker is ``top``. Markers are not content: digests and chain are unchanged."""
    blocks = list(req.blocks)
    # Only blocks marked now or to be marked change: a walk over the rest would cost O(n) Python work per turn.
    for i in {*markers, *req.marked}:
        want = markers.get(i)
        if blocks[i].marker != want:
            blocks[i] = blocks[i].with_marker(want)
    return req.evolve(blocks=tuple(blocks), top_marker=top, marked=tuple(sorted(markers)))


def static_end(req: CanonicalRequest) -> int:
    """Number of leading blocks before the first non-system message: options, tools and system
    (for OpenAI, the leading system/developer messages). Sessions of one agent share this part."""
    end = 0
    for i, b in enumerate(req.blocks):
        if b.section == "message":
            break
        end = i + 1
    return end
