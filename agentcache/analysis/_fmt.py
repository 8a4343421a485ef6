"""Table and number formatting shared by the terminal renderers of audit reports (rich tables; numbers right-aligned
with thousands separators, USD to four decimals, rates as percentages)."""

from __future__ import annotations

import os
from collections.abc import Iterable

from rich import box
from rich.console import Console
from rich.table import Table

__all__ = ["make_console"]

#: Width used when stdout is not a terminal (pipes, files, test runners), so cells are not truncated.
_PIPE_WIDTH = 160


def make_console(stderr: bool = False) -> Console:
    """A console on stdout (or stderr); wide enough not to truncate tables when not a terminal."""
    console = Console(stderr=stderr, highlight=False)
    if not console.is_terminal and "COLUMNS" not in os.environ:
        console = Console(stderr=stderr, highlight=False, width=_PIPE_WIDTH)
    return console


def _int(n: int) -> str:
    return f"{n:,}"


def _usd(x: float) -> str:
    return f"{x:,.4f}"


def _pct(rate: float) -> str:
    return f"{rate * 100:.1f}%"


def _plural(n: int, word: str) -> str:
    return f"{_int(n)} {word}" if n == 1 else f"{_int(n)} {word}s"


def _table(title: str, columns: Iterable[str]) -> Table:
    """A table titled ``title``; a column named ``">name"`` is numeric (right-aligned, never wrapped),
    any other is text (folded when too long)."""
    table = Table(title=title, title_justify="left", title_style="bold", box=box.SIMPLE_HEAD, pad_edge=False)
    for i, name in enumerate(columns):
        if name.startswith(">"):
            table.add_column(name[1:], justify="right", no_wrap=True)
        else:
            # The first column names the row (an arm, a cause): it must stay readable on 80 columns.
            table.add_column(name, overflow="fold", no_wrap=i == 0, min_width=10 if i == 0 else None)
    return table
