"""Copy-on-write edits of JSON wire bodies addressed by unit paths (``messages[5].content[0]``)."""

from __future__ import annotations

import functools
import json
import re
from collections.abc import Callable, Mapping
from typing import Any

from agentcache._exceptions import InputError
from agentcache.model._canonical import Block, Marker, digest, dumps
from agentcache.model._equivalence import text_part
from agentcache.model._plan import KEEP, MarkerSpec, WirePlan
from agentcache.model._tokens import default_counter

_TOKEN = re.compile(r"([A-Za-z_]+)|\[(\d+)\]")


@functools.lru_cache(maxsize=8192)
def _parse(path: str) -> tuple[str | int, ...]:
    return tuple(name if name else int(idx) for name, idx in _TOKEN.findall(path))


def parse_path(path: str) -> list[str | int]:
    """``"messages[5].content[0]"`` → ``["messages", 5, "content", 0]`` (memoised: paths repeat every turn)."""
    return list(_parse(path))


def set_path(root: dict[str, Any], path: str, value: Any) -> dict[str, Any]:
    """A copy of ``root`` with ``path`` set to ``value``; containers along the path are copied,
    everything else is shared (the caller's body is never mutated)."""
    keys = parse_path(path)

    def rec(node: Any, i: int) -> Any:
        if i == len(keys):
            return value
        key = keys[i]
        new = list(node) if isinstance(node, list) else dict(node)
        new[key] = rec(node[key], i + 1)  # type: ignore[index]
        return new

    result: dict[str, Any] = rec(root, 0)
    return result


_ITEM = re.compile(r"([A-Za-z_]+)\[(\d+)\]$")

MarkerWriter = Callable[[dict[str, Any], tuple[tuple[str, MarkerSpec], ...], "frozenset[int] | None"], dict[str, Any]]


def replace_units(body: dict[str, Any], replace: Mapping[str, Any]) -> dict[str, Any]:
    """A copy of ``body`` with each ``path → value`` of ``replace`` set. Whole items of a top-level list
    (``messages[5]``, ``tools[2]``) and top-level fields are set with one copy of each list touched, however many
    of its items change; deeper paths go through :func:`set_path`."""
    out = dict(body)
    lists: dict[str, list[Any]] = {}
    for path, value in replace.items():
        m = _ITEM.match(path)
        if m is not None and isinstance(out.get(m.group(1)), list):
            name = m.group(1)
            items = lists.get(name)
            if items is None:
                items = lists[name] = list(out[name])
                out[name] = items
            items[int(m.group(2))] = value
        elif "." not in path and "[" not in path:
            out[path] = value
        else:
            out = set_path(out, path, value)
    return out


def apply_common(body: dict[str, Any], plan: WirePlan, set_markers: MarkerWriter | None = None) -> dict[str, Any]:
    """Apply replace → tool_order → cache_key → markers; ``set_markers`` is the format's marker writer."""
    out = replace_units(body, plan.replace) if plan.replace else dict(body)
    if plan.tool_order is not None:
        tools = out.get("tools") or []
        if sorted(plan.tool_order) != list(range(len(tools))):
            raise InputError(f"tool_order {plan.tool_order} is not a permutation of {len(tools)} tools")
        out["tools"] = [tools[i] for i in plan.tool_order]
    if plan.cache_key is not KEEP:
        if plan.cache_key is None:
            out.pop("prompt_cache_key", None)
        else:
            out["prompt_cache_key"] = plan.cache_key
    if set_markers is not None and (plan.markers is not None or plan.top_marker is not None):
        out = set_markers(out, plan.markers if plan.markers is not None else (), plan.marked)
        if plan.top_marker is False:
            out.pop("cache_control", None)
        elif plan.top_marker is True and "cache_control" not in out:
            out["cache_control"] = {"type": "ephemeral"}
    return out


def require_dict(body: Any, api: str) -> dict[str, Any]:
    """``body`` if it is a JSON object with a list ``messages``/``input``; else InputError."""
    if not isinstance(body, dict):
        raise InputError(f"{api} body must be a JSON object, got {type(body).__name__}")
    return body


def require_list(value: Any, where: str, *, items: type | tuple[type, ...] = dict) -> list[Any]:
    """``value`` if it is a list of ``items`` (None counts as empty); else InputError naming ``where``."""
    if value is None:
        return []
    if not isinstance(value, list) or not all(isinstance(v, items) for v in value):
        kinds = items.__name__ if isinstance(items, type) else "/".join(t.__name__ for t in items)
        raise InputError(f"{where} must be a list of {kinds}")
    return value


def require_content(value: Any, where: str) -> None:
    """Message content must be a string, a list of content blocks (objects), or null."""
    if value is None or isinstance(value, str):
        return
    require_list(value, where)


