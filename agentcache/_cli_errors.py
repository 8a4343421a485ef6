"""The command line's bad-input reporting: one line per problem on stderr, exit code 2 at the end.

Every unreadable file, unknown format, malformed record or invalid option value becomes one line
``agentcache: error: <file> record <n>: <what>``; a failure on one file or record (whatever raised it, a
loader's own bug included) costs that file or record only, and the other inputs are still read.
"""

from __future__ import annotations

from pathlib import Path

import typer

from ._exceptions import InputError
from ._log import get_logger
from .loaders import Record, load

__all__ = ["EXIT_BAD_INPUT", "Errors", "fail", "load_all"]

#: Exit code for bad input (files, records, option values), as for usage errors.
EXIT_BAD_INPUT = 2

log = get_logger("agentcache.cli")

#: Values people give boolean switches; a missing file of that name was meant as one.
_SWITCH_WORDS = frozenset({"true", "false", "yes", "no", "on", "off", "1", "0"})


class Errors:
    """Counts bad-input errors and prints each as one line on stderr. Errors about single records are held
    until :meth:`flush`, which prints them in file and record order (loading finds some, the audit others)."""

    def __init__(self) -> None:
        self.count = 0
        self._held: list[InputError] = []

    def add(self, message: str) -> None:
        """Print ``agentcache: error: <message>`` (newlines folded) and count it."""
        self.count += 1
        one_line = " ".join(message.split("\n"))
        typer.echo(f"agentcache: error: {one_line}", err=True)

    def record(self, err: InputError) -> None:
        """Count a bad record's error; printed by :meth:`flush`."""
        self.count += 1
        self._held.append(err)

    def flush(self) -> None:
        """Print the held record errors, ordered by file (in argument order) and record index."""
        files = {e.source: i for i, e in reversed(list(enumerate(self._held)))}
        held, self._held = self._held, []
        for err in sorted(held, key=lambda e: (files[e.source], -1 if e.record is None else e.record)):
            self.count -= 1
            self.add(str(err))


def fail(message: str) -> typer.Exit:
    """Print a one-line error and return the Exit(2) to raise."""
    Errors().add(message)
    return typer.Exit(EXIT_BAD_INPUT)


def load_all(paths: list[Path], fmt: str | None, tools: str | None, errors: Errors) -> list[Record]:
    """Records of every loadable file, in argument order; every problem goes to ``errors``."""
    records: list[Record] = []
    for path in paths:
        if path.name.lower() in _SWITCH_WORDS and not path.exists():  # ``--json true FILE``: true is a path here
            errors.add(f"{path}: no such file; switches take no value (write --json, not --json {path.name})")
            continue
        try:
            result = load(path, fmt, tools_path=tools)
        except InputError as exc:
            errors.add(str(exc))
            continue
        except Exception as exc:  # a loader choking on unexpected input must not end the whole run
            log.debug("load.failed", path=str(path), exc_info=True)
            errors.add(f"{path}: cannot load ({type(exc).__name__}: {exc})")
            continue
        for err in result.errors:
            errors.record(err)
        if not result.records and not result.errors:
            errors.add(f"{path}: no records to audit")
        log.info(
            "load.done", path=str(path), format=result.format, records=len(result.records), errors=len(result.errors)
        )
        records.extend(result.records)
    return records
