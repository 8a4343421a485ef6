"""Claude Code transcripts (format ``claude-code``): each API call of a session by the usage Claude Code kept, and
the exact request body where the transcript records it (2.1.332: :mod:`~agentcache.loaders._claude_code_request`).

Format facts (observed running Claude Code 2.1.197 and 2.1.332 against ``tests/clients/fake_upstream.py``, and
read in their bundled JavaScript; older layouts from the public notes named):

* **Where.** ``<config>/projects/<working directory, each character but letters and digits as "-">/<session
  id>.jsonl`` (``/tmp/w`` is ``-tmp-w``); ``<config>`` is
  ``$CLAUDE_CONFIG_DIR``, else ``~/.claude`` (the only two places both versions know; ccusage also searches
  ``~/.config/claude/projects``, which it names the default of earlier versions). A subagent's transcript is
  ``<session id>/subagents/agent-<agent id>.jsonl`` (with ``agent-<agent id>.meta.json``: ``agentType``); 2.0.x kept
  ``agent-<agent id>.jsonl`` beside the session file (jeremedia/claude-code-log-format, read from 2.0.55), and
  earlier versions wrote subagent lines into the session file (``isSidechain: true``).
* **Calls.** One API call is one or more ``assistant`` lines, one per content block, with the same ``message.id``
  and ``requestId``; each repeats the call's ``message.usage``, the last line's is final; tool results may come
  between them. A ``model: "<synthetic>"`` line is Claude Code's own text (no API call). ``call_id`` is
  ``<message.id>/<requestId>`` (``message.id`` alone without a ``requestId``), so the same call in two files
  counts once (:func:`~agentcache.loaders._paths.load_paths`).
* **Sessions.** Each line names its ``sessionId``; a subagent's lines name their parent's and add ``agentId`` and
  ``isSidechain: true``: the call belongs to session ``<sessionId>/<agentId>`` (the name the proxy gives it from
  ``x-claude-code-agent-id``), ``parent`` ``sessionId`` (the root session: a nested subagent's spawner is not
  recorded in its lines), kind ``subagent``. An inline
  sidechain without ``agentId`` is named after the first line of its ``parentUuid`` chain. A file named
  ``agent-acompact-*`` (design notes, earlier versions) is a compaction run: its calls belong to their session, kind
  ``compaction``. 2.1.197 and 2.1.332 write no such file: their compaction calls (and 2.1.197's session-title call)
  are in no transcript. ``project`` is the line's ``cwd``.
* **Events.** ``compacted``: a ``system`` line ``subtype: compact_boundary`` (both versions write one, then the
  ``isCompactSummary`` user line, which counts too where user lines are read) came in the session since its
  previous call. ``resumed``: the call is the first of a new process
  (``--continue``, ``--resume`` and a restart all append to the session's own file in both versions). No line says
  a process started, but each leaves one when it ends: 2.1.332 a ``cost-state`` line (with the process
  ``startTime``), 2.1.197 a ``last-prompt`` line (2.1.332 writes ``last-prompt`` after every turn, so it counts
  only in a file without ``cost-state``; checked with two turns in one process); and a ``version`` change between
  two calls is a new process. A heuristic: a process killed before its end line goes unseen.

Reading streams the file and parses only the lines that can matter (``assistant`` lines, event lines, and the user
lines of a file that records its requests). Which kind a line is shows in its first bytes: Claude Code writes the
small fields first, then a user line's own ``type`` (before its ``message``), an attachment's ``attachment``, an
assistant line's ``message`` (whose ``type`` is ``message``); so the big tool results most lines carry are neither
parsed nor searched (a line whose head does not say is searched whole). An ``assistant`` line without a readable
usage is an error; all other lines are ignored.
"""

from __future__ import annotations

from collections.abc import Mapping
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

from agentcache._exceptions import InputError
from agentcache.loaders._agentlog import LogRead, json_lines
from agentcache.loaders._claude_code_request import RequestLog
from agentcache.loaders._logfields import lineage, unix_seconds
from agentcache.loaders._record import CallKind, Record, UsageRecord
from agentcache.model._usage import normalize_usage

__all__ = ["default_roots", "read", "sniff_lines", "sniff_path"]

