"""Reading many inputs at once: files, directories (recursively) and globs; each API call counted once.

``agentcache audit ~/.claude/projects`` reads thousands of files. Here they are found (a directory is searched
for the files some format claims; files no format recognises are passed over and counted, not reported one by
one), read one at a time (each file's records are kept, never the file), and joined:

* an API call an agent's log holds twice (Claude Code copies a resumed session's history into the new session's
  file; a Codex subagent's rollout replays its parent's token counts) counts once: the first in time order
  (ties: file order), by :attr:`~agentcache.loaders.UsageRecord.call_id`;
* ``since``/``until`` (unix seconds) keep the calls made in ``[since, until)``; ``project`` keeps the calls whose
  project contains it (case-insensitive). Most records with bodies carry times relative to their file; a proxy
  recording's (``meta["recorded_by"]``) and an agent log's (``meta["call_id"]``) carry unix seconds, and only those
  are filtered by time; ``project`` filters both where a project is known.
"""

from __future__ import annotations

import glob
import os
from collections.abc import Callable, Iterable, Mapping
from dataclasses import dataclass, field
from pathlib import Path

from agentcache._exceptions import InputError
from agentcache.loaders._claude_code_bodies import join_transcript
from agentcache.loaders._detect import JSONL_KEYS, first_objects, log_format, sniff
from agentcache.loaders._formats import LOG_FORMATS, LogFormat
from agentcache.loaders._record import Record, UsageRecord

__all__ = ["FileRead", "Inputs", "default_roots", "expand", "load_paths"]

#: Suffixes worth opening when a directory is searched (an agent format may add its own).
_SUFFIXES = frozenset({".jsonl", ".json", ".traj"} | {s for f in LOG_FORMATS for s in f.suffixes})
_GLOB_CHARS = frozenset("*?[")


@dataclass(slots=True)
class FileRead:
    """What one input file gave: its ``format`` (None when it could not be read at all: ``error`` says why), the
    number of ``records`` (with bodies) and ``usage_records`` it held, its per-line ``errors``, the ``lines``
    read, lines ``ignored`` (not API calls) and whether its last line was ``truncated`` (still being written)."""

    path: Path
    format: str | None = None
    records: int = 0
    usage_records: int = 0
    errors: list[InputError] = field(default_factory=list)
    lines: int = 0
    ignored: int = 0
    truncated: bool = False
    error: InputError | None = None


@dataclass(slots=True)
class Inputs:
    """Everything :func:`load_paths` read: ``records`` (with bodies, in argument then time order),
    ``usage_records`` (agents' logs: each API call once, in time order), one :class:`FileRead` per file opened
    (``files``), and the counts of what was left out: ``duplicates`` (calls already counted from another file),
    ``filtered`` (outside the time window or project) and ``unrecognised`` (files in the searched directories that
    no format claims)."""

    records: list[Record] = field(default_factory=list)
    usage_records: list[UsageRecord] = field(default_factory=list)
    files: list[FileRead] = field(default_factory=list)
    duplicates: int = 0
    filtered: int = 0
    unrecognised: int = 0


def expand(paths: Iterable[Path]) -> list[tuple[Path, bool]]:
    """``(file, explicit)`` for every input: a file as given (``explicit``), a directory's files (recursively, in
    name order, with a suffix some format reads), a pattern's matches (``*``, ``?``, ``[``, ``**``: for patterns the
    shell did not expand). A path that does not exist is kept, explicit, for its loader to report."""
    out: list[tuple[Path, bool]] = []
    for path in paths:
        if path.is_dir():
            out.extend((f, False) for f in _walk(path))
        elif not path.exists() and _GLOB_CHARS & set(str(path)):
            for match in sorted(glob.glob(str(path), recursive=True)):
                p = Path(match)
                out.extend((f, False) for f in _walk(p)) if p.is_dir() else out.append((p, True))
        else:
            out.append((path, True))
    return out


def _walk(root: Path) -> list[Path]:
    found: list[Path] = []
    for folder, dirs, files in os.walk(root):
        dirs.sort()
        found.extend(Path(folder, name) for name in sorted(files) if Path(name).suffix.lower() in _SUFFIXES)
    return found


def default_roots(environ: Mapping[str, str] | None = None) -> list[tuple[LogFormat, Path]]:
    """``(format, root)`` for every agent whose logs exist on this machine, where the agent keeps them
    (environment variables such as ``CLAUDE_CONFIG_DIR`` and ``CODEX_HOME`` first)."""
    env = os.environ if environ is None else environ
    out: list[tuple[LogFormat, Path]] = []
    for fmt in LOG_FORMATS:
        for root in fmt.default_roots(env):
            if root.exists():
                out.append((fmt, root))
                break
    return out


