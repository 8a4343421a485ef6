"""Claude Code's raw API body dumps (format ``claude-code-bodies``): each request exactly as sent, with its answer.

``OTEL_LOG_RAW_API_BODIES=file:DIR`` (Claude Code 2.1.111 and later, design notes; 2.1.197 and 2.1.332 write the
files with telemetry otherwise off) makes Claude Code write into ``DIR``, for every API call of every session (main,
subagents, compaction, side calls such as the session title):

* ``<uuid>.request.json``: the request as the SDK got it: the wire body plus ``betas`` (which the SDK sends as the
  ``anthropic-beta`` header, not in the body), key order kept; thinking text in earlier assistant turns is replaced
  by ``<REDACTED>`` (2.1.332 source), so such a request is not byte-exact;
* ``<request id>.response.json``: the final message (``id``, ``model``, ``content``, ``usage``, ...);
* 2.1.332 also appends ``index.jsonl``: one line per answered call, ``{timestamp, session_id, query_source, model,
  request_id, message_id, message_uuid, request_file, response_file}``. 2.1.197 writes no index, and nothing on disk
  ties a request file to its response (the OTEL log event did): each response is paired with the oldest unpaired
  request of its model written about when or before it whose size fits the prompt tokens the response reports (a
  heuristic: concurrent calls of one model and of like sizes can be swapped; ``meta["paired_by"]`` says which rule
  paired a record). The writes are not awaited: a ``claude -p`` process can
  exit before its last one lands (seen about once in 10 runs of seven processes each: an index line missing, or a
  response file left empty). A request without its index line is paired by time and model too; a response file
  that cannot be read leaves its request's record without usage and the read ``truncated``, as a log line still
  being written does.

Observed running both versions against ``tests/clients/fake_upstream.py``: every request file minus ``betas`` equals
the body the upstream received, key order included (16 of 16 calls in 2.1.197, 17 of 17 in 2.1.332).

A request file is the unit read: one :class:`Record` (api ``anthropic.messages``) with its response's ``usage`` and
the response itself, ``at`` the index time (else the request file's time), ``session`` the ``session_id`` of the
body's ``metadata.user_id`` (a subagent's calls: ``<session>/subagent-<digest of its first message>``; a call
without tools: ``<session>/side``) and ``meta``: ``call_id`` (``<message id>/<request id>``, as the transcript reader
names the call), ``kind``, ``query_source``, ``betas``, ``paired_by``. The index and the response files are claimed
and yield nothing. :func:`join_transcript` gives such records the sessions the transcripts name.
"""

from __future__ import annotations

import functools
import hashlib
import json
import os
import re
from collections.abc import Iterable, Mapping
from dataclasses import replace
from pathlib import Path
from typing import Any

from agentcache._exceptions import InputError
from agentcache.loaders._agentlog import LogRead
from agentcache.loaders._claude_code_request import canonical
from agentcache.loaders._logfields import unix_seconds
from agentcache.loaders._record import Record, UsageRecord
from agentcache.model._usage import normalize_usage

__all__ = ["join_transcript", "read", "sniff_lines", "sniff_path"]

API = "anthropic.messages"
INDEX = "index.jsonl"
_REQUEST = ".request.json"
_RESPONSE = ".response.json"
_UUID = r"[0-9a-f]{8}-[0-9a-f]{4}-[0-9a-f]{4}-[0-9a-f]{4}-[0-9a-f]{12}"
#: A request file is named by a random UUID; a response file by its request id (``req_...``), else a UUID.
_NAME = re.compile(rf"^(?:{_UUID}\.request|(?:req_[A-Za-z0-9_-]+|{_UUID})\.response)\.json$")
_MODEL = re.compile(rb'"model"\s*:\s*"([^"]*)"')
_INDEX_KEYS = frozenset({"request_file", "response_file", "message_id", "session_id"})
#: ``query_source`` values of a conversation's own turns (2.1.332); ``agent:*`` is a subagent's, ``compact`` a
#: compaction run's, anything else a side call.
_MAIN_SOURCES = frozenset({"sdk", "repl_main_thread", "print"})


def sniff_lines(first: list[dict[str, Any]]) -> bool:
    """True for a dump folder's ``index.jsonl`` (its lines name request and response files)."""
    return bool(first) and all(obj.keys() >= _INDEX_KEYS for obj in first)


def sniff_path(path: Path) -> bool:
    """True for a dump folder's request or response file (``<uuid>.request.json``, ``<request id>.response.json``)."""
    return _NAME.match(path.name) is not None


