"""Sessions without client changes: tenants, session ids, and the prefix index that infers them.

A request's session is, in order: the ``x-agentcache-session`` header (``x-agentcache-parent`` names the
forking session of a subagent); else OpenAI's ``prompt_cache_key``; else inferred from the prefix index.

**Tenants.** Every session lives in the namespace of the caller's API key (``x-api-key``, ``api-key``, or an
``Authorization: Bearer`` token), hashed with a salt: one tenant can never see, match or close another's
session. The key itself is never stored or logged.

**Inference.** A request's *checkpoints* are the hash chain over its messages (compact JSON, cache markers
stripped), one hash per message boundary. Tools, system and options are left out, so a reordered tool list,
a changed date in the system prompt or a model switch still finds its session and is diagnosed as a break.
Each live session indexes the last ``index_checkpoints`` checkpoints of its latest request, the deepest one
marked as its *head*. The new request's deepest checkpoint that is some session's head wins (the request
extends, or repeats, that session's last request). Without one, its deepest checkpoint inside a session's
history wins when it covers at least ``min_inner_match`` messages and the request goes beyond it (the client
edited or elided history). Anything else starts a new session, so two conversations that merely open with
the same first message stay apart. A checkpoint names one session, the last to send it: two sessions with
identical histories cannot be told apart without an explicit id. Sessions with an explicit id are not
indexed.
"""

from __future__ import annotations

import json
import secrets
from collections import OrderedDict
from collections.abc import Callable, Mapping, Sequence
from dataclasses import dataclass, field
from hashlib import blake2b
from typing import Any

from .._exceptions import InputError
from ..model._fields import SessionSignal
from ..model._rawjson import RawBody, strip_markers
from ..session._pipeline import ScopeMemory, SessionPipeline

__all__ = [
    "ANONYMOUS",
    "STATE_BYTES_PER_BODY_BYTE",
    "LiveSession",
    "ScopeRegistry",
    "checkpoints_of",
    "conversation_of",
    "index_entries",
    "match_checkpoints",
    "new_session_id",
    "tenant_of",
]

ANONYMOUS = "anonymous"
#: A session's pipeline state costs about this many bytes per byte of its last request body (the body kept
#: as sent, its canonical blocks and the block cache; measured ~9-10x on tau-bench-shaped bodies).
STATE_BYTES_PER_BODY_BYTE = 10
_MARKER_KEYS = frozenset({"cache_control", "prompt_cache_breakpoint"})
_SYSTEM_ROLES = frozenset({"system", "developer"})
_encode = json.JSONEncoder(separators=(",", ":")).encode
_KEY_HEADERS = ("x-api-key", "api-key")


def tenant_of(headers: Mapping[str, str], salt: str) -> str:
    """The tenant of a request: a salted 16-hex-digit hash of its API key, or ``anonymous`` without one."""
    key = next((headers[h] for h in _KEY_HEADERS if headers.get(h)), None)
    if key is None:
        auth = headers.get("authorization", "")
        scheme, _, token = auth.partition(" ")
        key = token.strip() if scheme.lower() == "bearer" and token.strip() else None
    if key is None:
        return ANONYMOUS
    return blake2b(key.encode(), digest_size=8, key=salt.encode()[:64]).hexdigest()


def new_session_id() -> str:
    """A fresh id for an inferred session."""
    return "s-" + secrets.token_hex(8)


def _unmarked(unit: Any) -> Any:
    """A message without cache markers (on the message or its content blocks): moving a marker is not an edit."""
    if not isinstance(unit, dict):
        return unit
    content = unit.get("content")
    if isinstance(content, list) and any(isinstance(c, dict) and _MARKER_KEYS & c.keys() for c in content):
        content = [{k: v for k, v in c.items() if k not in _MARKER_KEYS} if isinstance(c, dict) else c for c in content]
        unit = {**unit, "content": content}
    if _MARKER_KEYS & unit.keys():
        unit = {k: v for k, v in unit.items() if k not in _MARKER_KEYS}
    return unit


