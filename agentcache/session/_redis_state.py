"""A session snapshot as the Redis store keeps it (:func:`pack`, :func:`unpack`): zlib-compressed JSON.

A snapshot (:func:`~agentcache.session._snapshot.snapshot`) holds the body the session sent last and, when
agentcache changed it, the client's own body: two near-copies of a 46 KB conversation, encoded and compressed on
every commit. The client's body is kept as a delta of the sent one instead: the pipeline edits copy-on-write, so
every top-level value and conversation item the client's body shares with the sent one is the *same object* there
(found by identity: an equal-looking value, ``1`` against ``1.0``, is stored in full), and only the rest is
written. That halves what each commit encodes and compresses.

Stored documents: version 1 (the snapshot as is; what earlier releases wrote, still read) and version 2 (the same
with ``client`` replaced by ``client_delta``: ``order``, the client's top-level keys in order; ``same``, those whose
value is the sent one's; ``items``, per key whose list shares items with the sent one, ``[length, [[index, item],
…]]`` with the items that differ; ``values``, every other key's value). :func:`unpack` always returns version 1.
A replica of a release before version 2 refuses a version 2 document (``unknown snapshot version``, the request is
then forwarded unchanged, fail open): upgrade every replica sharing one Redis together.
"""

from __future__ import annotations

import zlib
from typing import Any

from ..model._rawjson import RawBody, encode, parse
from ..model._splice import dumps_spliced
from ._snapshot import SNAPSHOT_VERSION

__all__ = ["pack", "unpack"]

#: The stored document's version when it carries ``client_delta`` (the snapshot's own is 1).
DELTA_VERSION = 2


def pack(doc: dict[str, Any], raw: RawBody | None = None) -> bytes:
    """``doc`` (a version 1 snapshot) as stored: its client body as a delta of the sent one when both are
    objects, JSON-encoded (numbers as the client spelled them) and zlib-compressed (level 1). ``raw``: the source
    texts of the client's request body, when known: the sent body and the tools the client sent go in as those
    texts (:func:`~agentcache.model._splice.dumps_spliced`) instead of being encoded again; a text is found by
    identity, so another request's ``raw`` only finds none."""
    sent, client = doc.get("sent"), doc.get("client")
    if doc.get("v") == SNAPSHOT_VERSION and isinstance(sent, dict) and isinstance(client, dict):
        doc = {**doc, "v": DELTA_VERSION, "client": None, "client_delta": _delta(client, sent)}
    if raw is None:
        return zlib.compress(encode(doc).encode(), 1)
    parts = [f"{encode(key)}:{_text(key, value, raw)}" for key, value in doc.items()]
    return zlib.compress(("{" + ",".join(parts) + "}").encode(), 1)


def _text(key: str, value: Any, raw: RawBody) -> str:
    """The JSON text of the document's ``value`` under ``key``, from the client's source texts where it has them."""
    if key == "sent" and isinstance(value, dict):
        return dumps_spliced(value, raw).decode()
    if key == "tools" and isinstance(value, list):
        return "[" + ",".join([raw.text_of(unit) or encode(unit) for unit in value]) + "]"
    return encode(value)


def unpack(state: bytes) -> dict[str, Any]:
    """A stored snapshot back as a version 1 document (its client body rebuilt). Raises ``zlib.error`` or
    ``ValueError`` for bytes that are not one."""
    doc: dict[str, Any] = parse(zlib.decompress(state))
    if doc.get("v") == DELTA_VERSION:
        delta = doc.pop("client_delta")
        doc["client"], doc["v"] = _apply(delta, doc["sent"]), SNAPSHOT_VERSION
    return doc


def _delta(client: dict[str, Any], sent: dict[str, Any]) -> dict[str, Any]:
    """``client`` as what differs from ``sent`` (see the module docstring); identity, never equality, decides."""
    same: list[str] = []
    items: dict[str, Any] = {}
    values: dict[str, Any] = {}
    for key, value in client.items():
        other = sent.get(key, _ABSENT)
        if value is other:
            same.append(key)
        elif isinstance(value, list) and isinstance(other, list):
            items[key] = [len(value), [[i, x] for i, x in enumerate(value) if i >= len(other) or x is not other[i]]]
        else:
            values[key] = value
    return {"order": list(client), "same": same, "items": items, "values": values}


def _apply(delta: dict[str, Any], sent: dict[str, Any]) -> dict[str, Any]:
    """The client body :func:`_delta` described, rebuilt over ``sent``."""
    same, items, values = set(delta["same"]), delta["items"], delta["values"]
    out: dict[str, Any] = {}
    for key in delta["order"]:
        if key in same:
            out[key] = sent[key]
        elif key in items:
            length, changed = items[key]
            base = sent[key]
            new = dict((int(i), x) for i, x in changed)
            out[key] = [new[i] if i in new else base[i] for i in range(int(length))]
        else:
            out[key] = values[key]
    return out


_ABSENT = object()
