"""Progress bars for commands that can run for more than a couple of seconds: on a terminal only (stderr), through
rich; elsewhere (pipes, CI logs, tests) nothing is drawn."""

from __future__ import annotations

import sys
from collections.abc import Callable, Iterator
from contextlib import contextmanager

__all__ = ["PROGRESS_THRESHOLD", "progress_bar"]

#: Draw a bar only for more steps than this (a short run finishes before a bar helps).
PROGRESS_THRESHOLD = 200


@contextmanager
def progress_bar(total: int, label: str, threshold: int = PROGRESS_THRESHOLD) -> Iterator[Callable[[int], None] | None]:
    """A callback ``advance(done)`` drawing a bar of ``total`` steps titled ``label`` on stderr, or None (at most
    ``threshold`` steps, or stderr not a terminal). The bar is removed when the block ends."""
    if total <= threshold or not sys.stderr.isatty():
        yield None
        return
    from rich.console import Console
    from rich.progress import BarColumn, MofNCompleteColumn, Progress, TextColumn, TimeElapsedColumn

    columns = (TextColumn(label), BarColumn(), MofNCompleteColumn(), TimeElapsedColumn())
    with Progress(*columns, console=Console(stderr=True), transient=True) as bar:
        task = bar.add_task(label, total=total)

        def advance(done: int) -> None:
            bar.update(task, completed=done)

        yield advance
