"""Recorded-traffic loaders: turn agent trajectories, request logs and agents' own logs into records.

Formats with request bodies, read into :class:`Record` lists (see each module's docstring for the exact shape):
``taubench`` (tau-bench results list), ``swe-agent`` (``.traj``), ``openhands`` (event list), ``chat`` (a list of
chat messages), ``case`` (prefix-cache failure cases) and ``jsonl`` (one request per line). Agents' own logs
(:data:`~agentcache.loaders._formats.LOG_FORMATS`: Claude Code transcripts, Codex rollouts, ...) are read into
:class:`UsageRecord` lists: each API call by its reported usage, without its body.

``load(path)`` detects the format, returns the records in time order (``at``, else file order; stable) with
session ids prefixed by the file stem, and collects malformed individual records in ``errors`` instead of
failing. An unreadable file, invalid JSON or an unknown format raises :class:`InputError` /
:class:`UnknownFormatError`. :func:`load_paths` reads files, directories (recursively) and globs at once, counts
each API call once across files, and filters by time and project (:mod:`agentcache.loaders._paths`).
"""

from __future__ import annotations

import os
from collections.abc import Callable
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

from agentcache._exceptions import InputError, UnknownFormatError
from agentcache.loaders._cases import load_case
from agentcache.loaders._chatlist import load_chat
from agentcache.loaders._common import Loaded, in_time_order, read_json
from agentcache.loaders._detect import FORMATS, sniff
from agentcache.loaders._formats import LOG_FORMATS, LogFormat
from agentcache.loaders._jsonl import load_jsonl
from agentcache.loaders._openhands import load_openhands
from agentcache.loaders._record import APIS, EVENTS, Api, Record, UsageRecord
from agentcache.loaders._sweagent import load_sweagent
from agentcache.loaders._taubench import load_taubench

__all__ = [
    "APIS",
    "EVENTS",
    "FORMATS",
    "LOG_FORMATS",
    "Api",
    "LoadResult",
    "LogFormat",
    "Record",
    "UsageRecord",
    "detect_format",
    "load",
]

_LOADERS: dict[str, Callable[[Path, Any], Loaded]] = {
    "swe-agent": load_sweagent,
    "openhands": load_openhands,
    "chat": load_chat,
    "case": load_case,
    "jsonl": load_jsonl,
}


@dataclass(frozen=True, slots=True)
class LoadResult:
    """What :func:`load` read.

    ``records`` in time order, the ``format`` used, and one ``errors`` entry per malformed record that was
    skipped (each carries ``source`` and ``record``). From an agent's own log: ``usage_records`` (one per API
    call, in file order), the ``lines`` read, the lines ``ignored`` (not API calls: user messages, attachments)
    and whether the last line was ``truncated`` (a log still being written; not an error).
    """

    records: list[Record]
    format: str
    errors: list[InputError]
    usage_records: list[UsageRecord] = field(default_factory=list)
    lines: int = 0
    ignored: int = 0
    truncated: bool = False


def detect_format(path: str | os.PathLike[str]) -> str:
    """The format name of a file (one of FORMATS); raises UnknownFormatError naming the file."""
    return sniff(Path(path))[0]


def load(
    path: str | os.PathLike[str], format: str | None = None, *, tools_path: str | None = None, bodies: bool = True
) -> LoadResult:
    """Load one recorded file.

    ``format`` (one of FORMATS) skips detection; ``tools_path`` names the tool schemas for ``taubench``
    (default: ``<domain>_tools.json`` next to the file). ``bodies``: False reads an agent's log for its calls alone,
    without rebuilding the exact request bodies a log may hold (:attr:`LogFormat.read_calls`).
    """
    p = Path(path)
    doc: Any = None
    if format is None:
        format, doc = sniff(p)
    elif format not in FORMATS:
        raise UnknownFormatError(f"unknown format {format!r}; expected one of {', '.join(FORMATS)}", source=str(p))
    agent = next((f for f in LOG_FORMATS if f.name == format), None)
    if agent is not None:
        read = agent.read(p) if bodies or agent.read_calls is None else agent.read_calls(p)
        return LoadResult(
            records=in_time_order(read.records),
            format=format,
            errors=read.errors,
            usage_records=read.usage_records,
            lines=read.lines,
            ignored=read.ignored,
            truncated=read.truncated,
        )
    if doc is None and format != "jsonl":
        doc = read_json(p)
    if format == "taubench":
        records, errors = load_taubench(p, doc, tools_path)
    else:
        records, errors = _LOADERS[format](p, doc)
    return LoadResult(records=in_time_order(records), format=format, errors=errors)
