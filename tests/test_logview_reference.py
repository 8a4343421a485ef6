"""The console's short form (:mod:`agentcache._logview`) and its timestamp, against straightforward references:
the view's paths are split once per event name and the common value types are rendered by exact type, so these
pin that every field, label, order and text is what the plain walk gives."""

from __future__ import annotations

import time
from collections.abc import Iterator, Mapping
from enum import Enum, StrEnum
from types import MappingProxyType
from typing import Any

import pytest
import structlog

from agentcache._log_output import _LocalSecond
from agentcache._logview import VIEWS, readable, short_form
from agentcache.model._types import TargetKind

_FRAME = ("timestamp", "level", "event", "logger", "exception", "exc_info", "stack")


def _reference(event: dict[str, Any]) -> dict[str, Any]:
    """The short form as a plain walk: split every path per line, ``isinstance(..., Mapping)`` at every level."""

    def get(paths: str) -> Any:
        for path in paths.split("|"):
            value: Any = event
            for key in path.split("."):
                value = value.get(key) if isinstance(value, Mapping) else None
            if value is not None:
                return value
        return None

    def flatten(fields: Mapping[str, Any], prefix: str = "") -> Iterator[tuple[str, Any]]:
        for key, value in fields.items():
            if isinstance(value, Mapping):
                yield from flatten(value, f"{prefix}{key}.")
            else:
                yield f"{prefix}{key}", value

    out = {k: event[k] for k in _FRAME if k in event}
    view = VIEWS.get(str(event.get("event")))
    shown = {label: get(path) for label, path in view} if view is not None else event
    for label, value in flatten({k: v for k, v in shown.items() if k not in _FRAME}):
        text = readable(value)
        if text:
            out[label] = text
    return out


class _Plain(str, Enum):  # noqa: UP042 (a str whose str() is not its value, unlike a StrEnum)
    A = "a"


class _Named(StrEnum):
    B = "b"


def _request(**over: Any) -> dict[str, Any]:
    event: dict[str, Any] = {
        "event": "proxy.request", "level": "info", "timestamp": "2026-12-02 10:00:00", "route": "/v1/messages",
        "status": 200, "outcome": "ok", "error": None, "latency_ms": 3.25, "first_byte_ms": None,
        "session_signal": {"session_id": "s1", "turn": 3, "parent": None},
        "usage": {"prompt_tokens": 12_000, "cache_read_tokens": 11_000, "cache_write_tokens": 0},
        "reuse_boundary": {"cause": _Named.B, "tokens_lost": 0}, "miss": {"cause": _Plain.A, "tokens_lost": 7},
        "repairs": ["tools.order", "system"], "cost_usd": 0.00017500000000000003, "model": "claude-sonnet-4-5",
        "coalesce": MappingProxyType({"outcome": "released"}), "storage_tier": {"tiers": {"5m": 1}},
    }  # fmt: skip
    return {**event, **over}


@pytest.mark.parametrize(
    "event",
    [
        _request(),
        _request(session_signal=None, session_id="s2", repairs=[], cost_usd=123456.7, status=True),
        _request(usage="not a mapping", miss=MappingProxyType({"cause": None}), reuse_boundary={}),
        {**_request(), "event": "session.turn", "level": "debug", "reason": TargetKind.ANTHROPIC},
        {"event": "other.event", "level": "info", "nested": {"a": {"b": 1.0, "c": ""}}, "x": 10_001, "y": [1, 2.5]},
        {"event": "proxy.start", "changed": {"simulate": False, "max_state_mb": 64}, "port": 8080, "host": None},
        {"event": 7, "nested.key": 1, "nested": {"key": 2}, "exception": "Traceback"},
    ],
)
def test_short_form_is_the_plain_walk(event: dict[str, Any]) -> None:
    assert short_form(None, "info", dict(event)) == _reference(dict(event))
    assert list(short_form(None, "info", dict(event))) == list(_reference(dict(event)))  # the order too


def test_a_replaced_view_is_used(monkeypatch: pytest.MonkeyPatch) -> None:
    event = _request()
    short_form(None, "info", event)  # the split view of proxy.request is kept
    monkeypatch.setitem(VIEWS, "proxy.request", (("where", "route"), ("who", "session_signal.session_id")))
    assert short_form(None, "info", event) == _reference(event) and "where" in short_form(None, "info", event)


def test_timestamp_is_the_timestampers() -> None:
    fmt = "%Y-%m-%d %H:%M:%S"
    ours, theirs = _LocalSecond(fmt), structlog.processors.TimeStamper(fmt=fmt, utc=False)
    for _ in range(3):
        before = theirs(None, "info", {})["timestamp"]
        stamp = ours(None, "info", {})["timestamp"]
        after = theirs(None, "info", {})["timestamp"]
        assert stamp in (before, after)  # the same text, unless the second turned between the calls
        time.sleep(0.4)
