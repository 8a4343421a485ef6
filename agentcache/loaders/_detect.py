"""Format detection: the file extension first, then the JSON shape.

- ``.jsonl`` -> ``jsonl``; ``.traj`` -> ``swe-agent``;
- object with ``requests`` and ``expect`` -> ``case``; object with ``trajectory`` or ``history`` and with
  ``info`` or ``environment`` -> ``swe-agent``; object with ``session``, ``api`` and ``body`` -> ``jsonl``
  (a one-line log);
- list whose first element has ``traj`` and ``task_id`` -> ``taubench``; list of objects that all have
  ``source`` and ``action`` or ``observation`` -> ``openhands``; list of objects that all have ``role`` ->
  ``chat``;
- a first line that is a JSONL record -> ``jsonl`` (streamed; anything else is read whole, at most
  :data:`~agentcache.loaders._common.MAX_DOCUMENT_BYTES`, and a start that is neither ``{`` nor ``[`` is no
  format at all, judged on the first bytes);
- an agent's own log (:data:`~agentcache.loaders._formats.LOG_FORMATS`): a ``.jsonl`` file whose first JSON lines
  the format's ``sniff_lines`` recognises (a ``.jsonl`` file no agent format claims is ``jsonl``), or any other
  file its ``sniff_path`` recognises (checked before the JSON shapes above).
"""

from __future__ import annotations

import json
from pathlib import Path
from typing import Any

from agentcache._exceptions import InputError, UnknownFormatError
from agentcache.loaders._common import problem, read_head, read_text
from agentcache.loaders._formats import LOG_FORMATS

#: Formats of recorded requests with their bodies, then the agents' own log formats.
RECORD_FORMATS: tuple[str, ...] = ("taubench", "swe-agent", "openhands", "chat", "case", "jsonl")
FORMATS: tuple[str, ...] = RECORD_FORMATS + tuple(f.name for f in LOG_FORMATS)
#: How many leading JSON lines of a ``.jsonl`` file an agent format may look at, and how many bytes at most.
SNIFF_LINES = 20
SNIFF_BYTES = 1 << 22
#: The keys every line of a JSONL request log has.
JSONL_KEYS = frozenset({"session", "api", "body"})


def shape_format(doc: Any) -> str | None:
    """The format a parsed JSON document looks like, or None."""
    if isinstance(doc, dict):
        if "requests" in doc and "expect" in doc:
            return "case"
        if ("trajectory" in doc or "history" in doc) and ("info" in doc or "environment" in doc):
            return "swe-agent"
        if doc.keys() >= JSONL_KEYS:
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
    return isinstance(obj, dict) and obj.keys() >= JSONL_KEYS


def first_objects(path: Path) -> list[dict[str, Any]]:
    """The JSON objects among the first :data:`SNIFF_LINES` lines of ``path`` (at most :data:`SNIFF_BYTES`
    read; a line that does not parse is passed over). Raises InputError when the file cannot be read."""
    out: list[dict[str, Any]] = []
    budget = SNIFF_BYTES
    try:
        with path.open("rb") as f:
            for _ in range(SNIFF_LINES):
                line = f.readline(budget)
                if not line:
                    break
                budget -= len(line)
                try:
                    obj = json.loads(line)
                except (ValueError, RecursionError):
                    obj = None
                if isinstance(obj, dict):
                    out.append(obj)
                if budget <= 0:
                    break
    except OSError as exc:
        raise InputError(f"cannot read file: {exc.strerror or exc}", source=str(path)) from exc
    return out


def log_format(path: Path) -> str | None:
    """The agent log format of ``path`` (:data:`~agentcache.loaders._formats.LOG_FORMATS`), or None."""
    if path.suffix.lower() == ".jsonl":
        first = first_objects(path)
        return next((f.name for f in LOG_FORMATS if first and f.sniff_lines(first)), None)
    return next((f.name for f in LOG_FORMATS if f.sniff_path(path)), None)


#: Agents' own files that keep no API usage, by name, with what to do instead of auditing them.
_USAGELESS = {
    name: "aider's chat history keeps no API usage; record its traffic with `agentcache proxy --record DIR` "
    "(docs/integrations.md) and audit DIR"
    for name in (".aider.chat.history.md", ".aider.input.history")
}


def sniff(path: Path) -> tuple[str, Any]:
    """``(format, parsed document)``; the document is None when not parsed (JSONL, ``.traj``, agent logs).

    Raises UnknownFormatError naming the file when no format matches, InputError when unreadable.
    """
    suffix = path.suffix.lower()
    agent = log_format(path)
    if agent is not None:
        return agent, None
    if suffix == ".jsonl":
        return "jsonl", None
    if suffix == ".traj":
        return "swe-agent", None
    head = read_head(path, SNIFF_BYTES)  # judged on its start: a device or a huge file is never read whole to sniff
    if head.lstrip()[:1] not in (b"{", b"["):
        if path.name in _USAGELESS:
            raise UnknownFormatError(f"{path.name}: {_USAGELESS[path.name]}", source=str(path))
        raise UnknownFormatError(f"unknown format: {path.name} is neither JSON nor JSONL", source=str(path))
    if _first_line_is_record(head.decode("utf-8", "replace")):
        return "jsonl", None  # streamed, line by line
    text = read_text(path)
    try:
        doc = json.loads(text)
    except (json.JSONDecodeError, RecursionError) as exc:
        raise UnknownFormatError(
            f"unknown format: {path.name} is neither JSON nor JSONL ({problem(exc)})", source=str(path)
        ) from exc
    fmt = shape_format(doc)
    if fmt is None:
        raise UnknownFormatError(f"unknown format: {path.name} matches none of {', '.join(FORMATS)}", source=str(path))
    return fmt, doc
