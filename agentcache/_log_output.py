"""Log output of the command line and the proxy: one stderr handler on the ``agentcache`` logger.

The library itself never configures logging (:mod:`agentcache._log`: its loggers hand events to the standard
library, which prints nothing unless the host configures it). The CLI calls :func:`configure_logging` once, before
doing any work, so every log line goes to stderr (stdout is kept for reports, e.g. ``audit --json``). The renderer
is chosen with ``--log-format`` / ``AGENTCACHE_LOG_FORMAT`` (``console`` or ``json``) and the threshold with
``--log-level`` / ``AGENTCACHE_LOG_LEVEL`` (``debug``, ``info``, ``warning``, ``error``, ``critical``).
"""

from __future__ import annotations

import contextlib
import logging
import sys
import time
from collections.abc import Iterator
from typing import Any

from ._exceptions import ConfigError
from ._log import ROOT

__all__ = [
    "LEVELS",
    "RENDERERS",
    "configure_logging",
    "configured_logging",
    "reset_logging",
    "stderr_is_tty",
    "without_events",
]

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
_handler: logging.Handler | None = None


class _Stderr(logging.StreamHandler):  # type: ignore[type-arg]
    """A stream handler on the *current* ``sys.stderr`` (looked up per record, so redirections such as
    pytest's capture or typer's CliRunner are honoured)."""

    @property
    def stream(self) -> Any:
        return sys.stderr

    @stream.setter
    def stream(self, value: Any) -> None:  # StreamHandler.__init__ assigns it
        pass


def _validate(renderer: str, level: str) -> tuple[str, str]:
    """Normalised ``(renderer, level)``; raises ConfigError naming the bad value."""
    r, lv = renderer.strip().lower(), level.strip().lower()
    if r not in RENDERERS:
        raise ConfigError(f"invalid log format {renderer!r}; expected one of {', '.join(RENDERERS)}")
    if lv not in LEVELS:
        raise ConfigError(f"invalid log level {level!r}; expected one of {', '.join(LEVELS)}")
    return r, lv


def configure_logging(renderer: str = "console", level: str = "warning") -> None:
    """Write agentcache's log events at ``level`` and above to stderr, ``renderer``-formatted.

    One handler on the ``agentcache`` logger (not propagated to the root logger): structlog's
    :class:`~structlog.stdlib.ProcessorFormatter` adds the log level and a timestamp, then renders with
    ``JSONRenderer`` (``json``: every field of the event, an ISO timestamp, tracebacks as an ``exception`` string)
    or ``ConsoleRenderer`` (``console``: the short form of :mod:`agentcache._logview`, local time to the second;
    colours only when stderr is a terminal). Idempotent: calling it again with the same settings does nothing;
    other settings replace the previous handler. Raises ConfigError for an unknown renderer or level.
    """
    global _configured, _handler
    settings = _validate(renderer, level)
    if _configured == settings:
        return
    r, lv = settings
    handler = _Stderr()
    handler.setFormatter(_Formatter(r))
    root = logging.getLogger(ROOT)
    if _handler is not None:
        root.removeHandler(_handler)
    root.addHandler(handler)
    root.setLevel(LEVELS[lv])
    root.propagate = False
    _handler, _configured = handler, settings


class _Formatter(logging.Formatter):
    """structlog's formatter for ``renderer``, built at the first record: a command that logs nothing
    (``--help``) does not import structlog (about 0.1 s)."""

    def __init__(self, renderer: str) -> None:
        super().__init__()
        self._renderer = renderer
        self._built: logging.Formatter | None = None

    def format(self, record: logging.LogRecord) -> str:
        if self._built is None:
            self._built = _structlog_formatter(self._renderer)
        return self._built.format(record)


def _structlog_formatter(renderer: str) -> logging.Formatter:
    import structlog

    from ._logview import short_form

    steps: list[Any] = [structlog.stdlib.add_log_level]
    final: list[Any]
    if renderer == "json":
        steps += [structlog.processors.TimeStamper(fmt="iso"), structlog.processors.format_exc_info]
        final = [structlog.processors.JSONRenderer()]
    else:
        steps.append(_LocalSecond("%Y-%m-%d %H:%M:%S"))
        final = [short_form, structlog.dev.ConsoleRenderer(colors=stderr_is_tty(), sort_keys=False, pad_event_to=20)]
    return structlog.stdlib.ProcessorFormatter(
        processors=[*steps, structlog.stdlib.ProcessorFormatter.remove_processors_meta, *final],
        foreign_pre_chain=steps,
    )


class _LocalSecond:
    """structlog processor: the local time as ``timestamp`` in ``fmt`` (to the second: ``time.strftime`` codes),
    as ``TimeStamper(fmt=fmt, utc=False)`` writes it, but formatted once per second: its ``astimezone()`` took
    ~20 µs of every line (a proxy writes one per request)."""

    __slots__ = ("_fmt", "_last")

    def __init__(self, fmt: str) -> None:
        self._fmt = fmt
        self._last = (-1, "")  # (second, its text): one object, so threads never see one without the other

    def __call__(self, logger: Any, method: str, event: dict[str, Any]) -> dict[str, Any]:
        second = int(time.time())
        last = self._last
        if last[0] != second:
            last = self._last = (second, time.strftime(self._fmt, time.localtime(second)))
        event["timestamp"] = last[1]
        return event


@contextlib.contextmanager
def without_events(*events: str) -> Iterator[None]:
    """While in the block, the stderr handler drops the named events (e.g. ``model.unknown`` while the audit
    report itself names the unknown models: said once, not twice). Nothing to drop when logging is not
    configured."""

    def keep(record: logging.LogRecord) -> bool:
        msg = record.msg
        return not (isinstance(msg, dict) and msg.get("event") in events)

    handler = _handler
    if handler is not None:
        handler.addFilter(keep)
    try:
        yield
    finally:
        if handler is not None:
            handler.removeFilter(keep)


def configured_logging() -> tuple[str, str] | None:
    """The ``(renderer, level)`` :func:`configure_logging` installed, or None (for a worker process to do the same)."""
    return _configured


def reset_logging() -> None:
    """Undo :func:`configure_logging` (the ``agentcache`` logger back to silent); for tests."""
    global _configured, _handler
    root = logging.getLogger(ROOT)
    if _handler is not None:
        root.removeHandler(_handler)
    root.setLevel(logging.NOTSET)
    root.propagate = True
    _handler = _configured = None


def stderr_is_tty() -> bool:
    """True when stderr is an interactive terminal."""
    try:
        return sys.stderr.isatty()
    except (AttributeError, ValueError):
        return False