API = "anthropic.messages"
CLIENT = "claude-code"
#: Line kinds only Claude Code writes (with a ``sessionId`` or ``leafUuid``), for sniffing.
_OWN_KINDS = frozenset(
    {"queue-operation", "file-history-snapshot", "summary", "last-prompt", "attachment", "progress", "custom-title",
     "api-request", "api-request-shape", "api-request-blob", "cost-state", "atis-latch", "mode", "tools-used"}
)  # fmt: skip
_CALL = (b'"type":"assistant"', b'"type": "assistant"')
_EVENT = (b'"compact_boundary"', b'"isCompactSummary":true', b'"type":"cost-state"', b'"type":"last-prompt"')
_REQUEST = b'"type":"api-request'
_USER = b'"type":"user"'
_INLINE_SIDECHAIN = b'"isSidechain":true'
#: How much of a line's start tells its kind: the scalar fields Claude Code writes first (``parentUuid``,
#: ``isSidechain``, ``promptId``), then a user line's own ``type`` or an assistant line's ``message.type``.
_HEAD = 512
_TYPE = b'"type":"'
#: First ``type`` values in a line's head that mean the line is read: an assistant line (``message`` comes before
#: its own ``type``, so the head shows ``message.type``), and the event and request lines.
_READ = frozenset({"message", "assistant", "system", "cost-state", "last-prompt", "api-request", "api-request-shape",
                   "api-request-blob"})  # fmt: skip


def _head_kind(raw: bytes) -> tuple[str, bool] | None:
    """(the first ``type`` value in the line's head, whether it is the line's own type), or None when the head
    does not say (then the whole line is searched). An ``attachment`` line (its ``attachment`` object comes before
    its ``type``) is told by that key."""
    head = raw[:_HEAD]
    at = head.find(_TYPE)
    if at < 0:
        return None
    own = head.startswith(b'{"type":"')
    if not own and b'"attachment":{' in head[:at]:
        return "attachment", True
    end = head.find(b'"', at + len(_TYPE))
    return (head[at + len(_TYPE) : end].decode("utf-8", "replace"), own) if end > 0 else None


def sniff_lines(first: list[dict[str, Any]]) -> bool:
    """True when the first JSON lines of a ``.jsonl`` file are a Claude Code transcript's: a line kind only Claude
    Code writes, or a user/assistant line whose ``message`` has Anthropic ``content`` (Qwen Code's have Gemini
    ``parts``), each naming a ``sessionId`` (an old ``summary`` line, its ``leafUuid``)."""
    for obj in first:
        kind = obj.get("type")
        if not isinstance(kind, str) or not ("sessionId" in obj or "leafUuid" in obj):
            continue
        if kind in _OWN_KINDS:
            return True
        message = obj.get("message")
        if kind in ("user", "assistant") and isinstance(message, dict) and "content" in message:
            return "parts" not in message
    return False


def sniff_path(path: Path) -> bool:
    """True for a subagent's ``agent-<id>.meta.json`` (Claude Code's own file: read, it holds no call)."""
    return path.name.startswith("agent-") and path.name.endswith(".meta.json") and path.parent.name == "subagents"


def default_roots(environ: Mapping[str, str]) -> list[Path]:
    """Where Claude Code keeps transcripts: ``$CLAUDE_CONFIG_DIR/projects``, ``~/.claude/projects``, then ccusage's
    ``~/.config/claude/projects`` (see the module docstring)."""
    home = Path(environ.get("HOME") or Path.home())
    roots = [Path(environ["CLAUDE_CONFIG_DIR"]) / "projects"] if environ.get("CLAUDE_CONFIG_DIR") else []
    return [*roots, home / ".claude" / "projects", home / ".config" / "claude" / "projects"]


def read(path: Path, bodies: bool = True) -> LogRead:
    """Every API call of one transcript (:class:`UsageRecord`, file order) and, unless ``bodies`` is False, each
    request body 2.1.332's records let be rebuilt and checked (:class:`Record`; without them the user lines, most
    of the bytes, are not parsed at all). Raises InputError when the file cannot be opened; a bad line is an error
    in the result."""
    out = LogRead()
    if path.name.endswith(".meta.json"):
        out.lines = out.ignored = 1  # a subagent's description (agentType), no call
        return out
    state = _Transcript(path, out, bodies)
    for i, obj in json_lines(path, out, skip=state.skip):
        state.line(i, obj)
    state.finish()
    return out


