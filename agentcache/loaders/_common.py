"""Helpers shared by the loaders: reading files, session naming, time ordering.

Every per-format loader has the signature ``(path, doc, ...) -> Loaded``: ``doc`` is the already parsed JSON
document (or ``None`` for JSONL, which is read line by line), and ``Loaded`` is ``(records, errors)``, where
``errors`` holds one :class:`InputError` per malformed record that was skipped.
"""

from __future__ import annotations

import json
import math
from pathlib import Path
from typing import Any

from agentcache._exceptions import InputError
from agentcache.loaders._record import Record

Loaded = tuple[list[Record], list[InputError]]


def read_text(path: Path) -> str:
    """The file as UTF-8 text; an unreadable file raises :class:`InputError`."""
    try:
        return path.read_text(encoding="utf-8")
    except (OSError, UnicodeDecodeError) as exc:
        raise InputError(f"cannot read file: {exc}", source=str(path)) from exc


def read_json(path: Path) -> Any:
    """The file parsed as one JSON document (object key order preserved)."""
    text = read_text(path)
    try:
        return json.loads(text)
    except json.JSONDecodeError as exc:
        raise InputError(f"invalid JSON: {exc}", source=str(path)) from exc


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
