"""The console's short form of a log event (``--log-format console``, the default); ``--log-format json`` keeps
every field of the event as logged.

An event with a view in :data:`VIEWS` shows only the view's fields, in the view's order, under short labels
(``session`` for ``session_signal.session_id``): a proxy request line is about 250 characters instead of 1,100,
the proxy's start line names only the settings that differ from the defaults. Any other event shows all its
fields. Either way values are made readable: no ``None`` or empty values, enum members as their values, floats to
four significant digits, nested mappings flattened to dotted keys, lists joined with commas.
"""

from __future__ import annotations

from collections.abc import Iterator, Mapping
from enum import Enum
from typing import Any

from .model._fields import EVENTS

__all__ = ["VIEWS", "readable", "short_form"]

#: Keys the renderer itself lays out (time, level, event name, traceback), passed through as they are.
_FRAME = ("timestamp", "level", "event", "logger", "exception", "exc_info", "stack")

_SESSION: tuple[tuple[str, str], ...] = (
    ("session", "session_signal.session_id"),
    ("parent", "session_signal.parent"),
    ("generation", "session_signal.generation"),
    ("turn", "session_signal.turn"),
)
_USAGE: tuple[tuple[str, str], ...] = (
    ("prompt_tokens", "usage.prompt_tokens"),
    ("cache_read", "usage.cache_read_tokens"),
    ("cache_write", "usage.cache_write_tokens"),
    ("cause", "reuse_boundary.cause"),
    ("lost_tokens", "reuse_boundary.tokens_lost"),
    ("miss", "miss.cause"),
    ("miss_tokens", "miss.tokens_lost"),
    ("repairs", "repairs"),
    ("cost_usd", "cost_usd"),
)

#: Per event name, the ``(label, dotted path)`` fields the console shows (``a.b|c``: the first path with a value).
VIEWS: dict[str, tuple[tuple[str, str], ...]] = {
    "proxy.start": (
        ("host", "host"),
        ("port", "port"),
        ("upstream", "upstream"),
        ("engine", "engine"),
        ("store", "store"),
        ("live_page", "live_page"),
        ("settings", "changed"),
    ),
    "proxy.request": (
        ("route", "route"),
        ("status", "status"),
        ("outcome", "outcome"),
        ("error", "error"),
        ("session", "session_signal.session_id|session_id"),
        ("turn", "session_signal.turn"),
        ("model", "model"),
        *_USAGE,
        ("coalesce", "coalesce.outcome"),
        ("latency_ms", "latency_ms"),
        ("first_byte_ms", "first_byte_ms"),
    ),
    **{f"session.{name}": (("reason", "reason"), *_SESSION) for name in EVENTS},
}
VIEWS["session.turn"] += _USAGE


def short_form(logger: Any, method: str, event: dict[str, Any]) -> dict[str, Any]:
    """structlog processor: ``event`` in its console form (see the module docstring)."""
    out = {k: event[k] for k in _FRAME if k in event}
    view = VIEWS.get(str(event.get("event")))
    shown = {label: _get(event, path) for label, path in view} if view is not None else event
    fields = _flatten({k: v for k, v in shown.items() if k not in _FRAME})
    for label, value in fields:
        text = readable(value)
        if text:
            out[label] = text
    return out


def readable(value: Any) -> str:
    """``value`` as a console field: ``""`` for None and empty values (left out), an enum member's value,
    a float to four significant digits (integers past 10,000 rounded to units), a list joined with commas."""
    if value is None:
        return ""
    if isinstance(value, Enum):
        return readable(value.value)
    if isinstance(value, bool):
        return str(value).lower()
    if isinstance(value, float):
        return str(round(value)) if abs(value) >= 10_000 else f"{value:.4g}"
    if isinstance(value, list | tuple | set | frozenset):
        return ",".join(readable(v) for v in value)
    return str(value)


def _get(event: Mapping[str, Any], paths: str) -> Any:
    """The value at the first of the ``|``-separated dotted ``paths`` in ``event`` that has one, else None."""
    for path in paths.split("|"):
        value: Any = event
        for key in path.split("."):
            value = value.get(key) if isinstance(value, Mapping) else None
        if value is not None:
            return value
    return None


def _flatten(fields: Mapping[str, Any], prefix: str = "") -> Iterator[tuple[str, Any]]:
    """``(dotted key, value)`` for every leaf of ``fields`` (nested mappings walked)."""
    for key, value in fields.items():
        if isinstance(value, Mapping):
            yield from _flatten(value, f"{prefix}{key}.")
        else:
            yield f"{prefix}{key}", value
