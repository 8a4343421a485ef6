"""Reading the command line's inputs: files, directories and globs through :func:`agentcache.loaders.load_paths`,
with a progress bar on a terminal, and every problem reported the :mod:`agentcache._cli_errors` way (an unreadable
named input: one error line; bad records: one summary line per file)."""

from __future__ import annotations

from pathlib import Path

from ._cli_errors import Errors, switch_word
from ._cli_progress import progress_bar
from ._exceptions import InputError
from ._log import get_logger
from .loaders import Record
from .loaders._paths import Inputs, expand, load_paths
from .loaders._taubench import load_tools

__all__ = ["EXACT_AUTO_BYTES", "load_all", "load_inputs"]

#: Up to this many bytes of input, the exact request bodies agents' logs hold are rebuilt by default (holding them
#: costs about as much memory as the input).
EXACT_AUTO_BYTES = 256_000_000

log = get_logger("agentcache.cli")


def load_inputs(
    paths: list[Path],
    fmt: str | None,
    tools: str | None,
    errors: Errors,
    *,
    since: float | None = None,
    until: float | None = None,
    project: str | None = None,
    bodies: bool | None = True,
) -> Inputs:
    """Everything ``paths`` hold (see :func:`~agentcache.loaders.load_paths`); problems go to ``errors``.
    ``bodies``: rebuild the exact request bodies agents' logs hold (Claude Code 2.1.332); None decides by size: up
    to :data:`EXACT_AUTO_BYTES` of input, else the calls alone, with a note saying so. ``tools``
    (``--tools``, the tool schemas of tau-bench results) is checked first, whatever the inputs: a file that cannot
    serve is an error line (its own, once), and one no input reads a warning."""
    tools_ok = tools is None or _tools_ok(tools, errors)
    named: list[Path] = []
    for path in paths:
        if (message := switch_word(path)) is not None:
            errors.add(message)
        else:
            named.append(path)
    files = expand(named)
    if bodies is None:
        size = sum(_size(p) for p, _ in files)
        bodies = size <= EXACT_AUTO_BYTES
        if not bodies:
            errors.warn(
                f"{size / 1e6:,.0f} MB of input: calls read without their request bodies (causes inferred); "
                "--exact rebuilds them (about as much memory as input), or narrow with --since or a project folder"
            )
    with progress_bar(len(files), "reading", threshold=20) as bar:
        progress = (lambda done, _total: bar(done)) if bar is not None else None
        inputs = load_paths(
            named,
            fmt,
            tools_path=tools,
            since=since,
            until=until,
            project=project,
            progress=progress,
            files=files,
            bodies=bodies,
        )
    explicit = {p for p, is_named in files if is_named}
    for read in inputs.files:
        if read.error is not None:
            errors.add(str(read.error))
            continue
        total = read.records + read.usage_records + len(read.errors)
        errors.records(read.errors, str(read.path), total)
        if read.path in explicit and total == 0:
            errors.add(f"{read.path}: no records to audit")
        log.info("load.done", path=str(read.path), format=read.format, records=total, errors=len(read.errors))
    if tools is not None and tools_ok and not any(read.format == "taubench" for read in inputs.files):
        errors.warn(f"--tools {tools}: only tau-bench results read tool schemas; no input was one")
    return inputs


def _size(path: Path) -> int:
    try:
        return path.stat().st_size
    except OSError:
        return 0


def _tools_ok(tools: str, errors: Errors) -> bool:
    """Whether ``--tools`` names a readable JSON list of tool objects; if not, one error line says why."""
    try:
        load_tools(Path(tools), tools)
    except InputError as exc:
        errors.add(f"--tools: {exc}")
        return False
    return True


def load_all(
    paths: list[Path], fmt: str | None, tools: str | None, errors: Errors, *, command: str = "replay"
) -> list[Record]:
    """The recorded requests (with bodies) of ``paths``, for the commands that replay or plan them (``command``, the
    verb the error lines use). Files that hold only agents' usage logs (no request bodies) are one error line per
    log format, however many files: their count, the first of them, and what can read them."""
    inputs = load_inputs(paths, fmt, tools, errors)
    bodiless: dict[str, list[Path]] = {}
    for read in inputs.files:
        if read.usage_records and not read.records:
            bodiless.setdefault(read.format or "agent", []).append(read.path)
    done = _past(command)
    for log_format, files in bodiless.items():
        where = str(files[0]) if len(files) == 1 else f"{len(files):,} files ({files[0]}, …)"
        errors.add(
            f"{where}: {log_format} logs keep no request bodies, so they cannot be {done}; `agentcache audit` reads "
            f"them, and `agentcache proxy --record DIR` records bodies that can be {done}"
        )
    return inputs.records


def _past(command: str) -> str:
    return {"plan": "planned", "replay": "replayed"}.get(command, command + "ed")
