"""Claude Code's own records of its requests (2.1.332 transcripts), rebuilt into the exact request bodies.

Facts (observed running Claude Code 2.1.332 against ``tests/clients/fake_upstream.py`` and comparing with every body
the upstream received; the rules read in its bundled JavaScript, never copied). Claude Code records each main and
subagent request (``querySource`` ``sdk``/``repl_main_thread``/``agent:...``; not compaction or side calls) in the
transcript that holds its answer:

* ``api-request-shape`` {``shapeHash``, ``shape``: {``system``, ``tools``}}: the system blocks after the first (the
  ``x-anthropic-billing-header: ...`` block is left out) and the tools, without their ``cache_control``; written
  once per shape.
* ``api-request-blob`` {``hash``, ``message``}: a message (``cache_control`` keys removed at any depth) that no
  transcript line holds. ``hash`` is sha256 of the message's canonical JSON (sorted keys, compact separators,
  non-ASCII as is; a string ``content`` counted as one text block; no ``cache_control``).
* ``api-request`` {``id``, ``base``, ``keep``, ``tail``, ``params``, ``shapeHash``, ``cacheControl``, ``thread``,
  ``requestDigest``, ``agentId``?, ``withheld``?, ``cut``?}: the messages are the first ``keep`` of request
  ``base`` followed by the messages whose hashes ``tail`` lists: a blob, or a run of transcript lines (consecutive
  ``user`` lines, or the ``assistant`` lines of one ``message.id``) hashed as ``{"content": [blocks...],
  "role": ...}`` (a compaction boundary ends a run). ``params`` holds the other body fields (``betas`` among them:
  the SDK sends those as the ``anthropic-beta`` header). ``cacheControl`` lists each marker as {``path``,
  ``value``}, ``path`` into ``system`` (without the billing block), ``tools`` or ``messages``.
* ``requestDigest``: sha256 of the canonical JSON of {``params``, ``system`` (no billing block), ``tools``,
  ``messages`` (string contents as one text block), markers included}: every rebuilt body is checked against it.
* What the records leave out, rebuilt from elsewhere: the billing block (``cc_version=<version>.<3 hex>;
  cc_entrypoint=<entrypoint>;`` plus `` cc_is_subagent=true;`` for a subagent; the 3 hex are sha256 of
  ``59cf53e54c78`` + the characters 4, 7 and 20 of the conversation's first user text + the version); ``metadata``
  (``user_id``: the JSON of ``device_id``, the config's ``userID``, ``account_uuid``, ``session_id``), read from
  ``.claude.json`` in the config folder (``~/.claude.json`` for ``~/.claude``; a subscriber's ``account_uuid`` is
  its ``oauthAccount.accountUuid``: read in the source, not tried); ``stream: true``. Key order on the
  wire: ``model``, ``messages``, ``system``, ``tools``, ``metadata``, the other params, ``stream``. A user message
  whose content is one plain text block is sent as a string unless it carries a marker (Claude Code turns a string
  into a block only to mark it).

Not exact, and said so in ``meta["exact"]``: a body whose ``metadata`` could not be found; a request with Message
Threads on (``thread.type`` not ``none``: the server held the history, the wire body did not); ``withheld`` params
(``CLAUDE_CODE_EXTRA_BODY``). Against Anthropic's own API Claude Code adds per-request fields to the billing block
(``cch=``, ``cc_prev_req=``, ...) that it does not record: the rebuilt block has only the fields above. A request
whose messages were cut (``cut``), whose hashes are not all found or whose digest differs is not rebuilt. Not tried:
thinking blocks (the scripted upstream answers none) and Message Threads (off unless the host is Anthropic's).
"""

from __future__ import annotations

import functools
import hashlib
import json
import re
from collections import OrderedDict
from pathlib import Path
from typing import Any

__all__ = ["RequestLog", "canonical", "fingerprint"]

#: Body fields Claude Code leaves out of ``params`` and of ``requestDigest``.
_UNRECORDED = frozenset({"metadata", "stream", "thread", "diagnostics", "safeguards", "data_flow"})
_FINGERPRINT_SALT = "59cf53e54c78"
_LONE_SURROGATE = re.compile(r"[\ud800-\udfff]")


def canonical(value: Any) -> bytes:
    """``value`` as JavaScript's ``JSON.stringify`` writes it with sorted keys: compact, non-ASCII as is, a lone
    surrogate as a ``\\uXXXX`` escape (the bytes Claude Code hashes)."""
    text = json.dumps(value, sort_keys=True, separators=(",", ":"), ensure_ascii=False)
    try:
        return text.encode("utf-8")
    except UnicodeEncodeError:
        return _LONE_SURROGATE.sub(lambda m: f"\\u{ord(m.group()):04x}", text).encode("utf-8")