def read(path: Path) -> LogRead:
    """The call a request file holds (a response file or the index gives nothing: each call is read from its
    request file). Raises InputError when the file cannot be read or is not a JSON object."""
    out = LogRead(lines=1)
    if not path.name.endswith(_REQUEST):
        out.ignored = 1
        return out
    body = _json(path)
    folder = path.parent
    index_time = _mtime(folder / INDEX)
    entry = _index(str(folder), index_time).get(path.name)
    response_name = entry.get("response_file") if entry else None
    if entry is None:  # no index (2.1.197), or a call whose index line was lost: pair by time and model
        response_name = _pairs(str(folder), _mtime(folder), index_time).get(path.name)
    response = None
    if isinstance(response_name, str):
        try:
            response = _json(folder / response_name)
        except InputError:
            out.truncated = True  # a response file cut short: its process exited mid-write (not an error)
    out.records.append(_record(path, body, response, entry, response_name))
    return out


def _record(
    path: Path, body: dict[str, Any], response: dict[str, Any] | None, entry: dict[str, Any] | None, name: Any
) -> Record:
    wire = {k: v for k, v in body.items() if k != "betas"}
    source = entry.get("query_source") if entry else None
    session, kind = _session(wire, source)
    request_id = entry.get("request_id") if entry else (name[: -len(_RESPONSE)] if isinstance(name, str) else None)
    meta: dict[str, Any] = {"kind": kind, "query_source": source, "betas": body.get("betas"), "client": "claude-code"}
    meta["format"] = "claude-code-bodies"
    meta["paired_by"] = "index" if entry else ("order" if response is not None else None)
    message_id = response.get("id") if response is not None else entry.get("message_id") if entry else None
    if isinstance(message_id, str):
        meta["call_id"] = f"{message_id}/{request_id}" if request_id else message_id
    at = unix_seconds(entry.get("timestamp")) if entry else None
    usage = response.get("usage") if response is not None else None
    usage = usage if isinstance(usage, dict) else None
    return Record(session, API, wire, at if at is not None else _stamp(path), usage, str(path), 0, meta, response)


def _session(body: dict[str, Any], source: Any) -> tuple[str, str]:
    """(session, kind) of a dumped request (see the module docstring)."""
    metadata = body.get("metadata")
    user = metadata.get("user_id") if isinstance(metadata, dict) else None
    try:
        ids = json.loads(user) if isinstance(user, str) else {}
    except ValueError:
        ids = {}
    sid = ids.get("session_id") if isinstance(ids, dict) else None
    sid = sid if isinstance(sid, str) and sid else "claude-code"
    system = body.get("system")
    first_block = system[0] if isinstance(system, list) and system else {}
    billing = first_block.get("text") if isinstance(first_block, dict) else None
    if isinstance(source, str):  # 2.1.332's index names the caller
        kinds = {"compact": "compaction"}
        kind = kinds.get(source) or (
            "main" if source in _MAIN_SOURCES else "subagent" if source[:6] == "agent:" else "side"
        )
    elif isinstance(billing, str) and "cc_is_subagent=true" in billing:
        kind = "subagent"
    else:  # a conversation's turns carry its tools; a title or other side call has none
        kind = "main" if body.get("tools") else "side"
    if kind == "subagent":
        messages = body.get("messages")
        first = messages[0] if isinstance(messages, list) and messages else None
        return f"{sid}/subagent-{hashlib.sha256(canonical(first)).hexdigest()[:12]}", kind
    return (f"{sid}/side", kind) if kind == "side" else (sid, kind)


def _json(path: Path) -> dict[str, Any]:
    try:
        doc = json.loads(path.read_bytes())
    except OSError as exc:
        raise InputError(f"cannot read file: {exc.strerror or exc}", source=str(path)) from exc
    except (ValueError, RecursionError) as exc:
        raise InputError(f"invalid JSON: {exc}", source=str(path)) from exc
    if not isinstance(doc, dict):
        raise InputError("not a JSON object", source=str(path))
    return doc


def _mtime(path: Path) -> int:
    try:
        return os.stat(path).st_mtime_ns
    except OSError:
        return 0


def _stamp(path: Path) -> float | None:
    mtime = _mtime(path)
    return mtime / 1e9 if mtime else None


@functools.lru_cache(maxsize=16)
def _index(folder: str, _stamp: int) -> dict[str, dict[str, Any]]:
    """Request file name -> its index line (``_stamp``: the index's time, so a grown index is read again)."""
    out: dict[str, dict[str, Any]] = {}
    try:
        with open(os.path.join(folder, INDEX), "rb") as f:
            for raw in f:
                try:
                    entry = json.loads(raw)
                except ValueError:
                    continue  # a line still being written
                if isinstance(entry, dict) and isinstance(entry.get("request_file"), str):
                    out[entry["request_file"]] = entry
    except OSError:
        pass
    return out


