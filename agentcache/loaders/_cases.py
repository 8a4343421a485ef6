"""Prefix-cache failure cases (``shared/cases/*.json``).

Shape: ``{"id", "kind", "summary", "api", "model", "material", "requests": [{"at": float, "session"?: str,
"body": {...}}, ...], "expect": {"break_at_request", "cause", "first_divergent", "repair", "notes"}}``.

One record per request, with the case's ``api``, the body as is, and ``at`` as recorded. Session:
``<stem>/<request session>``, or ``<stem>/<case id>`` when the request names none. Every record's ``meta`` is
``{"case": id, "expect": expect}``; ``index`` is the request's index in ``requests``.
"""

from __future__ import annotations

from pathlib import Path
from typing import Any

from agentcache._exceptions import InputError
from agentcache.loaders._common import Loaded, is_number, session_id
from agentcache.loaders._record import APIS, Record


def _check_request(req: Any) -> str | None:
    """Why a case request is malformed, or None."""
    if not isinstance(req, dict):
        return "request is not an object"
    if not isinstance(req.get("body"), dict):
        return "request 'body' must be an object"
    if req.get("at") is not None and not is_number(req["at"]):
        return "request 'at' must be a number"
    if req.get("session") is not None and not isinstance(req["session"], str):
        return "request 'session' must be a string"
    return None


def load_case(path: Path, doc: Any) -> Loaded:
    """Records for a parsed case object; malformed requests become errors (``record`` = request index)."""
    src = str(path)
    if not isinstance(doc, dict) or not isinstance(doc.get("requests"), list):
        raise InputError("case must be a JSON object with a 'requests' list", source=src)
    api = doc.get("api")
    if api not in APIS:
        raise InputError(f"case 'api' must be one of {', '.join(APIS)}, not {api!r}", source=src)
    case_id = str(doc.get("id") or path.stem)
    meta = {"case": case_id, "expect": doc.get("expect")}
    records: list[Record] = []
    errors: list[InputError] = []
    for i, req in enumerate(doc["requests"]):
        problem = _check_request(req)
        if problem is not None:
            errors.append(InputError(problem, source=src, record=i))
            continue
        at = req.get("at")
        records.append(
            Record(
                session=session_id(path, req.get("session") or case_id),
                api=str(api),
                body=req["body"],
                at=None if at is None else float(at),
                source=src,
                index=i,
                meta=meta,
            )
        )
    return records, errors