def fingerprint(text: str, version: str) -> str:
    """The 3 hex digits after ``cc_version=<version>.``: sha256 of the salt, the UTF-16 code units 4, 7 and 20 of
    the conversation's first user text (``0`` past its end) and the version."""
    units = text.encode("utf-16-le", "surrogatepass")
    picked = "".join(
        units[2 * i : 2 * i + 2].decode("utf-16-le", "surrogatepass") if 2 * i + 2 <= len(units) else "0"
        for i in (4, 7, 20)
    )
    return hashlib.sha256(f"{_FINGERPRINT_SALT}{picked}{version}".encode("utf-8", "surrogatepass")).hexdigest()[:3]


@functools.lru_cache(maxsize=64)
def _config_ids(config_dir: str) -> tuple[str, str] | None:
    """``(device_id, account_uuid)`` from the Claude Code config of ``config_dir`` (its ``projects`` parent), or
    None when no config file names a ``userID``."""
    root = Path(config_dir)
    candidates = [root / ".claude.json"]
    if root.name == ".claude":
        candidates.append(root.parent / ".claude.json")
    for candidate in candidates:
        try:
            doc = json.loads(candidate.read_text(encoding="utf-8"))
        except (OSError, ValueError):
            continue
        if isinstance(doc, dict) and isinstance(doc.get("userID"), str):
            account = doc.get("oauthAccount")
            uuid = account.get("accountUuid") if isinstance(account, dict) else None
            return doc["userID"], uuid if isinstance(uuid, str) else ""
    return None


def _config_dir(path: Path) -> str | None:
    """The Claude Code config folder a transcript lives in (the parent of its ``projects`` folder), or None."""
    for parent in path.parents:
        if parent.name == "projects":
            return str(parent.parent)
    return None


def _text_of(content: Any) -> str:
    """A user message's first text (Claude Code's fingerprint input)."""
    if isinstance(content, str):
        return content
    for block in content if isinstance(content, list) else []:
        if isinstance(block, dict) and block.get("type") == "text" and isinstance(block.get("text"), str):
            return str(block["text"])
    return ""


def _strip_markers(value: Any) -> Any:
    if isinstance(value, dict):
        return {k: _strip_markers(v) for k, v in value.items() if k != "cache_control"}
    if isinstance(value, list):
        return [_strip_markers(v) for v in value]
    return value


def _underlying(message: dict[str, Any]) -> dict[str, Any]:
    """The message as Claude Code holds it: one plain text block of a user/system message is a string (a blob keeps
    the block form a marker gave it when it was recorded)."""
    content = message.get("content")
    if message.get("role") != "assistant" and isinstance(content, list) and len(content) == 1:
        block = content[0]
        if isinstance(block, dict) and list(block) == ["type", "text"] and block["type"] == "text":
            return {**message, "content": block["text"]}
    return message


class _Runs:
    """Hashes of the runs of transcript lines, as Claude Code hashes them, each with its message; the canonical bytes
    of the latest few messages are kept (the next request adds them: hashing it need not serialize them again)."""

    RECENT = 16

    def __init__(self) -> None:
        self.messages: dict[str, dict[str, Any]] = {}
        self.recent: OrderedDict[int, tuple[dict[str, Any], bytes]] = OrderedDict()
        self._role: str | None = None
        self._id: str | None = None
        self._parts: list[bytes] = []
        self._blocks: list[Any] = []
        self._string: str | None = None

    def reset(self) -> None:
        self._role = None

    def note(self, role: str, message_id: str | None, content: Any) -> None:
        same = self._role == role and (role == "user" or (message_id is not None and message_id == self._id))
        blocks = [{"type": "text", "text": content}] if isinstance(content, str) else content
        if not isinstance(blocks, list):
            self.reset()
            return
        if not same:
            self._role, self._id, self._parts, self._blocks = role, message_id, [], []
            self._string = content if isinstance(content, str) else None
        else:
            self._string = None
        for block in blocks:
            raw = canonical(block)
            self._parts.append(canonical(_strip_markers(block)) if b'"cache_control"' in raw else raw)
            self._blocks.append(block)
        data = b'{"content":[' + b",".join(self._parts) + b'],"role":' + canonical(role) + b"}"
        message = {"role": role, "content": self._string if self._string is not None else list(self._blocks)}
        self.messages[hashlib.sha256(data).hexdigest()] = message
        self.recent[id(message)] = (message, data)
        if len(self.recent) > self.RECENT:
            self.recent.popitem(last=False)

    def bytes_of(self, message: dict[str, Any]) -> bytes | None:
        """The canonical bytes of a recent run message (no markers), or None."""
        known = self.recent.get(id(message))
        return known[1] if known is not None and known[0] is message else None


