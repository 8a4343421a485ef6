"""The command line's typer plumbing: help that shows switches as switches, and engine-name options.

* :class:`Group` is the app's command group. Typer's rich help prints a value type beside every option,
  ``<bool>`` included, so ``--json <bool>`` reads as if it took a value (``--json true FILE`` then audits a file
  named ``true``). The group turns every boolean flag of itself and of each of its commands (``--help`` too)
  into a :class:`_Switch`, whose help shows no value: one place, for every command, present and future.
* Usage errors print ``agentcache: error: <what>`` first, like every other error of the command line.
* :data:`ConfigFile` is the ``--config`` option of every command that reads settings (``AGENTCACHE_CONFIG`` too).
* :func:`engine_option` is the ``--engine`` callback: one spelling per engine (aliases accepted, through
  :func:`agentcache.model._types.parse_engine`), the choices in the help, a bad name one error line.
"""

from __future__ import annotations

from collections.abc import Callable, Iterable, Sequence
from enum import Enum
from pathlib import Path
from typing import Annotated, Any

import typer
from typer.core import TyperGroup, TyperOption

from ._cli_errors import EXIT_BAD_INPUT, fail
from ._exceptions import ConfigError
from .loaders import FORMATS
from .model._types import Engine, engine_aliases, parse_engine

try:  # typer >= 0.24 carries its own copy of click
    from typer._click.exceptions import UsageError
except ImportError:  # pragma: no cover - older typer on click
    from click.exceptions import UsageError  # type: ignore[assignment]

__all__ = ["ConfigFile", "FormatChoice", "Group", "engine_metavar", "engine_option"]

#: Values of ``--format``: the loaders' input formats.
FormatChoice = Enum("FormatChoice", {f.replace("-", "_"): f for f in FORMATS}, type=str)  # type: ignore[misc]

#: ``--config FILE`` (or ``AGENTCACHE_CONFIG``): the TOML file of :func:`agentcache.configure` (its
#: ``[agentcache]`` settings and ``[models.<provider>.<model>]`` price rows) and of the proxy's ``[proxy]`` options.
ConfigFile = Annotated[
    Path | None,
    typer.Option(
        "--config",
        envvar="AGENTCACHE_CONFIG",
        help="TOML file: \\[agentcache] settings, \\[models.PROVIDER.MODEL] prices of models the built-in table "
        "lacks, \\[proxy] options.",
    ),
]


class _Switch(TyperOption):
    """A boolean flag: its help shows the option names only (``--json``, ``--proxy / --no-proxy``)."""

    def display_type_rich(self, ctx: Any) -> str | None:
        return None


def _plain_switches(params: Iterable[Any]) -> None:
    for param in params:
        if type(param) is TyperOption and param.is_flag and not param.count:
            # Same object, same state; only the help rendering differs (the subclass adds no attributes).
            param.__class__ = _Switch


def _usage_exit(exc: UsageError) -> typer.Exit:
    """Print a usage error as ``agentcache: error: <what>`` then ``Try '... --help' for help.``; the Exit(2)
    to raise. (Typer's own rendering starts with the usage line and boxes the error below it.)"""
    what = exc.format_message().replace("Value error, ", "")
    typer.echo(f"agentcache: error: {' '.join(what.split())}", err=True)
    if exc.ctx is not None:
        typer.echo(f"Try '{exc.ctx.command_path} --help' for help.", err=True)
    return typer.Exit(EXIT_BAD_INPUT)


class Group(TyperGroup):
    """The ``agentcache`` group: boolean flags, its own and its commands', render as plain switches; usage
    errors (unknown option, bad value) start with one ``agentcache: error:`` line."""

    def make_context(self, info_name: str | None, args: list[str], parent: Any = None, **extra: Any) -> Any:
        try:
            return super().make_context(info_name, args, parent, **extra)
        except UsageError as exc:
            if type(exc).__name__ == "NoArgsIsHelpError":  # bare ``agentcache``: the help, as typer prints it
                raise
            raise _usage_exit(exc) from None

    def invoke(self, ctx: Any) -> Any:
        try:
            return super().invoke(ctx)
        except UsageError as exc:
            if type(exc).__name__ == "NoArgsIsHelpError":
                raise
            raise _usage_exit(exc) from None

    def get_params(self, ctx: Any) -> list[Any]:
        params = super().get_params(ctx)
        _plain_switches(params)
        return params

    def get_command(self, ctx: Any, cmd_name: str) -> Any:
        command = super().get_command(ctx, cmd_name)
        if command is not None:
            _plain_switches(command.get_params(ctx))
        return command


def engine_metavar(choices: Sequence[str]) -> str:
    """``[auto|sglang|llama.cpp]``: the choices as the help shows them."""
    return "[" + "|".join(choices) + "]"


def engine_option(extra: Sequence[str], engines: Sequence[Engine]) -> Callable[[str | None], str | None]:
    """An ``--engine`` callback: the canonical name of ``value`` (an engine of ``engines``, any alias, or one of
    the ``extra`` words such as ``auto``), None kept. A bad name prints one line
    ``agentcache: error: --engine ...`` and exits 2."""

    def check(value: str | None) -> str | None:
        if value is None:
            return None
        key = value.strip().lower()
        if key in extra:
            return key
        choices = [*extra, *(e.value for e in engines)]
        try:
            engine = parse_engine(key)
        except ConfigError:
            engine = None
        if engine is None or engine not in engines:
            raise fail(f"--engine {value!r}: expected one of {', '.join(choices)} (aliases: {engine_aliases()})")
        return engine.value

    return check
