"""structlog configuration for the command line.

The library never configures logging itself: it only calls ``structlog.get_logger(...)``. The CLI calls
:func:`configure_logging` once, before doing any work, so every log line goes to stderr (stdout is kept
for reports, e.g. ``audit --json``). The renderer is chosen with ``--log-format`` /
``AGENTCACHE_LOG_FORMAT`` (``console`` or ``json``) and the threshold with ``--log-level`` /
``AGENTCACHE_LOG_LEVEL`` (``debug``, ``info``, ``warning``, ``error``, ``critical``).
"""

from __future__ import annotations

import logging
import sys
from typing import Any

import structlog

from ._exceptions import ConfigError

__all__ = ["LEVELS", "RENDERERS", "configure_logging", "reset_logging"]

RENDERERS: tuple[str, ...] = ("console", "json")
LEVELS: dict[str, int] = {
    "debug": logging.DEBUG,
    "info": logging.INFO,
    "warning": logging.WARNING,
    "error": logging.ERROR,
    "critical": logging.CRITICAL,
}

#: The (renderer, level) currently configured by :func:`configure_logging`, or None.
_configured: tuple[str, str] | None = None


def _stderr_logger(*_args: Any) -> structlog.PrintLogger:
    """A PrintLogger on the *current* ``sys.stderr`` (looked up per logger, so redirections such as
    pytest's capture or typer's CliRunner are honoured)."""
    return structlog.PrintLogger(file=sys.stderr)


def _validate(renderer: str, level: str) -> tuple[str, str]:
    """Normalised ``(renderer, level)``; raises ConfigError naming the bad value."""
    r, lv = renderer.strip().lower(), level.strip().lower()
    if r not in RENDERERS:
        raise ConfigError(f"invalid log format {renderer!r}; expected one of {', '.join(RENDERERS)}")
    if lv not in LEVELS:
        raise ConfigError(f"invalid log level {level!r}; expected one of {', '.join(LEVELS)}")
    return r, lv


def configure_logging(renderer: str = "console", level: str = "warning") -> None:
    """Configure structlog to write ``renderer``-formatted lines at ``level`` and above to stderr.

    Processors: contextvars merge, log level, ISO timestamp, then ``JSONRenderer`` (``json``, after
    ``format_exc_info``) or ``ConsoleRenderer`` (``console``; colours only when stderr is a terminal).
    Idempotent: calling it again with the same settings does nothing; other settings replace the
    previous configuration.
    Raises ConfigError for an unknown renderer or level.
    """
    global _configured
    settings = _validate(renderer, level)
    if _configured == settings:
        return
    r, lv = settings
    processors: list[structlog.types.Processor] = [
        structlog.contextvars.merge_contextvars,
        structlog.processors.add_log_level,
        structlog.processors.TimeStamper(fmt="iso"),
    ]
    if r == "json":
        # exc_info → a "exception" string, so tracebacks serialise (ConsoleRenderer formats them itself).
        processors += [structlog.processors.format_exc_info, structlog.processors.JSONRenderer()]
    else:
        processors.append(structlog.dev.ConsoleRenderer(colors=_stderr_is_tty()))
    structlog.configure(
        processors=processors,
        wrapper_class=structlog.make_filtering_bound_logger(LEVELS[lv]),
        logger_factory=_stderr_logger,
        # Not cached: each log call binds a fresh PrintLogger on the current sys.stderr.
        cache_logger_on_first_use=False,
    )
    _configured = settings


def reset_logging() -> None:
    """Undo :func:`configure_logging` (structlog back to its defaults); for tests."""
    global _configured
    structlog.reset_defaults()
    _configured = None


def _stderr_is_tty() -> bool:
    """True when stderr is an interactive terminal."""
    try:
        return sys.stderr.isatty()
    except (AttributeError, ValueError):
        return False
