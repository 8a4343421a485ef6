"""JSONL request logs.

Shape: one JSON object per line, ``{"session": str, "api": one of APIS, "at"?: number, "body": {...},
"usage"?: {...}, "response"?: {...}, "parent"?: str}`` (``response``: the whole response object; its ``usage`` is
the record's usage when ``usage`` is absent; ``parent``: the session a subagent's session belongs to, read into
``Record.meta["parent"]``); other fields are ignored. Lines are split on newlines only (JSON strings may hold
U+2028) and streamed; blank lines are skipped. A malformed line (invalid JSON, nested too deeply, a lone surrogate,
not UTF-8, too long, a wrong shape; or anything that makes reading it fail) becomes an :class:`InputError` with
``record`` = its 0-based line index (also the record's ``index``); the other lines still load. Sessions (and
parents) are prefixed with the file stem: ``<stem>/<session>``, except on lines with a ``recorded_by`` string: those
of ``agentcache proxy --record`` (:mod:`agentcache.proxy._record`), whose session ids are the proxy's own and span
its rotated files, so they are kept as written.
"""

from __future__ import annotations

import json
from pathlib import Path
from typing import Any

from agentcache._exceptions import InputError
from agentcache.loaders._agentlog import lines, too_long
from agentcache.loaders._common import Loaded, check_unicode, is_number, problem, session_id
from agentcache.loaders._record import APIS, Record


def parse_line(path: Path, line: str, index: int) -> Record:
    """One JSONL line as a Record; raises ValueError describing what is wrong with it."""
    try:
        obj: Any = json.loads(line)
    except json.JSONDecodeError as exc:
        raise ValueError(f"invalid JSON: {exc}") from exc
    except RecursionError as exc:
        raise ValueError(f"invalid JSON: {problem(exc)}") from exc
    check_unicode(line, obj)
    if not isinstance(obj, dict):
        raise ValueError("line is not a JSON object")
    session, api, body = obj.get("session"), obj.get("api"), obj.get("body")
    if not isinstance(session, str) or not session:
        raise ValueError("'session' must be a non-empty string")
    if api not in APIS:
        raise ValueError(f"'api' must be one of {', '.join(APIS)}, not {api!r}")
    if not isinstance(body, dict):
        raise ValueError("'body' must be an object")
    at, usage = obj.get("at"), obj.get("usage")
    if at is not None and not is_number(at):
        raise ValueError("'at' must be a number")
    if usage is not None and not isinstance(usage, dict):
        raise ValueError("'usage' must be an object")
    response = obj.get("response")
    if response is not None and not isinstance(response, dict):
        raise ValueError("'response' must be an object")
    if usage is None and response is not None and isinstance(response.get("usage"), dict):
        usage = response["usage"]
    parent = obj.get("parent")
    if parent is not None and (not isinstance(parent, str) or not parent):
        raise ValueError("'parent' must be a non-empty string")
    recorded = isinstance(obj.get("recorded_by"), str)  # the proxy's ids: one session across its rotated files
    return Record(
        session=session if recorded else session_id(path, session),
        api=str(api),
        body=body,
        at=None if at is None else float(at),
        usage=usage,
        source=str(path),
        index=index,
        meta=_meta(obj, parent, recorded, path),
        response=response,
    )


def _meta(obj: dict[str, Any], parent: str | None, recorded: bool, path: Path) -> dict[str, Any]:
    """``parent`` (prefixed like the session unless recorded) and, on a proxy recording's line, ``recorded_by``
    (its ``at`` is then unix seconds: the time filters apply to it)."""
    meta: dict[str, Any] = {}
    if parent is not None:
        meta["parent"] = parent if recorded else session_id(path, parent)
    if recorded:
        meta["recorded_by"] = obj["recorded_by"]
    return meta


def load_jsonl(path: Path, doc: Any = None) -> Loaded:
    """Records of a JSONL file (``doc`` is ignored: the file is streamed line by line, each line at most
    :data:`~agentcache.loaders._agentlog.MAX_LINE_BYTES`; a longer one, or one that is no UTF-8, costs itself)."""
    records: list[Record] = []
    errors: list[InputError] = []
    for i, raw in lines(path):
        if raw is None:
            errors.append(too_long(path, i))
            continue
        if not raw.strip():
            continue
        try:
            records.append(parse_line(path, raw.decode("utf-8"), i))
        except Exception as exc:  # any failure costs this line only
            errors.append(InputError(problem(exc), source=str(path), record=i))
    return records, errors