def conversation_of(api: str, body: Mapping[str, Any]) -> list[Any]:
    """The conversation items of a wire body: Anthropic ``messages``; Chat ``messages`` and Responses
    ``input`` without system/developer messages. Raises InputError when the body has none."""
    items = body.get("input") if api == "openai.responses" else body.get("messages")
    if isinstance(items, str) and api == "openai.responses":
        return [items]
    if not isinstance(items, list):
        raise InputError(f"{api} body needs a list of {'input' if api == 'openai.responses' else 'messages'}")
    if api == "anthropic.messages":
        return items
    return [m for m in items if not (isinstance(m, dict) and m.get("role") in _SYSTEM_ROLES)]


def checkpoints_of(api: str, body: Mapping[str, Any], raw: RawBody | None = None) -> tuple[bytes, ...]:
    """Hash chain over a request's conversation: element ``k`` names items ``0..k`` (markers stripped), seeded
    with the wire API (a session never spans two APIs). ``raw``: the body's source texts
    (:func:`agentcache.model._rawjson.loads`); an item is then hashed as the client wrote it, markers cut out,
    instead of encoded again (a client writes an unchanged item the same way every turn)."""
    out: list[bytes] = []
    h = blake2b(api.encode(), digest_size=16)
    for item in conversation_of(api, body):
        text = raw.text_of(item) if raw is not None else None
        h.update((strip_markers(text) if text is not None else _encode(_unmarked(item))).encode())
        h.update(b"\x00")
        out.append(h.copy().digest())
    return tuple(out)


def index_entries(checkpoints: Sequence[bytes], keep: int) -> list[tuple[bytes, bool]]:
    """The ``(hash, is_head)`` entries a session holds in the index for a request with ``checkpoints``."""
    tail = list(checkpoints[-keep:])
    return [(h, i == len(tail) - 1) for i, h in enumerate(tail)]


def match_checkpoints(
    checkpoints: Sequence[bytes], lookup: Callable[[bytes], tuple[str, bool] | None], min_inner: int
) -> str | None:
    """The session a request with ``checkpoints`` continues, under the rule of the module docstring: the
    deepest *head* found wins; without one, the deepest acceptable inner checkpoint; else None."""
    n = len(checkpoints)
    inner: str | None = None
    for k in range(n, 0, -1):
        hit = lookup(checkpoints[k - 1])
        if hit is None:
            continue
        sid, head = hit
        if head:
            return sid
        if inner is None and min_inner <= k < n:
            inner = sid
    return inner


@dataclass(slots=True)
class LiveSession:
    """A session as one proxy process holds it.

    ``generation``: incarnation of ``sid`` (a closed id that comes back starts the next one). ``turns``:
    requests committed in this generation. ``version``: the shared-store version ``pipe`` reflects.
    ``explicit``: the id came from the client (header or ``prompt_cache_key``) rather than inference.
    ``entries``: index hashes this session holds. ``attempts``: failed tries of the current turn.
    ``size``: estimated bytes of the session's state in this process (see :data:`STATE_BYTES_PER_BODY_BYTE`).
    """

    tenant: str
    sid: str
    generation: int
    lineage: str
    parent: str | None
    provider: str
    pipe: SessionPipeline
    explicit: bool = False
    turns: int = 0
    version: int = 0
    last_seen: float = 0.0
    closed: bool = False
    entries: tuple[bytes, ...] = ()
    attempts: int = 0
    size: int = 0

    def signal(self) -> SessionSignal:
        """The ``session_signal`` field for this session's current turn (``session_id`` is tenant-local)."""
        return SessionSignal(self.sid, self.generation, self.attempts, self.parent, self.lineage, self.turns)


#: Builds a session's pipeline: ``(tenant, provider, sid, lineage) -> SessionPipeline``.
PipelineFactory = Callable[[str, str, str, str], SessionPipeline]


@dataclass(slots=True)
class ScopeRegistry:
    """One :class:`ScopeMemory` per (tenant, provider): a provider cache scope is shared by one account's
    sessions, never across accounts. Bounded: the least recently used scope is dropped beyond ``limit``."""

    limit: int = 1024
    _scopes: OrderedDict[tuple[str, str], ScopeMemory] = field(default_factory=OrderedDict)

    def get(self, tenant: str, provider: str) -> ScopeMemory:
        """The scope of ``tenant`` on ``provider`` (created on first use)."""
        key = (tenant, provider)
        scope = self._scopes.get(key)
        if scope is None:
            scope = self._scopes[key] = ScopeMemory()
            while len(self._scopes) > self.limit:
                self._scopes.popitem(last=False)
        else:
            self._scopes.move_to_end(key)
        return scope
