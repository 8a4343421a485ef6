"""tau-bench results files.

Shape: a JSON list of runs ``{"task_id": int, "reward": float, "info": {...}, "traj": [message, ...],
"trial": int}``, where ``traj`` holds OpenAI chat messages (system, user, assistant, tool). The tool schemas
are not in the file: they come from ``tools_path`` or from ``<domain>_tools.json`` next to the file
(``gpt-4o-airline.json`` -> ``airline_tools.json``), else ``tools.json``.

One session per run (``<stem>/task<task_id>-trial<trial>``) and one request per assistant message
``traj[i]``, rebuilt as upstream's ``ToolCallingAgent.solve`` sent it::

    {"model": "gpt-4o", "messages": traj[:i], "tools": tools, "temperature": 0.0}

Message dicts are shared, not copied, between the requests of a run (bodies must not be mutated).
"""

from __future__ import annotations

from pathlib import Path
from typing import Any

from agentcache._exceptions import InputError
from agentcache.loaders._common import Loaded, read_json, session_id
from agentcache.loaders._record import Record

MODEL = "gpt-4o"


def find_tools(path: Path, tools_path: str | None) -> Path:
    """The tool-schema file for a tau-bench results file."""
    if tools_path is not None:
        return Path(tools_path)
    domain = path.stem.rsplit("-", 1)[-1]
    for name in (f"{domain}_tools.json", "tools.json"):
        candidate = path.with_name(name)
        if candidate.is_file():
            return candidate
    raise InputError(
        f"no tool schemas found next to the file ({domain}_tools.json or tools.json); "
        "name them with --tools FILE (tools_path= in Python)",
        source=str(path),
    )


def load_tools(path: Path, tools_path: str | None) -> list[Any]:
    """The list of OpenAI function schemas, validated to be a JSON list of objects."""
    found = find_tools(path, tools_path)
    tools = read_json(found)
    if not isinstance(tools, list) or not all(isinstance(t, dict) for t in tools):
        raise InputError("tool schemas must be a JSON list of objects", source=str(found))
    return tools


def _check_run(run: Any) -> str | None:
    """Why ``run`` is malformed, or None."""
    if not isinstance(run, dict):
        return "run is not an object"
    if "task_id" not in run or not isinstance(run.get("traj"), list):
        return "run needs 'task_id' and a 'traj' list"
    for j, msg in enumerate(run["traj"]):
        if not isinstance(msg, dict) or not isinstance(msg.get("role"), str):
            return f"traj[{j}] is not a message with a role"
    return None


def load_taubench(path: Path, doc: Any, tools_path: str | None = None) -> Loaded:
    """Records for a parsed tau-bench results list; malformed runs become errors (``record`` = run index)."""
    src = str(path)
    if not isinstance(doc, list):
        raise InputError("tau-bench file must be a JSON list of runs", source=src)
    tools = load_tools(path, tools_path)
    records: list[Record] = []
    errors: list[InputError] = []
    for r, run in enumerate(doc):
        problem = _check_run(run)
        if problem is not None:
            errors.append(InputError(problem, source=src, record=r))
            continue
        session = session_id(path, f"task{run['task_id']}-trial{run.get('trial', 0)}")
        traj: list[dict[str, Any]] = run["traj"]
        for i, msg in enumerate(traj):
            if msg["role"] != "assistant":
                continue
            body = {"model": MODEL, "messages": traj[:i], "tools": tools, "temperature": 0.0}
            records.append(Record(session=session, api="openai.chat", body=body, source=src, index=len(records)))
    return records, errors
