"""Codex CLI rollouts: ``$CODEX_HOME/sessions/YYYY/MM/DD/rollout-<time>-<thread id>.jsonl`` (``~/.codex`` when
``CODEX_HOME`` is unset), one file per thread (a conversation, or a subagent's).

Format facts, observed running codex 0.171.0 against a scripted upstream unless a source is named:

* Each line is ``{timestamp, type, payload}`` (0.171 adds ``ordinal``). ``session_meta``: ``id`` (the thread),
  ``session_id`` (0.171: the root thread of a subagent tree), ``cwd``, ``source`` (``"exec"``, ``"cli"``, ... or
  ``{"subagent": {"thread_spawn": {"parent_thread_id", "depth"}}}``), ``parent_thread_id``, ``forked_from_id``;
  ``turn_context``: ``model``, ``cwd``; then ``response_item``, ``event_msg``, ``world_state``, ``compacted``.
* One API call, in 0.171: a ``token_usage_record`` line (``thread_id``, ``response_id``, ``usage`` of the call,
  ``thread_token_usage`` the thread's running total), then an ``event_msg`` ``token_count`` with the same figures
  (``info.last_token_usage``, ``info.total_token_usage``). Older versions write only the ``token_count``. A
  ``token_count`` is written again with an unchanged total (0.171 does it too; rate-limit updates), and once with an
  all-zero ``last_token_usage`` after a compaction: a count whose total did not move is no new call.
* Usage fields: ``input_tokens`` (the whole prompt, cached included), ``cached_input_tokens``,
  ``cache_write_input_tokens`` (0.171), ``output_tokens``, ``reasoning_output_tokens``: read as the Responses
  usage they come from (a custom provider on ``wire_api = "chat"`` is converted by Codex into the same shape).
* Compaction (``model_auto_compact_token_limit``; a custom provider's compaction is an ordinary ``/responses``
  call): the compaction call's answer is a ``response_item`` with ``metadata.compaction_output``, then its
  ``token_usage_record``, then a ``compacted`` line. That call is kind ``compaction``; the next gets ``compacted``.
* A fork (``spawn_agent`` with ``fork_context``, ``codex fork``) copies the parent's history after a copy of the
  parent's ``session_meta``. 0.171 copies no token records; 0.128-0.153 copied the parent's ``token_count``
  events, re-stamped at fork time (public issue threads: ccusage/ccusage#950, junhoyeo/tokscale#520,
  chattymin/PokeTokenBar#128). A copied ``token_usage_record`` names the parent's ``thread_id`` and is skipped; a
  copied ``token_count`` carries the parent's running totals, so its call id (root thread + totals) is the
  parent's own and :func:`~agentcache.loaders._paths.load_paths` counts the call once.
* A resume (``codex exec resume``) appends to the thread's rollout and writes no marker: its lines are those of
  a second turn in one process (the TUI's, observed too), so no ``resumed`` event can be recorded.
* ``$CODEX_HOME/history.jsonl`` (``{session_id, ts, text}``: the prompts typed) holds no usage: recognised, no calls.
* Rollouts from before the typed lines (a first line ``{id, timestamp, instructions}``, then bare response items
  and ``{"record_type": "state"}``; codex-rs ``rollout.rs`` of mid-2025) hold no token counts: recognised, no calls.
"""

from __future__ import annotations

import os
from collections.abc import Mapping
from dataclasses import dataclass, field, replace
from pathlib import Path
from typing import Any

from agentcache.loaders._agentlog import LogRead, read_each
from agentcache.loaders._logfields import get_dict, get_str, lineage, tokens, unix_seconds, usage_of
from agentcache.loaders._record import CallKind, UsageRecord

__all__ = ["default_roots", "read_codex", "sniff_lines"]

CLIENT = "codex"
API = "openai.responses"
#: The line types of a typed rollout.
LINE_TYPES = frozenset(
    {"session_meta", "turn_context", "response_item", "event_msg", "compacted", "token_usage_record", "world_state"}
)
_LEGACY_META = frozenset({"id", "timestamp", "instructions", "git"})
_HISTORY = frozenset({"session_id", "ts", "text"})
_FIELDS = ("input_tokens", "cached_input_tokens", "cache_write_input_tokens", "output_tokens", "total_tokens")


