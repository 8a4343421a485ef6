"""The console's short form of a log event (``--log-format console``, the default); ``--log-format json`` keeps
every field of the event as logged.

An event with a view in :data:`VIEWS` shows only the view's fields, in the view's order, under short labels
(``session`` for ``session_signal.session_id``): a proxy request line is about 250 characters instead of 1,100,
the proxy's start line names only the settings that differ from the defaults. Any other event shows all its
fields. Either way values are made readable: no ``None`` or empty values, enum members as their values, floats to
four significant digits, nested mappings flattened to dotted keys, lists joined with commas.
"""

from __future__ import annotations

from collections.abc import Mapping
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
    view = _paths(str(event.get("event")))
    shown = {label: _first(event, paths) for label, paths in view} if view is not None else event
    _put(out, {k: v for k, v in shown.items() if k not in _FRAME}, "")
    return out


def readable(value: Any) -> str:
    """``value`` as a console field: ``""`` for None and empty values (left out), an enum member's value,
    a float to four significant digits (integers past 10,000 rounded to units), a list joined with commas."""
    kind = type(value)
    if kind is str:  # the common cases first, by exact type (a subclass, an enum member, takes the checks below)
        return str(value)
    if kind is int:
        return str(value)
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


#: Per event name, its view and the view's paths split once: ``(view, ((label, ((key, ...), ...)), ...))``. Built
#: on first use and rebuilt when :data:`VIEWS` names another tuple for the event (the line is written per request).
_SPLIT: dict[str, tuple[tuple[tuple[str, str], ...], tuple[tuple[str, tuple[tuple[str, ...], ...]], ...]]] = {}


def _paths(name: str) -> tuple[tuple[str, tuple[tuple[str, ...], ...]], ...] | None:
    """The view of event ``name`` with its ``|``-separated dotted paths split into keys, or None (no view)."""
    view = VIEWS.get(name)
    if view is None:
        return None
    split = _SPLIT.get(name)
    if split is None or split[0] is not view:
        keys = tuple((label, tuple(tuple(p.split(".")) for p in paths.split("|"))) for label, paths in view)
        split = _SPLIT[name] = (view, keys)
    return split[1]


def _first(event: Mapping[str, Any], paths: tuple[tuple[str, ...], ...]) -> Any:
    """The value at the first of ``paths`` (each a tuple of keys, one per nesting level) that has one, else None."""
    for keys in paths:
        value: Any = event
        for key in keys:
            if type(value) is not dict and not isinstance(value, Mapping):
                value = None
                break
            value = value.get(key)
        if value is not None:
            return value
    return None


def _put(out: dict[str, str], fields: Mapping[str, Any], prefix: str) -> None:
    """Every leaf of ``fields`` (nested mappings walked, keys dotted after ``prefix``) into ``out`` as
    :func:`readable` text, the empty ones left out."""
    for key, value in fields.items():
        if type(value) is dict or (type(value) is not str and isinstance(value, Mapping)):
            _put(out, value, f"{prefix}{key}.")
            continue
        text = readable(value)
        if text:
            out[f"{prefix}{key}"] = text