class _Marked:
    """Markers put back on a body's parts, copying only the containers on each marker's path."""

    @staticmethod
    def apply(root: dict[str, Any], markers: Any) -> bool:
        """Set each ``{"path", "value"}`` marker in ``root`` (whose lists and dicts are shared with other bodies:
        every container on a path is copied before it is changed). False when a path does not fit."""
        for marker in markers if isinstance(markers, list) else []:
            path = marker.get("path") if isinstance(marker, dict) else None
            if not isinstance(path, list) or not path or not _Marked._set(root, path, marker.get("value")):
                return False
        return True

    @staticmethod
    def _set(root: dict[str, Any], path: list[Any], value: Any) -> bool:
        node: Any = root
        for depth, step in enumerate(path):
            child = _Marked._child(node, step)
            if child is None:
                return False
            if isinstance(child, str) and depth + 1 < len(path) and path[depth + 1] == 0 and step == "content":
                child = [{"type": "text", "text": child}]  # a string content is marked as one text block
            elif isinstance(child, dict):
                child = dict(child)
            elif isinstance(child, list):
                child = list(child)
            else:
                return False
            node[step] = child
            node = child
        if not isinstance(node, dict):
            return False
        node["cache_control"] = value
        return True

    @staticmethod
    def _child(node: Any, step: Any) -> Any:
        if isinstance(node, dict) and isinstance(step, str):
            return node.get(step)
        if isinstance(node, list) and isinstance(step, int) and not isinstance(step, bool) and 0 <= step < len(node):
            return node[step]
        return None


