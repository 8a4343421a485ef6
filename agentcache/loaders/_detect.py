"""Format detection: the file extension first, then the JSON shape.

- ``.jsonl`` -> ``jsonl``; ``.traj`` -> ``swe-agent``;
- object with ``requests`` and ``expect`` -> ``case``; object with ``trajectory`` or ``history`` and with
  ``info`` or ``environment`` -> ``swe-agent``; object with ``session``, ``api`` and ``body`` -> ``jsonl``
  (a one-line log);
- list whose first element has ``traj`` and ``task_id`` -> ``taubench``; list of objects that all have
  ``source`` and ``action`` or ``observation`` -> ``openhands``; list of objects that all have ``role`` ->
  ``chat``;
- text that is not one JSON document but whose first non-blank line is a JSONL record -> ``jsonl``.
"""

from __future__ import annotations

import json
from pathlib import Path
from typing import Any

from agentcache._exceptions import UnknownFormatError
from agentcache.loaders._common import problem, read_text

FORMATS: tuple[str, ...] = ("taubench", "swe-agent", "openhands", "chat", "case", "jsonl")
_JSONL_KEYS = frozenset({"session", "api", "body"})


def shape_format(doc: Any) -> str | None:
    """The format a parsed JSON document looks like, or None."""
    if isinstance(doc, dict):
        if "requests" in doc and "expect" in doc:
            return "case"
        if ("trajectory" in doc or "history" in doc) and ("info" in doc or "environment" in doc):
            return "swe-agent"
        if doc.keys() >= _JSONL_KEYS:
            return "jsonl"
        return None
    if not isinstance(doc, list) or not doc or not all(isinstance(item, dict) for item in doc):
        return None
    if "traj" in doc[0] and "task_id" in doc[0]:
        return "taubench"
    if all("source" in e and ("action" in e or "observation" in e) for e in doc):
        return "openhands"
    if all("role" in m for m in doc):
        return "chat"
    return None


def _first_line_is_record(text: str) -> bool:
    """True when the first non-blank line parses as a JSONL record object."""
    line = next((ln for ln in text.split("\n") if ln.strip()), "")
    try:
        obj = json.loads(line)
    except (json.JSONDecodeError, RecursionError):
        return False
    return isinstance(obj, dict) and obj.keys() >= _JSONL_KEYS


def sniff(path: Path) -> tuple[str, Any]:
    """``(format, parsed document)``; the document is None when not parsed (JSONL, ``.traj``).

    Raises UnknownFormatError naming the file when no format matches, InputError when unreadable.
    """
    suffix = path.suffix.lower()
    if suffix == ".jsonl":
        return "jsonl", None
    if suffix == ".traj":
        return "swe-agent", None
    text = read_text(path)
    try:
        doc = json.loads(text)
    except (json.JSONDecodeError, RecursionError) as exc:
        if _first_line_is_record(text):
            return "jsonl", None
        raise UnknownFormatError(
            f"unknown format: {path.name} is neither JSON nor JSONL ({problem(exc)})", source=str(path)
        ) from exc
    fmt = shape_format(doc)
    if fmt is None:
        raise UnknownFormatError(f"unknown format: {path.name} matches none of {', '.join(FORMATS)}", source=str(path))
    return fmt, doc