def wanted_items(markers: tuple[tuple[str, MarkerSpec], ...], field: str) -> set[int]:
    """Indices ``i`` of the ``field[i]...`` items that ``markers`` name (paths parsed once, not per unit)."""
    out: set[int] = set()
    for path, _ in markers:
        parts = parse_path(path)
        if len(parts) > 1 and parts[0] == field and isinstance(parts[1], int):
            out.add(parts[1])
    return out


def content_units(
    items: Any,
    field: str,
    key: str,
    wanted: set[int],
    *,
    strings: bool,
    roles_only: bool = False,
    marked: frozenset[int] | None = None,
) -> list[tuple[str, Any]]:
    """``(path, unit)`` of the message content units a marker writer must visit: every unit of a ``wanted``
    item, and elsewhere only the units that carry ``key`` now (the others stay as they are, so a long history
    costs one membership test per unit). ``strings``: a non-empty string content is a unit (markable);
    ``roles_only``: skip items without a ``role`` (Responses items that are not messages). ``marked``: the items
    that may carry ``key`` now, when known: only those and the ``wanted`` ones are looked at."""
    units: list[tuple[str, Any]] = []
    seq = items if isinstance(items, list) else []
    indices = range(len(seq)) if marked is None else sorted(i for i in wanted | marked if i < len(seq))
    for i in indices:
        item = seq[i]
        if not isinstance(item, dict) or (roles_only and not item.get("role")):
            continue
        content = item.get("content")
        if isinstance(content, list) and content:
            if i in wanted:
                units += [(f"{field}[{i}].content[{j}]", blk) for j, blk in enumerate(content)]
            else:
                units += [
                    (f"{field}[{i}].content[{j}]", blk)
                    for j, blk in enumerate(content)
                    if isinstance(blk, dict) and key in blk
                ]
        elif i in wanted and (not strings or (isinstance(content, str) and content)):
            units.append((f"{field}[{i}].content", content))
    return units


def write_markers(
    body: dict[str, Any],
    units: list[tuple[str, Any]],
    markers: tuple[tuple[str, MarkerSpec], ...],
    key: str,
    value: Callable[[str], Any],
    api: str,
) -> dict[str, Any]:
    """A copy of ``body`` where, among ``units`` (``(path, unit)`` for every unit of ``body`` that carries a
    marker or may be given one), exactly the ``(path, marker)`` pairs of ``markers`` carry ``key``: a
    :class:`~agentcache.model.Marker` with a ``raw`` wire value (the client's own) as it was sent, else
    ``value(ttl)``. A string unit that gets a marker becomes a one-element list of the one text part wire ``api``
    defines as that string there (:func:`~agentcache.model._equivalence.text_part`). Raises InputError for a marker
    path not among ``units``, or for a string where the API defines no such part."""
    want = dict(markers)
    out = body
    for path, unit in units:
        has = isinstance(unit, dict) and key in unit
        spec = want.pop(path, None)
        if spec is None and not has:
            continue
        if isinstance(unit, str):
            unit = {"type": _part(api, path, _role_at(body, path)), "text": unit}
            new: Any = [unit]
        if isinstance(unit, dict):
            unit = {k: v for k, v in unit.items() if k != key}
            if spec is not None:
                unit[key] = _marker_value(spec, value)
        new = [unit] if path.endswith(".content") or path in ("system", "instructions") else unit
        out = set_path(out, path, new)
    if want:
        raise InputError(f"marker paths not in body: {sorted(want)}")
    return out


def as_text_block(block: Block, api: str, marker: Marker | None) -> Block:
    """The canonical block of a string unit once :func:`write_markers` turned it into a one-element list of the
    text part ``api`` defines there, carrying ``marker``: what reading the sent body again would give, without
    reading it (the block's path gets ``[0]``; tokens counted on the same text, memoised by the new digest)."""
    text = json.loads(block.data)
    env = json.loads(block.env) if block.env else None
    data = dumps({"type": _part(api, block.path, env.get("role") if isinstance(env, dict) else None), "text": text})
    d = digest(block.env, data)
    tokens = default_counter().count(d, text)
    return Block(
        f"{block.path}[0]", block.section, "text", data, block.env, d, tokens, block.message, block.name, marker,
        text == "",
    )  # fmt: skip


def _role_at(body: dict[str, Any], path: str) -> Any:
    """The ``role`` of the conversation item a content ``path`` (``input[3].content``) belongs to, else None."""
    keys = parse_path(path)
    items = body.get(str(keys[0])) if len(keys) > 2 else None
    item = items[keys[1]] if isinstance(items, list) and isinstance(keys[1], int) and keys[1] < len(items) else None
    return item.get("role") if isinstance(item, dict) else None


def _part(api: str, path: str, role: Any) -> str:
    part = text_part(api, path, role if isinstance(role, str) else None)
    if part is None:
        raise InputError(f"{api} defines no text part for a string at {path}")
    return part


def _marker_value(spec: MarkerSpec, value: Callable[[str], Any]) -> Any:
    if isinstance(spec, Marker):
        return spec.raw if spec.raw is not None else value(spec.ttl)
    return value(spec)
