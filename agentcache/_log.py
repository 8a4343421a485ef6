"""Library logging: structlog loggers that hand their events to the standard library's :mod:`logging`.

agentcache never configures logging for its host. Every module gets its logger from :func:`get_logger`: a
structlog bound logger (key/value events, context from :mod:`structlog.contextvars`) wrapped around the
standard ``logging.getLogger(name)`` of an ``agentcache.*`` name, with its own processor chain, so structlog's
process-wide configuration (which prints to stdout by default) is neither used nor changed. The host's logging
configuration decides what is shown and where:

* nothing is configured: nothing is printed (the ``agentcache`` logger has a :class:`logging.NullHandler`, so
  Python's last-resort handler stays quiet);
* ``logging.basicConfig(level=logging.INFO)`` or any handler: records arrive with the event dict as their
  ``msg`` (``record.msg["event"]`` is the event name, e.g. ``session.turn``), rendered by the host's formatter;
  :class:`structlog.stdlib.ProcessorFormatter` renders them as structlog would;
* the ``agentcache`` command line and proxy call :func:`agentcache._log_output.configure_logging`, which attaches
  one stderr handler with a console or JSON renderer.

A disabled level costs one ``isEnabledFor`` check: callers that build large event dicts check
:func:`enabled` first. Events carry ids, hashes and counts, never prompt text or credentials.
"""

from __future__ import annotations

import contextlib
import logging
from collections.abc import Iterator
from typing import Any

__all__ = ["ROOT", "capture_logs", "enabled", "get_logger"]

#: The parent of every agentcache logger name.
ROOT = "agentcache"

logging.getLogger(ROOT).addHandler(logging.NullHandler())


class _Logger:
    """The structlog logger of ``name``, built on first use: importing a module that logs does not import
    structlog (about 0.1 s, paid by every ``agentcache --help`` otherwise). Each method, once looked up, is kept
    on the instance, so later calls skip :meth:`__getattr__`."""

    def __init__(self, name: str) -> None:
        self._name = name

    def __getattr__(self, attr: str) -> Any:
        if attr.startswith("__"):  # copy/pickle probes: not a log method
            raise AttributeError(attr)
        bound = self.__dict__.get("_bound")
        if bound is None:
            bound = self._bound = _structlog_logger(self._name)
        value = getattr(bound, attr)
        setattr(self, attr, value)
        return value


def _structlog_logger(name: str) -> Any:
    import structlog

    return structlog.stdlib.BoundLogger(
        logging.getLogger(name),
        processors=[
            structlog.stdlib.filter_by_level,
            structlog.contextvars.merge_contextvars,
            structlog.stdlib.ProcessorFormatter.wrap_for_formatter,
        ],
        context={},
    )


def get_logger(name: str) -> Any:
    """A structlog logger over ``logging.getLogger(name)`` (``name`` is an ``agentcache.*`` logger name), built
    on first use. Methods: ``debug``/``info``/``warning``/``error``/``exception(event, **fields)``."""
    return _Logger(name)


def enabled(name: str, level: int = logging.INFO) -> bool:
    """True when a record of ``level`` from logger ``name`` would be handled (cheap; checked before building
    a large event)."""
    return logging.getLogger(name).isEnabledFor(level)


class _Capture(logging.Handler):
    def __init__(self, out: list[dict[str, Any]]) -> None:
        super().__init__(logging.DEBUG)
        self.out = out

    def emit(self, record: logging.LogRecord) -> None:
        event = record.msg
        if isinstance(event, dict):
            self.out.append({**event, "log_level": record.levelname.lower(), "logger": record.name})


@contextlib.contextmanager
def capture_logs(level: int = logging.DEBUG) -> Iterator[list[dict[str, Any]]]:
    """Collect the event dicts agentcache logs at ``level`` and above while the block runs (tests): each has its
    fields plus ``log_level`` and ``logger``. Restores the ``agentcache`` logger's level afterwards."""
    out: list[dict[str, Any]] = []
    root = logging.getLogger(ROOT)
    handler = _Capture(out)
    before = root.level
    root.addHandler(handler)
    root.setLevel(level)
    try:
        yield out
    finally:
        root.removeHandler(handler)
        root.setLevel(before)
