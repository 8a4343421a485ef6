"""Progress bars for commands that can run for more than a couple of seconds (``audit``, ``plan``, ``replay``): on a
terminal only (stderr), through rich; elsewhere (pipes, CI logs, tests) nothing is drawn. rich's progress module is
imported only when a bar is drawn, so the commands' start-up does not pay for it."""

from __future__ import annotations

from collections.abc import Iterator
from contextlib import contextmanager
from typing import Protocol

from ._log_output import stderr_is_tty

__all__ = ["PROGRESS_THRESHOLD", "Advance", "progress_bar"]

#: Draw a bar only for more steps than this (a short run finishes before a bar helps).
PROGRESS_THRESHOLD = 200


class Advance(Protocol):
    """Moves the bar to ``done`` steps; ``total`` changes the number of steps (a run that learns it late)."""

    def __call__(self, done: int, total: int | None = None, /) -> None: ...


@contextmanager
def progress_bar(total: int, label: str, threshold: int = PROGRESS_THRESHOLD) -> Iterator[Advance | None]:
    """A callback ``advance(done, total=None)`` drawing a bar of ``total`` steps titled ``label`` on stderr, or None
    (at most ``threshold`` steps, or stderr not a terminal). The bar is removed when the block ends."""
    if total <= threshold or not stderr_is_tty():
        yield None
        return
    from rich.console import Console
    from rich.progress import BarColumn, MofNCompleteColumn, Progress, TextColumn, TimeElapsedColumn

    columns = (TextColumn(label), BarColumn(), MofNCompleteColumn(), TimeElapsedColumn())
    with Progress(*columns, console=Console(stderr=True), transient=True) as bar:
        task = bar.add_task(label, total=total)

        def advance(done: int, total: int | None = None, /) -> None:
            bar.update(task, completed=done, total=total)

        yield advance