class RequestLog:
    """The request records of one transcript (``note`` each parsed line in file order), rebuilt on demand.

    ``body(ref)`` gives ``(body, meta)`` for the ``api-request`` line ``ref`` (an ``assistant`` line's
    ``requestRef``), or None when that request cannot be rebuilt (see the module docstring). ``meta``:
    ``querySource``, ``betas``, ``exact`` and, when not exact, ``inexact`` (the reasons).
    """

    def __init__(self, path: Path) -> None:
        self.path = path
        self.runs = _Runs()
        self.shapes: dict[str, dict[str, Any]] = {}
        self.blobs: dict[str, dict[str, Any]] = {}
        self.requests: dict[str, dict[str, Any]] = {}
        self.messages: dict[str, list[dict[str, Any]] | None] = {}
        self.first_text: str | None = None
        self.entrypoint = "unknown"
        self._canon: dict[int, tuple[Any, bytes]] = {}  # id -> (a system block or tool, kept alive; its bytes)
        self._chain: tuple[bytes, list[dict[str, Any]], list[Any]] | None = None  # the last digest's messages

    def note(self, obj: dict[str, Any]) -> None:
        """Take one transcript line into account."""
        kind = obj.get("type")
        if kind == "api-request":
            self._request(obj)
        elif kind == "api-request-blob" and isinstance(obj.get("hash"), str) and isinstance(obj.get("message"), dict):
            self.blobs[obj["hash"]] = _underlying(obj["message"])
        elif (
            kind == "api-request-shape" and isinstance(obj.get("shapeHash"), str) and isinstance(obj.get("shape"), dict)
        ):
            self.shapes[obj["shapeHash"]] = obj["shape"]
        elif kind == "system" and obj.get("subtype") == "compact_boundary":
            self.runs.reset()
            self.first_text = None
        elif kind in ("user", "assistant") and isinstance(obj.get("message"), dict):
            self._message(obj, obj["message"])

    def _message(self, obj: dict[str, Any], message: dict[str, Any]) -> None:
        role, content = message.get("role"), message.get("content")
        if not isinstance(role, str) or content is None:
            self.runs.reset()
            return
        if isinstance(obj.get("entrypoint"), str):
            self.entrypoint = obj["entrypoint"]
        if role == "user" and self.first_text is None and obj.get("isMeta") is not True:
            text = _text_of(content)
            self.first_text = text if text or isinstance(content, str) else None
        mid = message.get("id")
        self.runs.note(role, mid if isinstance(mid, str) else None, content)

    def _request(self, obj: dict[str, Any]) -> None:
        rid = obj.get("id")
        if not isinstance(rid, str):
            return
        base, keep, tail = obj.get("base"), obj.get("keep"), obj.get("tail")
        kept: list[dict[str, Any]] | None = []
        if isinstance(keep, int) and keep > 0:
            previous = self.messages.get(base) if isinstance(base, str) else None
            kept = previous[:keep] if previous is not None and len(previous) >= keep else None
        found = [self.blobs.get(h) or self.runs.messages.get(h) for h in tail] if isinstance(tail, list) else [None]
        self.messages[rid] = None if kept is None or any(m is None for m in found) else kept + found  # type: ignore[operator]
        self.requests[rid] = {**obj, "_first_text": self.first_text or "", "_entrypoint": self.entrypoint}

    def body(self, ref: str) -> tuple[dict[str, Any], dict[str, Any]] | None:
        """The request body recorded as ``ref`` and what is known of it (see the class docstring), or None."""
        obj, messages = self.requests.get(ref), self.messages.get(ref)
        params, shape = (obj or {}).get("params"), self.shapes.get(str((obj or {}).get("shapeHash")))
        if obj is None or messages is None or not isinstance(params, dict) or shape is None or "cut" in obj:
            return None
        logical: dict[str, Any] = {"system": list(shape.get("system") or []), "messages": list(messages)}
        if "tools" in shape:
            logical["tools"] = list(shape["tools"])
        if not _Marked.apply(logical, obj.get("cacheControl")) or self._digest(params, logical) != obj.get(
            "requestDigest"
        ):
            return None
        return self._wire(obj, params, logical)

    def _wire(
        self, obj: dict[str, Any], params: dict[str, Any], logical: dict[str, Any]
    ) -> tuple[dict[str, Any], dict[str, Any]]:
        """The body as sent: the billing block first, ``metadata`` and ``stream`` back, params in their order."""
        version = str(obj.get("version") or "")
        subagent = " cc_is_subagent=true;" if obj.get("agentId") else ""
        billing = (
            f"x-anthropic-billing-header: cc_version={version}.{fingerprint(obj['_first_text'], version)}; "
            f"cc_entrypoint={obj['_entrypoint']};{subagent}"
        )
        body: dict[str, Any] = {"model": params.get("model"), "messages": logical["messages"]}
        body["system"] = [{"type": "text", "text": billing}, *logical["system"]]
        if "tools" in logical:
            body["tools"] = logical["tools"]
        inexact: list[str] = []
        config = _config_dir(self.path)
        ids = _config_ids(config) if config is not None else None
        if ids is not None and isinstance(obj.get("sessionId"), str):
            user = {"device_id": ids[0], "account_uuid": ids[1], "session_id": obj["sessionId"]}
            body["metadata"] = {"user_id": json.dumps(user, separators=(",", ":"), ensure_ascii=False)}
        else:
            inexact.append("metadata")
        body.update((k, v) for k, v in params.items() if k not in ("model", "betas"))
        body["stream"] = True
        thread = obj.get("thread")
        if isinstance(thread, dict) and thread.get("type") not in (None, "none"):
            inexact.append("thread")
        if [w for w in obj.get("withheld") or [] if w != "thread"]:
            inexact.append("withheld")
        meta: dict[str, Any] = {
            "querySource": obj.get("querySource"),
            "betas": params.get("betas"),
            "exact": not inexact,
        }
        if inexact:
            meta["inexact"] = inexact
        return body, meta

    def _digest(self, params: dict[str, Any], logical: dict[str, Any]) -> str:
        """``requestDigest`` of a rebuilt request. The hash state after each message is kept, so a request that
        extends the previous one (the same message objects first) hashes only what it adds."""
        fields = {**{k: v for k, v in params.items() if k not in _UNRECORDED}, **logical}
        keys = sorted(fields)
        at = keys.index("messages")
        head = b"{" + b"".join(canonical(k) + b":" + self._value(fields[k]) + b"," for k in keys[:at])
        head += b'"messages":['
        messages: list[dict[str, Any]] = fields["messages"]
        chain = self._chain if self._chain is not None and self._chain[0] == head else None
        same, states = 0, []
        if chain is not None:
            limit = min(len(chain[1]), len(messages))
            while same < limit and chain[1][same] is messages[same]:
                same += 1
            states = chain[2][:same]
        h = states[-1].copy() if states else hashlib.sha256(head)
        for n in range(same, len(messages)):
            data = self.runs.bytes_of(messages[n]) or self._message_bytes(messages[n])
            h.update(b"," + data if n else data)
            states.append(h.copy())
        self._chain = (head, list(messages), states)
        h.update(b"]" + b"".join(b"," + canonical(k) + b":" + self._value(fields[k]) for k in keys[at + 1 :]) + b"}")
        return h.hexdigest()

    @staticmethod
    def _message_bytes(message: dict[str, Any]) -> bytes:
        content = message.get("content")
        normal = {**message, "content": [{"type": "text", "text": content}]} if isinstance(content, str) else message
        return canonical(normal)

    def _value(self, value: Any) -> bytes:
        """Canonical bytes of a field; a list's elements (system blocks, tools: shared by most requests) once each."""
        if not isinstance(value, list):
            return canonical(value)
        parts = []
        for item in value:
            cached = self._canon.get(id(item))
            if cached is None or cached[0] is not item:
                cached = self._canon[id(item)] = (item, canonical(item))
            parts.append(cached[1])
        return b"[" + b",".join(parts) + b"]"