def default_roots(environ: Mapping[str, str]) -> list[Path]:
    """``$CODEX_HOME/sessions``, then ``~/.codex/sessions``."""
    roots = [Path(environ["CODEX_HOME"]) / "sessions"] if environ.get("CODEX_HOME") else []
    home = environ.get("HOME") or os.path.expanduser("~")
    return [*roots, Path(home) / ".codex" / "sessions"]


def sniff_lines(first: list[dict[str, Any]]) -> bool:
    """A typed rollout (a line ``{timestamp, type, payload}`` of a rollout type), a pre-typed one (a first line
    of only ``id``, ``timestamp``, ``instructions``, ``git``), or the prompt history (``session_id``, ``ts``,
    ``text``)."""
    if any(o.get("type") in LINE_TYPES and isinstance(o.get("payload"), dict) and "timestamp" in o for o in first):
        return True
    head = first[0]
    return {"id", "timestamp"} <= head.keys() <= _LEGACY_META or head.keys() == _HISTORY


def read_codex(path: Path) -> LogRead:
    """Every API call of one rollout, in file order (see the module docstring). Raises :class:`InputError` when
    the file cannot be opened."""
    read = LogRead()
    return read_each(path, _Rollout(path, read).line, read)


def _vector(usage: Any) -> tuple[int, ...]:
    """The counts of a Codex usage object, in :data:`_FIELDS` order (ValueError when it is not one)."""
    if not isinstance(usage, dict) or "input_tokens" not in usage:
        raise ValueError("token usage without input_tokens")
    return tuple(tokens(usage.get(k)) for k in _FIELDS)


@dataclass(slots=True)
class _Thread:
    """Who the rollout's calls belong to, from its first ``session_meta``."""

    id: str
    root: str  # the thread whose running totals key a token_count's call id
    session: str
    parent: str | None
    kind: CallKind
    project: str | None


