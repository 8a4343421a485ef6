"""An SDK call as a wire body and back: which keyword arguments are body fields (:func:`split_kwargs`, values
dumped as the SDK would send them), and the keyword arguments that send a planned body through the same SDK
method (:func:`send_kwargs`). Anything the wrapper cannot read as JSON raises :class:`Passthrough`: the call goes
out unchanged."""

from __future__ import annotations

import functools
import inspect
from collections.abc import Callable, Mapping
from datetime import date
from typing import Any

__all__ = ["SDK_ONLY", "Passthrough", "sdk_of", "send_kwargs", "split_kwargs", "wants_raw", "wire_value"]

#: SDK keyword arguments that are not wire body fields: kept aside and passed back unchanged.
SDK_ONLY = frozenset(
    {"extra_headers", "extra_query", "extra_body", "timeout", "output_format", "text_format", "betas"}
    | {"user_profile_id", "workspace_id"}
)
_RAW_HEADER = "x-stainless-raw-response"
_RAW_HEADER = "x-stainless-raw-response"
_MAX_DEPTH = 64


class Passthrough(Exception):
    """The call is not one the wrapper understands: send it unchanged."""


def sdk_of(client: Any) -> str | None:
    """``anthropic`` or ``openai`` from the client's class hierarchy, else None."""
    for cls in type(client).__mro__:
        root = cls.__module__.split(".")[0]
        if root in ("anthropic", "openai"):
            return root
    return None


def _is_sentinel(value: Any) -> bool:
    cls = type(value)
    return cls.__name__ in ("NotGiven", "Omit") and cls.__module__.split(".")[0] in ("anthropic", "openai")


def wire_value(value: Any, depth: int = 0) -> Any:
    """``value`` as the JSON value the SDK would send (models dumped as the SDK does); raises
    Passthrough for anything else (files, bytes, unknown objects)."""
    if depth > _MAX_DEPTH:
        raise Passthrough("body nested too deep")
    if value is None or isinstance(value, str | bool | int | float):
        return value
    if isinstance(value, Mapping):
        return {str(k): wire_value(v, depth + 1) for k, v in value.items() if not _is_sentinel(v)}
    if isinstance(value, list | tuple):
        return [wire_value(v, depth + 1) for v in value if not _is_sentinel(v)]
    dump = getattr(value, "model_dump", None)
    if callable(dump) and not isinstance(value, type):
        exclude = getattr(value, "__api_exclude__", None)
        return wire_value(dump(exclude_unset=True, mode="json", by_alias=True, exclude=exclude), depth + 1)
    if isinstance(value, date):
        return value.isoformat()
    raise Passthrough(f"value of type {type(value).__name__} in the body")


@functools.lru_cache(maxsize=256)
def _params(fn: Callable[..., Any]) -> tuple[frozenset[str], bool]:
    """Keyword names ``fn`` declares, and whether it takes ``**kwargs``."""
    sig = inspect.signature(fn)
    var_kw = any(p.kind is p.VAR_KEYWORD for p in sig.parameters.values())
    return frozenset(n for n, p in sig.parameters.items() if p.kind is not p.VAR_KEYWORD), var_kw


def _method_key(method: Any) -> Any:
    return getattr(method, "__func__", method)


def split_kwargs(method: Any, kwargs: Mapping[str, Any]) -> tuple[dict[str, Any], dict[str, Any]]:
    """``(wire body, SDK-only kwargs)`` of a call; raises Passthrough when not understood."""
    names, var_kw = _params(_method_key(method))
    body: dict[str, Any] = {}
    side: dict[str, Any] = {}
    for key, value in kwargs.items():
        if key not in names and not var_kw:
            raise Passthrough(f"unknown keyword argument {key!r}")
        if key in SDK_ONLY:
            side[key] = value
        elif not _is_sentinel(value):
            body[key] = wire_value(value)
    return body, side


def wants_raw(headers: Any) -> bool:
    """True when the SDK call asks for the raw HTTP response (the SDK's raw-response header is set, as its
    ``with_raw_response``/``with_streaming_response`` wrappers do)."""
    return isinstance(headers, Mapping) and any(str(h).lower() == _RAW_HEADER for h in headers)


def send_kwargs(method: Any, body: Mapping[str, Any], side: Mapping[str, Any]) -> dict[str, Any]:
    """Keyword arguments for the SDK method: declared body fields as themselves, the others merged
    under ``extra_body`` (the caller's own ``extra_body`` wins), plus the SDK-only arguments."""
    names, _ = _params(_method_key(method))
    out = dict(side)
    extra = {k: v for k, v in body.items() if k not in names or k in SDK_ONLY}
    out.update((k, v) for k, v in body.items() if k not in extra)
    if extra:
        mine = side.get("extra_body")
        out["extra_body"] = {**extra, **(mine if isinstance(mine, Mapping) else {})}
    return out