#: A request file may land after its answer's (the writes are not awaited): by up to this many seconds.
_SLACK = 1.0
#: Bytes of request body per prompt token, within this factor either way, for a pairing to be plausible.
_BYTES_PER_TOKEN, _FACTOR = 4.0, 4.0


@functools.lru_cache(maxsize=16)
def _pairs(folder: str, _stamp: int, index_stamp: int) -> dict[str, str]:
    """Request file name -> response file name for the files no index line names (all of them in 2.1.197's
    folders; in 2.1.332's, a call whose index line a process did not write before it exited). Each response, in
    file-time order, takes the oldest unpaired request of its model written before it (or up to :data:`_SLACK`
    after) whose size fits the prompt tokens its usage reports (a session title and a turn run at once)."""
    index = _index(folder, index_stamp)
    listed = set(index) | {str(e.get("response_file")) for e in index.values()}
    requests: dict[str, list[tuple[int, str, int]]] = {}
    responses: list[tuple[int, str, str, int]] = []
    with os.scandir(folder) as it:
        for entry in it:
            if not _NAME.match(entry.name) or entry.name in listed:
                continue
            stat, response = entry.stat(), entry.name.endswith(_RESPONSE)
            model, tokens = _head(entry.path, response)
            if response:
                responses.append((stat.st_mtime_ns, entry.name, model, tokens))
            else:
                requests.setdefault(model, []).append((stat.st_mtime_ns, entry.name, stat.st_size))
    for waiting in requests.values():
        waiting.sort()
    out: dict[str, str] = {}
    for at, name, model, tokens in sorted(responses):
        waiting = requests.get(model, [])
        eligible = [r for r in waiting if r[0] <= at + _SLACK * 1e9]
        fits = [r for r in eligible if _fits(r[2], tokens)]
        if eligible:
            chosen = (fits or eligible)[0]
            waiting.remove(chosen)
            out[chosen[1]] = name
    return out


def _fits(size: int, tokens: int) -> bool:
    ratio = size / (_BYTES_PER_TOKEN * tokens) if tokens > 0 else 1.0
    return 1 / _FACTOR <= ratio <= _FACTOR


def _head(path: str, response: bool) -> tuple[str, int]:
    """(the ``model`` a dump file names, the prompt tokens of a response's usage). A request's model is read from
    its head (``model`` is its first field); a response is small and read whole."""
    try:
        with open(path, "rb") as f:
            data = f.read() if response else f.read(4096)
    except OSError:
        return "", 0
    if response:
        try:
            doc = json.loads(data)
        except ValueError:
            doc = None
        if isinstance(doc, dict):
            usage = normalize_usage(doc, API)
            return str(doc.get("model") or ""), usage.prompt_tokens if usage is not None else 0
    found = _MODEL.search(data)
    return (found.group(1).decode("utf-8", "replace") if found else ""), 0


def join_transcript(records: Iterable[Record], usage_records: Iterable[UsageRecord]) -> list[Record]:
    """``records`` with each dumped call that a Claude Code transcript also holds (same ``meta["call_id"]``) put in
    that transcript's session (``session``, ``meta`` ``parent``/``kind``/``project``), and each call kept once (a
    dump is kept over the same call rebuilt from a transcript). Records of other formats pass unchanged."""
    listed = list(records)
    by_call = {u.call_id: u for u in usage_records if u.client == "claude-code"}
    dumped = {r.meta.get("call_id") for r in listed if r.meta.get("format") == "claude-code-bodies"}
    out: list[Record] = []
    for rec in listed:
        call = rec.meta.get("call_id")
        dump = rec.meta.get("format") == "claude-code-bodies"
        if not dump and rec.meta.get("format") == "claude-code" and call in dumped:
            continue  # the dump of this call is kept
        known = by_call.get(call) if dump and isinstance(call, str) else None
        if known is not None:
            meta = {**rec.meta, "parent": known.parent, "kind": known.kind, "project": known.project}
            rec = replace(rec, session=known.session, meta=meta)
        out.append(rec)
    return out


def _nowhere(_: Mapping[str, str]) -> list[Path]:
    return []  # Claude Code writes dumps only where OTEL_LOG_RAW_API_BODIES names: no default place


#: The :class:`~agentcache.loaders._formats.LogFormat` fields after its name and client: ``read``, ``sniff_lines``,
#: ``sniff_path``, ``default_roots``, ``suffixes``.
HOOKS = (read, sniff_lines, sniff_path, _nowhere, (".json", ".jsonl"))