@dataclass(slots=True)
class _Rollout:
    """One rollout read line by line: the thread, the latest model and working directory, the running total of the
    last call counted, and what happened since it."""

    path: Path
    read: LogRead
    thread: _Thread | None = None
    model: str = ""
    cwd: str | None = None
    last_total: tuple[int, ...] | None = None
    last_usage: tuple[int, ...] | None = None
    events: list[str] = field(default_factory=list)
    quiet: bool = False  # only token counts since the last call
    compaction_output: bool = False  # the next call answered a compaction

    def line(self, i: int, obj: dict[str, Any]) -> None:
        kind, payload = obj.get("type"), obj.get("payload")
        if not isinstance(payload, dict):
            return
        if kind == "event_msg" and payload.get("type") == "token_count":
            self.token_count(i, obj, payload)
            return
        if kind == "compacted":
            self.compacted()
            return
        # Between a compaction call and its ``compacted`` line come only events (no turn boundary, no item).
        self.quiet = self.quiet and kind in ("event_msg", "world_state") and payload.get("type") != "task_complete"
        if kind == "session_meta" and self.thread is None:
            self.thread = _thread(payload, self.path)
        elif kind == "turn_context":
            self.model = get_str(payload, "model") or self.model
            self.cwd = get_str(payload, "cwd") or self.cwd
        elif kind == "token_usage_record":
            self.usage_record(i, obj, payload)
        elif kind == "response_item":
            self.compaction_output = self.compaction_output or bool(get_dict(obj, "metadata").get("compaction_output"))

    def usage_record(self, i: int, obj: dict[str, Any], payload: dict[str, Any]) -> None:
        thread = self.own()
        if get_str(payload, "thread_id") not in (None, thread.id):
            return  # a fork's copy of its parent's call: counted in the parent's rollout
        usage = _vector(payload.get("usage"))
        total = _vector(payload["thread_token_usage"]) if isinstance(payload.get("thread_token_usage"), dict) else None
        rid = get_str(payload, "response_id")
        call_id = f"codex:{rid}" if rid else _total_key(thread.root, total or usage)
        self.add(i, obj, usage, call_id)
        self.last_total, self.last_usage = total, usage

    def token_count(self, i: int, obj: dict[str, Any], payload: dict[str, Any]) -> None:
        info = payload.get("info")
        if not isinstance(info, dict):
            return  # a rate-limit update: no usage
        total = _vector(info.get("total_token_usage"))
        last = _vector(info.get("last_token_usage"))
        if total == self.last_total or (self.last_total is None and last == self.last_usage):
            return  # the same call again (its token_usage_record, or the count written twice)
        self.last_total, self.last_usage = total, last
        if last[0] == 0:
            return  # a context-size update after a compaction, not a call
        self.add(i, obj, last, _total_key(self.own().root, total))

    def add(self, i: int, obj: dict[str, Any], usage: tuple[int, ...], call_id: str) -> None:
        thread = self.own()
        prompt, read, write, output, _ = usage
        kind: CallKind = "compaction" if self.compaction_output else thread.kind
        self.read.usage_records.append(
            UsageRecord(
                session=thread.session,
                client=CLIENT,
                api=API,
                usage=usage_of(API, prompt, read, write, output),
                model=self.model,
                at=unix_seconds(obj.get("timestamp")),
                call_id=call_id,
                parent=thread.parent,
                project=self.cwd or thread.project,
                kind=kind,
                events=tuple(self.events),
                source=str(self.path),
                index=i,
            )
        )
        self.events.clear()
        self.quiet, self.compaction_output = True, False

    def compacted(self) -> None:
        """A compaction boundary: the call just before it (nothing but token counts between) was the compaction."""
        records = self.read.usage_records
        if self.quiet and records and records[-1].kind != "compaction":
            records[-1] = replace(records[-1], kind="compaction")
        self.events.append("compacted")
        self.quiet = False

    def own(self) -> _Thread:
        if self.thread is None:  # a call before any session_meta: the thread id is in the file name
            self.thread = _thread({}, self.path)
        return self.thread


def _thread(meta: dict[str, Any], path: Path) -> _Thread:
    """The thread a ``session_meta`` describes: a conversation (its own session), or a subagent (``<root>/<own>``,
    its parent the spawning thread's session)."""
    own = get_str(meta, "id") or _file_thread(path)
    source = meta.get("source")
    sub = source.get("subagent") if isinstance(source, dict) else None
    spawn = get_dict(sub, "thread_spawn") if isinstance(sub, dict) else {}
    parent = get_str(meta, "parent_thread_id") or get_str(spawn, "parent_thread_id")
    tree = get_str(meta, "session_id")  # 0.171: the root thread of the subagent tree
    # A fork's copied counts carry its parent's running totals: key them to the thread that counted them.
    root = tree or get_str(meta, "forked_from_id") or own
    kind: CallKind = "main"
    if sub == "compact":
        kind = "compaction"
    elif sub is not None or meta.get("thread_source") == "subagent":
        kind = "subagent"
    if kind == "main" or parent is None:
        return _Thread(own, root, own, None, kind, get_str(meta, "cwd"))
    top = tree or parent  # before 0.171 the tree's root is not named: a depth-1 subagent's parent is it
    session, parent_session = lineage([top, parent, own] if top not in (parent, own) else [parent, own])
    return _Thread(own, root, session, parent_session, kind, get_str(meta, "cwd"))


def _file_thread(path: Path) -> str:
    """The thread id in a rollout's name (``rollout-<time>-<uuid>``: its last five dash-separated parts)."""
    parts = path.stem.split("-")
    return "-".join(parts[-5:]) if len(parts) > 5 else path.stem


def _total_key(root: str, total: tuple[int, ...]) -> str:
    """The call id of a call known by its thread's running total (equal in a fork's copy of the parent's count)."""
    return f"codex:{root}:{'/'.join(map(str, total))}"
