"""Helpers shared by the loaders: reading files, session naming, time ordering.

Every per-format loader has the signature ``(path, doc, ...) -> Loaded``: ``doc`` is the already parsed JSON
document (or ``None`` for JSONL, which is read line by line), and ``Loaded`` is ``(records, errors)``, where
``errors`` holds one :class:`InputError` per malformed record that was skipped.
"""

from __future__ import annotations

import json
import math
import os
import re
import stat
from pathlib import Path
from typing import Any

from agentcache._exceptions import InputError
from agentcache.loaders._record import Record

Loaded = tuple[list[Record], list[InputError]]


#: The largest JSON document read whole (the formats that are one document: tau-bench results, trajectories,
#: cases; about ten times as much memory once parsed). A larger file is an error, judged before it is read.
MAX_DOCUMENT_BYTES = 256 << 20


def read_head(path: Path, size: int) -> bytes:
    """At most the first ``size`` bytes of ``path``; an unreadable file raises :class:`InputError`."""
    try:
        with path.open("rb") as f:
            return f.read(size)
    except OSError as exc:
        raise InputError(f"cannot read file: {exc.strerror or exc}", source=str(path)) from exc


def read_text(path: Path, limit: int = MAX_DOCUMENT_BYTES) -> str:
    """The file as UTF-8 text; raises :class:`InputError` for an unreadable file or one of more than ``limit``
    bytes (a regular file by its size, before reading; a device or a pipe once ``limit`` bytes came)."""
    try:
        with path.open("rb") as f:
            info = os.fstat(f.fileno())
            if stat.S_ISREG(info.st_mode) and info.st_size > limit:
                raise _too_large(path, limit)
            data = f.read(limit + 1)
        if len(data) > limit:
            raise _too_large(path, limit)
        return data.decode("utf-8")
    except (OSError, UnicodeDecodeError) as exc:
        raise InputError(f"cannot read file: {exc}", source=str(path)) from exc


def _too_large(path: Path, limit: int) -> InputError:
    return InputError(
        f"larger than {limit >> 20} MiB: too large to read as one JSON document (record JSONL: one request per line)",
        source=str(path),
    )


def read_json(path: Path) -> Any:
    """The file parsed as one JSON document (object key order preserved); raises :class:`InputError` for
    invalid JSON or a document nested too deeply for the parser."""
    text = read_text(path)
    try:
        return json.loads(text)
    except json.JSONDecodeError as exc:
        raise InputError(f"invalid JSON: {exc}", source=str(path)) from exc
    except RecursionError as exc:
        raise InputError(f"invalid JSON: {problem(exc)}", source=str(path)) from exc


def problem(exc: BaseException) -> str:
    """One line saying why a record could not be read, for whatever ``exc`` reading it raised: a
    ``ValueError``'s own message (the loaders describe bad records that way), else the exception's kind and
    text (a loader's own bug must cost one record, not the file, and still name it)."""
    if isinstance(exc, RecursionError):
        return "nested too deeply to read"
    if isinstance(exc, ValueError) and not isinstance(exc, UnicodeError):
        return str(exc)
    return f"cannot read ({type(exc).__name__}: {exc})"


#: A JSON escape of a UTF-16 surrogate; only a pair of them (high, low) is a character.
_SURROGATE_ESCAPE = re.compile(r"\\u[dD][89a-fA-F][0-9a-fA-F]{2}")


def check_unicode(raw: str, value: Any) -> None:
    """Raise ``ValueError`` when ``value`` (parsed from the JSON text ``raw``) holds a lone surrogate: valid
    JSON syntax (RFC 8259 §8.2), but no Unicode text: it has no UTF-8 bytes to hash or count. Only texts that
    spell a surrogate escape are checked."""
    if _SURROGATE_ESCAPE.search(raw) is None:
        return
    try:
        json.dumps(value, ensure_ascii=False).encode("utf-8")
    except UnicodeEncodeError as exc:
        raise ValueError(f"holds a lone surrogate (\\u{ord(exc.object[exc.start]):04x}): not Unicode text") from None


def session_id(path: Path, name: str | None = None) -> str:
    """``<stem>/<name>``, or just ``<stem>`` for single-session files (unique across files)."""
    return path.stem if name is None else f"{path.stem}/{name}"


def is_number(value: Any) -> bool:
    """True for a finite int/float that is not a bool (JSON numbers usable as ``at``)."""
    return isinstance(value, int | float) and not isinstance(value, bool) and math.isfinite(value)


def in_time_order(records: list[Record]) -> list[Record]:
    """Records sorted stably by ``at``; a record without ``at`` keeps its place after its predecessor."""
    keys: list[float] = []
    last = -math.inf
    for rec in records:
        if rec.at is not None:
            last = rec.at
        keys.append(last)
    order = sorted(range(len(records)), key=keys.__getitem__)
    return [records[i] for i in order]
