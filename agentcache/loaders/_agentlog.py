"""What the readers of agents' own logs share: streaming a log line by line, and what one file gave.

An agent's log is read as it is written: one JSON object per line, appended while the agent runs. So a last line
without its newline that does not parse is a line still being written (``truncated``), not an error; a line of a
kind that is no API call (a user message, an attachment, a queue entry) is ``ignored``, not an error; only a
line that looks like the format but cannot be read is an error (:class:`~agentcache.InputError` naming its
0-based line). Files are streamed (never held whole), so a gigabyte of transcripts costs the records it holds;
a line longer than :data:`MAX_LINE_BYTES` is an error too, skipped without being held (:func:`lines`, which the
JSONL request logs share).
"""

from __future__ import annotations

import json
import os
import stat
from collections.abc import Callable, Iterator
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

from agentcache._exceptions import InputError
from agentcache.loaders._common import problem
from agentcache.loaders._record import Record, UsageRecord

__all__ = ["MAX_LINE_BYTES", "LogRead", "json_lines", "lines", "read_each"]

#: The longest line (one record) read: a proxy recording's line holds the body as received and as sent, each up
#: to 32 MiB (``max_body_bytes``). A longer line costs itself, never the memory to hold it.
MAX_LINE_BYTES = 128 << 20


@dataclass(slots=True)
class LogRead:
    """What reading one agent log gave: its ``usage_records`` (one per API call, in file order), ``records`` (the
    calls whose exact request body the log lets a reader rebuild or holds, with that body), ``errors`` (one per
    line that could not be read), ``lines`` read, lines ``ignored`` (not API calls) and whether the last line was
    ``truncated`` (still being written)."""

    usage_records: list[UsageRecord] = field(default_factory=list)
    records: list[Record] = field(default_factory=list)
    errors: list[InputError] = field(default_factory=list)
    lines: int = 0
    ignored: int = 0
    truncated: bool = False


def lines(path: Path, limit: int | None = None) -> Iterator[tuple[int, bytes | None]]:
    """``(line index, line)`` for each line of ``path`` (split on ``\\n`` only, kept), streamed in pieces; None for
    a line of more than ``limit`` bytes, read past without being held (in a file that is no regular file, a device
    or a pipe that may never end a line, nothing after it is read). Raises :class:`InputError` when the file
    cannot be opened. ``limit``: default :data:`MAX_LINE_BYTES`."""
    limit = MAX_LINE_BYTES if limit is None else limit
    try:
        f = path.open("rb")
    except OSError as exc:
        raise InputError(f"cannot read file: {exc.strerror or exc}", source=str(path)) from exc
    with f:
        regular = stat.S_ISREG(os.fstat(f.fileno()).st_mode)
        i, size = 0, 0
        parts: list[bytes] = []
        readline, piece = f.readline, min(_CHUNK, limit)
        while chunk := readline(piece):
            done = chunk[-1:] == b"\n"
            if done and not parts:  # the usual line: one piece (at most ``limit``)
                yield i, chunk
                i += 1
                continue
            size += len(chunk)
            if size > limit:  # too long: read past it (a regular file) without holding it
                yield i, None
                if not regular:
                    return
                while not done and (chunk := readline(piece)):
                    done = chunk.endswith(b"\n")
                i, parts, size = i + 1, [], 0
                continue
            parts.append(chunk)
            if done:
                yield i, b"".join(parts)
                i, parts, size = i + 1, [], 0
        if parts:
            yield i, b"".join(parts)


_CHUNK = 1 << 20


def too_long(path: Path, i: int) -> InputError:
    """The error of line ``i`` of ``path``, longer than :data:`MAX_LINE_BYTES`."""
    return InputError(f"line longer than {MAX_LINE_BYTES / (1 << 20):g} MiB: not read", source=str(path), record=i)


def json_lines(
    path: Path, read: LogRead, skip: Callable[[bytes], bool] | None = None
) -> Iterator[tuple[int, dict[str, Any]]]:
    """``(line index, object)`` for each JSON-object line of ``path``, streamed (:func:`lines`). Blank lines are
    skipped; a line that is not a JSON object, or too long, becomes an error in ``read`` (the last line, cut short,
    sets ``read.truncated`` instead). ``skip(raw line)``: True for a line the reader knows it will ignore without
    parsing it (a cheap bytes test that spares ``json.loads`` of a big line): counted in ``lines`` and ``ignored``,
    never yielded; a last line without its newline is parsed anyway, to tell a line still being written. Raises
    :class:`InputError` when the file cannot be opened."""
    pending: tuple[int, bytes] | None = None
    for i, raw in lines(path):
        if pending is not None:
            yield from _parse(path, *pending, read, last=False, skip=skip)
            pending = None
        if raw is None:
            read.lines += 1
            read.errors.append(too_long(path, i))
        else:
            pending = (i, raw)
    if pending is not None:
        yield from _parse(path, *pending, read, last=True, skip=skip)


def _parse(
    path: Path, i: int, raw: bytes, read: LogRead, last: bool, skip: Callable[[bytes], bool] | None = None
) -> Iterator[tuple[int, dict[str, Any]]]:
    if not raw.strip():
        return
    read.lines += 1
    if skip is not None and (raw.endswith(b"\n") or not last) and skip(raw):
        read.ignored += 1
        return
    try:
        obj = json.loads(raw)
    except (ValueError, RecursionError) as exc:  # UnicodeDecodeError is a ValueError
        if last and not raw.endswith(b"\n"):
            read.truncated = True  # the agent is still writing this line
            return
        read.errors.append(
            InputError(
                problem(exc) if isinstance(exc, RecursionError) else f"invalid JSON: {exc}", source=str(path), record=i
            )
        )
        return
    if not isinstance(obj, dict):
        read.errors.append(InputError("line is not a JSON object", source=str(path), record=i))
        return
    yield i, obj


def read_each(path: Path, line: Callable[[int, dict[str, Any]], None], read: LogRead) -> LogRead:
    """Feed each JSON-object line of ``path`` to ``line(index, obj)``, which adds the calls it finds to ``read``;
    a line it fails on costs that line only (one error naming it). The lines that gave neither a call nor an error
    are counted ``ignored``. Raises :class:`InputError` when the file cannot be opened."""
    for i, obj in json_lines(path, read):
        try:
            line(i, obj)
        except Exception as exc:  # one unreadable call costs that line, never the file
            read.errors.append(InputError(problem(exc), source=str(path), record=i))
    read.ignored = read.lines - len(read.usage_records) - len(read.errors)
    return read
