"""The ``agentcache`` command line (console script ``agentcache = agentcache._cli:main``).

A typer app with one subcommand per tool (``audit`` today; ``proxy``, ``serve`` and ``replay`` will join it)
and the global options ``--version``, ``--log-format`` and ``--log-level``.

Bad input never produces a traceback: every unreadable file, unknown format, malformed record or invalid
option value is reported as one line on stderr (``agentcache: error: <file> record <n>: <what>``), the
remaining inputs are still audited, and the exit code is 2 at the end.
"""

from __future__ import annotations

import json
import os
import sys
from collections.abc import Callable, Iterator
from contextlib import contextmanager
from enum import Enum, StrEnum
from pathlib import Path
from typing import Annotated

import structlog
import typer
from rich.console import Console
from rich.progress import BarColumn, MofNCompleteColumn, Progress, TextColumn, TimeElapsedColumn

from . import __version__
from ._audit import audit as run_audit
from ._exceptions import ConfigError, InputError
from ._html import render_html
from ._logging import LEVELS, RENDERERS, configure_logging
from ._render import make_console, render_report
from ._report import AuditReport
from .loaders import FORMATS, Record, load

__all__ = ["app", "main"]

PROVIDERS: tuple[str, ...] = ("anthropic", "openai")


class ProviderChoice(StrEnum):
    """Values of ``--provider``."""

    anthropic = "anthropic"
    openai = "openai"


FormatChoice = Enum("FormatChoice", {f.replace("-", "_"): f for f in FORMATS}, type=str)  # type: ignore[misc]
#: Show a progress bar (on a terminal) when auditing more records than this.
PROGRESS_THRESHOLD = 200
#: Exit code for bad input (files, records, option values), as for usage errors.
EXIT_BAD_INPUT = 2

log = structlog.get_logger("agentcache.cli")

app = typer.Typer(
    name="agentcache",
    help="Keep LLM agents' prompt prefixes cache-stable, prove it with numbers, explain every miss.",
    no_args_is_help=True,
    add_completion=False,
    pretty_exceptions_show_locals=False,
)


class _Errors:
    """Counts bad-input errors and prints each as one line on stderr."""

    def __init__(self) -> None:
        self.count = 0

    def add(self, message: str) -> None:
        """Print ``agentcache: error: <message>`` (newlines folded) and count it."""
        self.count += 1
        one_line = " ".join(message.split("\n"))
        typer.echo(f"agentcache: error: {one_line}", err=True)


def _fail(message: str) -> typer.Exit:
    """Print a one-line error and return the Exit(2) to raise."""
    _Errors().add(message)
    return typer.Exit(EXIT_BAD_INPUT)


def _version(value: bool) -> None:
    if value:
        typer.echo(f"agentcache {__version__}")
        raise typer.Exit()


@app.callback()
def _root(
    version: Annotated[
        bool, typer.Option("--version", callback=_version, is_eager=True, help="Print the version and exit.")
    ] = False,
    log_format: Annotated[
        str,
        typer.Option(
            "--log-format", envvar="AGENTCACHE_LOG_FORMAT", help=f"Log lines on stderr: {' or '.join(RENDERERS)}."
        ),
    ] = "console",
    log_level: Annotated[
        str,
        typer.Option("--log-level", envvar="AGENTCACHE_LOG_LEVEL", help=f"Minimum log level: {', '.join(LEVELS)}."),
    ] = "warning",
) -> None:
    """agentcache: prompt-cache discipline for LLM agents."""
    try:
        configure_logging(log_format, log_level)
    except ConfigError as exc:
        raise _fail(str(exc)) from None


@app.command("audit")
def audit_command(
    paths: Annotated[
        list[Path], typer.Argument(metavar="PATH", help="Recorded traffic files (formats are auto-detected).")
    ],
    provider: Annotated[
        ProviderChoice | None,
        typer.Option(help="Cache rules to simulate (default: from the first record's api)."),
    ] = None,
    model: Annotated[str | None, typer.Option(help="Price every request as this model.")] = None,
    json_output: Annotated[bool, typer.Option("--json", help="Print the JSON report on stdout.")] = False,
    fmt: Annotated[FormatChoice | None, typer.Option("--format", help="Input format, skipping detection.")] = None,
    tools: Annotated[
        Path | None, typer.Option(help="Tool schemas for tau-bench files (default: <domain>_tools.json beside them).")
    ] = None,
    compare: Annotated[
        bool,
        typer.Option(
            "--compare",
            help="Add one arm per baseline marker strategy (anthropic_auto, langchain, litellm, no_markers).",
        ),
    ] = False,
    html: Annotated[
        Path | None, typer.Option("--html", help="Also write a self-contained HTML report (charts work offline).")
    ] = None,
) -> None:
    """Audit recorded traffic: what its prompt caching cost, what it could cost, and why each prefix broke."""
    errors = _Errors()
    fmt_name = fmt.value if fmt is not None else None
    records = _load_all(paths, fmt_name, None if tools is None else str(tools), errors)
    if not records:
        if not errors.count:
            errors.add("no records to audit in " + ", ".join(str(p) for p in paths))
        raise typer.Exit(EXIT_BAD_INPUT)
    report = _audit_all(records, provider.value if provider else None, model, errors, compare)
    if report is not None:
        if json_output:
            typer.echo(json.dumps(report.to_dict(), indent=2))
        else:
            render_report(report, make_console())
        if html is not None:
            try:
                html.write_text(render_html(report))
            except OSError as exc:
                errors.add(f"{html}: cannot write the HTML report: {exc.strerror or exc}")
    if errors.count or report is None:
        raise typer.Exit(EXIT_BAD_INPUT)


def _load_all(paths: list[Path], fmt: str | None, tools: str | None, errors: _Errors) -> list[Record]:
    """Records of every loadable file, in argument order; every problem goes to ``errors``."""
    records: list[Record] = []
    for path in paths:
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
            errors.add(str(err))
        if not result.records and not result.errors:
            errors.add(f"{path}: no records to audit")
        log.info(
            "load.done", path=str(path), format=result.format, records=len(result.records), errors=len(result.errors)
        )
        records.extend(result.records)
    return records


def _audit_all(
    records: list[Record], provider: str | None, model: str | None, errors: _Errors, compare: bool = False
) -> AuditReport | None:
    """Audit ``records`` once; records the audit could not read are reported to ``errors``.

    Returns None (after reporting) when the provider is invalid or no record was auditable.
    """
    try:
        with _progress(len(records)) as progress:
            report = run_audit(records, provider=provider, model=model, progress=progress, compare=compare)
    except ConfigError as exc:
        errors.add(str(exc))
        return None
    for err in report.errors:
        errors.add(str(err))
    log.info("audit.done", provider=report.provider, model=report.model, requests=len(records))
    return report if report.turns else None


@contextmanager
def _progress(total: int) -> Iterator[Callable[[int], None] | None]:
    """A progress callback drawing a bar on stderr, or None (few records, or stderr not a terminal)."""
    if total <= PROGRESS_THRESHOLD or not sys.stderr.isatty():
        yield None
        return
    columns = (TextColumn("auditing"), BarColumn(), MofNCompleteColumn(), TimeElapsedColumn())
    with Progress(*columns, console=Console(stderr=True), transient=True) as bar:
        task = bar.add_task("audit", total=total)

        def advance(done: int) -> None:
            bar.update(task, completed=done)

        yield advance


def main() -> None:
    """Console-script entry point."""
    try:
        app(prog_name="agentcache")
    except BrokenPipeError:
        # The reader went away (``agentcache audit … | head``): not an error of ours.
        sys.stderr.close()
        os._exit(0)