@dataclass(slots=True)
class _Call:
    """One API call being read (its lines so far)."""

    session: str
    parent: str | None
    kind: CallKind
    index: int
    at: float | None
    version: Any
    ends: tuple[int, int]
    compacted: bool
    project: str | None
    message: dict[str, Any] = field(default_factory=dict)
    blocks: list[Any] = field(default_factory=list)
    ref: str | None = None
    events: tuple[str, ...] = ()


class _Transcript:
    """What one transcript gave so far: its calls, each session's pending events, its request records."""

    def __init__(self, path: Path, out: LogRead, bodies: bool) -> None:
        self.path, self.out, self.bodies = path, out, bodies
        self.compaction_file = path.name.startswith("agent-acompact")
        self.calls: dict[str, _Call] = {}
        self.compacted: set[str] = set()
        self.ends = [0, 0]  # cost-state, last-prompt lines so far: a process ended
        self.roots: dict[str, str] = {}  # inline sidechain line uuid -> its chain's first uuid
        self.agents = False  # a line named its agentId: sidechains need no chain of their own
        self.requests: RequestLog | None = None  # once the file shows it records its requests
        self.held: list[dict[str, Any]] | None = [] if bodies else None  # lines read before the file shows it

    def skip(self, raw: bytes) -> bool:
        """True for a line that cannot matter (see the module docstring), told from its head where it can be. A
        line that is no JSON object at all is never skipped: parsing it makes it an error, counted."""
        if raw.lstrip()[:1] != b"{":
            return False
        told = _head_kind(raw)
        if told is None:
            return self._skip_searching(raw)
        kind, own = told
        if kind in _READ:
            return False
        if kind == "user":
            sidechain = not self.agents and _INLINE_SIDECHAIN in raw[:_HEAD]
            return not (sidechain or self.requests is not None or self.held is not None)
        return own or kind == "attachment" or self._skip_searching(raw)

    def _skip_searching(self, raw: bytes) -> bool:
        if any(m in raw for m in _CALL) or any(m in raw for m in _EVENT) or _REQUEST in raw:
            return False
        if _INLINE_SIDECHAIN in raw and b'"agentId"' not in raw:
            return False
        return _USER not in raw or (self.requests is None and self.held is None)

    def line(self, i: int, obj: dict[str, Any]) -> None:
        kind = obj.get("type")
        self._requests(kind, obj)
        if kind == "assistant":
            self._assistant(i, obj)
            return
        self.out.ignored += 1
        if (kind == "system" and obj.get("subtype") == "compact_boundary") or obj.get("isCompactSummary") is True:
            self.compacted.add(self._who(obj)[0])
        elif kind == "cost-state":
            self.ends[0] += 1
        elif kind == "last-prompt":
            self.ends[1] += 1
        elif obj.get("isSidechain") is True:
            self._who(obj)  # note its place in its sidechain

    def _requests(self, kind: Any, obj: dict[str, Any]) -> None:
        """Pass the line to the request records, once the file shows it has them: an ``api-request`` line, or a
        first call answering one (``requestRef``); a first call without is an older version's file."""
        if not self.bodies:
            return
        if self.requests is None and (kind == "api-request" or (kind == "assistant" and self.held is not None)):
            if kind == "api-request" or "requestRef" in obj:
                self.requests = RequestLog(self.path)
                for held in self.held or []:
                    self.requests.note(held)
            self.held = None
        if self.requests is not None:
            self.requests.note(obj)
        elif self.held is not None:
            self.held.append(obj)

    def _who(self, obj: dict[str, Any]) -> tuple[str, str | None, CallKind]:
        """(session, parent, kind) of a line."""
        sid = obj.get("sessionId")
        sid = sid if isinstance(sid, str) and sid else self.path.stem
        if self.compaction_file:
            return sid, None, "compaction"
        agent = obj.get("agentId")
        if isinstance(agent, str) and agent:
            self.agents = True
            return (*lineage([sid, agent]), "subagent")
        if obj.get("isSidechain") is True:
            uuid, parent = obj.get("uuid"), obj.get("parentUuid")
            root = self.roots.get(parent) if isinstance(parent, str) else None
            root = root or (uuid if isinstance(uuid, str) else "unknown")
            if isinstance(uuid, str):
                self.roots[uuid] = root
            return (*lineage([sid, f"sidechain-{root[:8]}"]), "subagent")
        return sid, None, "main"

    def _assistant(self, i: int, obj: dict[str, Any]) -> None:
        message = obj.get("message")
        if not isinstance(message, dict):
            self.out.errors.append(InputError("assistant line without a message", source=str(self.path), record=i))
            return
        if message.get("model") == "<synthetic>":
            self.out.ignored += 1  # Claude Code's own text: no API call
            return
        mid, rid = message.get("id"), obj.get("requestId")
        if not isinstance(mid, str) or not mid or not isinstance(message.get("usage"), dict):
            self.out.errors.append(
                InputError("assistant line without message id or usage", source=str(self.path), record=i)
            )
            return
        key = f"{mid}/{rid}" if isinstance(rid, str) and rid else mid
        call = self.calls.get(key)
        if call is None:
            session, parent, kind = self._who(obj)
            cwd = obj.get("cwd")
            ends = (self.ends[0], self.ends[1])
            call = _Call(session, parent, kind, i, unix_seconds(obj.get("timestamp")), obj.get("version"), ends,
                         session in self.compacted, cwd if isinstance(cwd, str) else None)  # fmt: skip
            self.compacted.discard(session)
            self.calls[key] = call
        call.message = message
        content = message.get("content")
        call.blocks.extend(content if isinstance(content, list) else [])
        ref = obj.get("requestRef")
        call.ref = ref if isinstance(ref, str) else call.ref

    def finish(self) -> None:
        """Each call's events, its usage record and, where rebuilt, its record with the body."""
        self._events()
        for key, call in self.calls.items():
            usage = normalize_usage(call.message, API)
            if usage is None:
                self.out.errors.append(
                    InputError("assistant line without usage", source=str(self.path), record=call.index)
                )
                continue
            model = call.message.get("model")
            self.out.usage_records.append(
                UsageRecord(call.session, CLIENT, API, usage, model if isinstance(model, str) else "", call.at, key,
                            call.parent, call.project, call.kind, call.events, str(self.path), call.index)
            )  # fmt: skip
            record = self._record(key, call)
            if record is not None:
                self.out.records.append(record)

    def _events(self) -> None:
        """``compacted`` and ``resumed`` on each call (see the module docstring)."""
        marker = 0 if self.ends[0] else 1  # cost-state where the file has it, else last-prompt
        last: dict[str, _Call] = {}
        for call in self.calls.values():
            prev = last.get(call.session)
            resumed = prev is not None and (
                bool(call.version and prev.version and call.version != prev.version)
                or call.ends[marker] != prev.ends[marker]
            )
            call.events = (("compacted",) if call.compacted else ()) + (("resumed",) if resumed else ())
            last[call.session] = call

    def _record(self, key: str, call: _Call) -> Record | None:
        if self.requests is None or call.ref is None:
            return None
        built = self.requests.body(call.ref)
        if built is None:
            return None
        body, meta = built
        request = self.requests.requests[call.ref]
        response = {**call.message, "content": call.blocks}
        meta.update(
            call_id=key, parent=call.parent, kind=call.kind, project=call.project, client=CLIENT, format="claude-code"
        )
        return Record(call.session, API, body, unix_seconds(request.get("timestamp")), call.message.get("usage"),
                      str(self.path), call.index, meta, response)  # fmt: skip


#: The :class:`~agentcache.loaders._formats.LogFormat` fields after its name and client: ``read``, ``sniff_lines``,
#: ``sniff_path``, ``default_roots``, ``suffixes``.
def read_calls(path: Path) -> LogRead:
    """:func:`read` without the exact bodies (``bodies=False``): the calls alone."""
    return read(path, bodies=False)


HOOKS = (read, sniff_lines, sniff_path, default_roots, (".jsonl", ".json"))