def load_paths(
    paths: Iterable[Path],
    format: str | None = None,
    *,
    tools_path: str | None = None,
    since: float | None = None,
    until: float | None = None,
    project: str | None = None,
    progress: Callable[[int, int], None] | None = None,
    files: list[tuple[Path, bool]] | None = None,
    bodies: bool = True,
) -> Inputs:
    """Read every input (see the module docstring). ``format`` applies to every file (no detection); a file of
    a searched directory that no format claims is counted in ``unrecognised``. ``progress(done, total)`` is
    called after each file. ``files``: the inputs already expanded (:func:`expand`), instead of ``paths``. Never
    raises for bad input: each file's problem is in its :class:`FileRead`. ``bodies``: False reads agents' logs for
    their calls alone (no exact request bodies rebuilt). Claude Code's body dumps are put in their transcripts'
    sessions (:func:`~agentcache.loaders._claude_code_bodies.join_transcript`), each call once."""
    from agentcache.loaders import load  # the one per-file loader; imported here: it imports this module's peers

    inputs = Inputs()
    files = expand(paths) if files is None else files
    usage: list[tuple[float, int, UsageRecord]] = []
    for n, (path, explicit) in enumerate(files):
        fmt = format
        if fmt is None and not explicit:
            fmt = _claimed(path)
            if fmt is None:
                inputs.unrecognised += 1
                continue
        read = FileRead(path)
        inputs.files.append(read)
        try:
            result = load(path, fmt, tools_path=tools_path, bodies=bodies)
        except InputError as exc:
            read.error = exc
        except Exception as exc:  # a loader choking on unexpected input costs this file only
            read.error = InputError(f"cannot load ({type(exc).__name__}: {exc})", source=str(path))
        else:
            read.format, read.errors, read.lines = result.format, result.errors, result.lines
            read.records, read.usage_records = len(result.records), len(result.usage_records)
            read.ignored, read.truncated = result.ignored, result.truncated
            for rec in result.records:
                if _record_kept(rec, since, until, project):
                    inputs.records.append(rec)
                else:
                    inputs.filtered += 1
            usage.extend((u.at if u.at is not None else 0.0, len(usage), u) for u in result.usage_records)
        if progress is not None:
            progress(n + 1, len(files))
    inputs.usage_records = _once(usage, inputs, since, until, project)
    if inputs.records and inputs.usage_records:
        inputs.records = join_transcript(inputs.records, inputs.usage_records)
    return inputs


#: Suffixes of the formats read as JSON text: a file found in a directory with another suffix (a database) is
#: claimed by an agent format or passed over, never read whole to sniff it.
_JSON_SUFFIXES = frozenset({".jsonl", ".json", ".traj"})


def _claimed(path: Path) -> str | None:
    """The format of a file found in a directory, or None when no format claims it (never raises)."""
    try:
        fmt = log_format(path)
        if fmt is not None or path.suffix.lower() not in _JSON_SUFFIXES:
            return fmt
        if path.suffix.lower() == ".jsonl":  # claimed only when it starts like a request log, not any JSON lines
            first = first_objects(path)
            return "jsonl" if first and first[0].keys() >= JSONL_KEYS else None
        return sniff(path)[0]
    except InputError:
        return None


def _in_project(value: object, project: str | None) -> bool:
    return project is None or (isinstance(value, str) and project.lower() in value.lower())


def _once(
    usage: list[tuple[float, int, UsageRecord]],
    inputs: Inputs,
    since: float | None,
    until: float | None,
    project: str | None,
) -> list[UsageRecord]:
    """The usage records in time order, each call once, within the filters (counting what was left out)."""
    usage.sort(key=lambda t: (t[0], t[1]))
    seen: set[str] = set()
    out: list[UsageRecord] = []
    for _, _, rec in usage:
        if rec.call_id in seen:
            inputs.duplicates += 1
            continue
        seen.add(rec.call_id)
        if _kept(rec, since, until, project):
            out.append(rec)
        else:
            inputs.filtered += 1
    return out


def _record_kept(rec: Record, since: float | None, until: float | None, project: str | None) -> bool:
    if not _in_project(rec.meta.get("project"), project):
        return False
    if rec.at is None or not ("recorded_by" in rec.meta or "call_id" in rec.meta):
        return True  # a time relative to its file: no window applies
    return (since is None or rec.at >= since) and (until is None or rec.at < until)


def _kept(rec: UsageRecord, since: float | None, until: float | None, project: str | None) -> bool:
    at = rec.at
    if since is not None and (at is None or at < since):
        return False
    if until is not None and (at is None or at >= until):
        return False
    return _in_project(rec.project, project)
