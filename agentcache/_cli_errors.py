"""The command line's bad-input reporting: errors one line each, bad records summed up per file.

* An input the caller named that cannot be read at all (no such file, an unknown format, invalid JSON) is one
  line ``agentcache: error: <file>: <what>`` and makes the exit code 2 at the end; the other inputs are still read.
* Records (lines, events) of a readable file that cannot be read cost those records only: one line per file,
  ``agentcache: warning: <file>: 3 of 1,530 records skipped (line 13: <what>)``, and with ``--verbose`` the first
  few: ``line N`` (1-based, as an editor counts) in a file of JSON lines, else ``record N`` (0-based). A log's
  last line still being written is not counted. They do not change the exit code: what could be read is reported.
* Nothing readable at all exits 2.
"""

from __future__ import annotations

from collections import defaultdict
from collections.abc import Iterable
from pathlib import Path

import typer

from ._exceptions import InputError
from ._log import get_logger

__all__ = ["EXAMPLES", "EXIT_BAD_INPUT", "Errors", "fail"]

#: Exit code for bad input (files, records, option values), as for usage errors.
EXIT_BAD_INPUT = 2
#: Bad records listed per file with ``--verbose``.
EXAMPLES = 5

log = get_logger("agentcache.cli")

#: Values people give boolean switches; a missing file of that name was meant as one.
SWITCH_WORDS = frozenset({"true", "false", "yes", "no", "on", "off", "1", "0"})


class Errors:
    """Counts errors (each printed at once as one line) and collects bad records per file, printed as one summary
    line each by :meth:`flush`. ``verbose``: also list the first :data:`EXAMPLES` bad records of each file."""

    def __init__(self, verbose: bool = False) -> None:
        self.count = 0
        self.verbose = verbose
        self._held: dict[str, list[InputError]] = defaultdict(list)
        self._totals: dict[str, int] = {}

    def add(self, message: str) -> None:
        """Print ``agentcache: error: <message>`` (newlines folded) and count it."""
        self.count += 1
        typer.echo(f"agentcache: error: {' '.join(message.split())}", err=True)

    def warn(self, message: str) -> None:
        """Print ``agentcache: warning: <message>`` (not counted: the exit code stays)."""
        typer.echo(f"agentcache: warning: {' '.join(message.split())}", err=True)

    def record(self, err: InputError, total: int | None = None) -> None:
        """Hold a bad record's error for its file's summary; ``total``: the records the file held, when known."""
        source = err.source or "input"
        self._held[source].append(err)
        if total is not None:
            self._totals[source] = total

    def records(self, errors: Iterable[InputError], source: str, total: int) -> None:
        """Hold every bad record of one file that held ``total`` records (good and bad)."""
        self._totals[source] = total
        for err in errors:
            self._held[err.source or source].append(err)

    def flush(self) -> None:
        """Print one summary line per file with bad records (with ``verbose``, its first few), in file order."""
        held, self._held = self._held, defaultdict(list)
        for source, errs in held.items():
            errs.sort(key=lambda e: -1 if e.record is None else e.record)
            total = self._totals.get(source)
            of = f" of {total:,}" if total is not None and total >= len(errs) else ""
            first = errs[0]
            where = f"{_where(source, first.record)}: " if first.record is not None else ""
            hint = "" if self.verbose else "; --verbose lists them"
            noun = "record" if len(errs) == 1 and not of else "records"
            self.warn(f"{source}: {len(errs):,}{of} {noun} skipped ({where}{first.reason}){hint}")
            if self.verbose:
                for err in errs[:EXAMPLES]:
                    typer.echo(f"  {_where(source, err.record)}: {' '.join(err.reason.split())}", err=True)
                if len(errs) > EXAMPLES:
                    typer.echo(f"  … {len(errs) - EXAMPLES:,} more", err=True)


def _where(source: str, record: int | None) -> str:
    """How a person finds the bad record: ``line N`` (1-based, as an editor counts) in a file of JSON lines,
    else ``record N`` (0-based: the event or request index of a JSON document)."""
    if source.endswith(".jsonl") and record is not None:
        return f"line {record + 1}"
    return f"record {record}"


def fail(message: str) -> typer.Exit:
    """Print a one-line error and return the Exit(2) to raise."""
    Errors().add(message)
    return typer.Exit(EXIT_BAD_INPUT)


def switch_word(path: Path) -> str | None:
    """The error for a missing file named like a switch value (``--json true FILE``), else None."""
    if path.name.lower() in SWITCH_WORDS and not path.exists():
        return f"{path}: no such file; switches take no value (write --json, not --json {path.name})"
    return None
