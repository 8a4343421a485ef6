"""Qwen Code sessions: ``~/.qwen/projects/<cwd with / as ->/chats/<session>.jsonl``, subagents' transcripts in
``projects/<project>/subagents/<session>/agent-<type>-<tool call id>.jsonl`` (the runtime directory is
``$QWEN_RUNTIME_DIR``, else ``$QWEN_HOME``, else ``~/.qwen``: the settings schema's ``runtimeOutputDir`` text).

Format facts, observed running Qwen Code 0.24.4 against a scripted upstream unless a source is named:

* Each line: ``uuid``, ``parentUuid``, ``sessionId``, ``timestamp``, ``type`` (``user``, ``assistant``,
  ``tool_result``, ``system``), ``cwd``, ``version``; messages in Gemini's shape (``message.parts``).
* Every API call of the session — its own, its subagents', its compression calls — is a ``system`` line of
  ``subtype: "ui_telemetry"`` whose ``systemPayload.uiEvent`` is a ``qwen-code.api_response``: ``response_id``,
  ``model``, ``auth_type``, ``prompt_id``, ``input_token_count`` (the whole prompt), ``cached_content_token_count``
  (read from the cache), ``output_token_count``; a subagent's call adds ``subagent_id``/``subagent_name`` and its
  ``prompt_id`` is ``<session>#<subagent id>#<round - 1>``; a compression call's is ``compress-<unix ms>``.
* The main agent's ``assistant`` lines repeat their call's figures as ``usageMetadata`` (``promptTokenCount``,
  ``cachedContentTokenCount``, ``candidatesTokenCount``), as do a subagent transcript's (``isSidechain``,
  ``agentId``, ``agentRound``): read only where no ``api_response`` precedes them, keyed so both copies of a
  subagent call share one call id.
* ``auth_type`` names the API: ``openai`` (Chat Completions), ``openai-responses``, ``anthropic`` (Messages).
  With Anthropic, the prompt count is ``input + cache_read + cache_creation`` and the write is not kept
  (``buildAnthropicUsageMetadata``, ``packages/core/src/core/anthropicContentGenerator/converter.ts`` of the
  0.24.4 bundle): the tokens not read are counted as uncached.
* Compression (``/compress``, or automatic): its calls, then a ``system`` line ``subtype: "chat_compression"``;
  the session's next call gets ``compacted``.
* ``--continue`` appends to the session's file and records no process boundary: no ``resumed`` event.
* ``~/.qwen/usage/token-usage-<month>.jsonl`` and ``~/.qwen/usage_record.jsonl`` repeat the chats' figures per
  call and per session, without response ids: recognised (so a search of ``~/.qwen`` reports no errors), not
  counted.
"""

from __future__ import annotations

import json
import os
from collections.abc import Mapping
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

from agentcache.loaders._agentlog import LogRead, read_each
from agentcache.loaders._logfields import get_dict, get_str, lineage, tokens, unix_seconds, usage_of
from agentcache.loaders._record import CallKind, UsageRecord

__all__ = ["default_roots", "read_qwen", "sniff_lines"]

CLIENT = "qwen-code"
API_RESPONSE = "qwen-code.api_response"
#: ``auth_type`` -> the wire API whose usage it reports (Qwen OAuth and Gemini report a whole-prompt count with
#: the cached part inside, as Chat Completions does).
_APIS = {"openai-responses": "openai.responses", "anthropic": "anthropic.messages"}


def default_roots(environ: Mapping[str, str]) -> list[Path]:
    """``projects`` under ``$QWEN_RUNTIME_DIR``, ``$QWEN_HOME``, then ``~/.qwen``."""
    home = environ.get("HOME") or os.path.expanduser("~")
    dirs = [environ.get("QWEN_RUNTIME_DIR"), environ.get("QWEN_HOME"), str(Path(home) / ".qwen")]
    return [Path(d) / "projects" for d in dirs if d]


def sniff_lines(first: list[dict[str, Any]]) -> bool:
    """Qwen Code's lines: ``sessionId`` and ``uuid``, with a Gemini-shaped message (``parts``), a ``usageMetadata``
    or a ``ui_telemetry`` event (Claude Code's transcripts share the envelope, not these); or its usage ledgers'
    (``sessionId`` with ``inputTokens`` or ``models``, no ``uuid``)."""
    for obj in first:
        if "sessionId" in obj and "uuid" not in obj and ("inputTokens" in obj or "models" in obj):
            return True
        if "sessionId" not in obj or "uuid" not in obj:
            continue
        message = obj.get("message")
        if isinstance(message, dict) and "parts" in message:
            return True
        if "usageMetadata" in obj or obj.get("subtype") == "ui_telemetry":
            return True
    return False


def read_qwen(path: Path) -> LogRead:
    """Every API call of one chat or subagent transcript, in file order. Raises :class:`InputError` when the file
    cannot be opened."""
    read = LogRead()
    return read_each(path, _Chat(path, read).line, read)


def api_of(auth_type: str | None) -> str:
    """The wire API of a Qwen Code ``auth_type`` (Chat Completions when unknown)."""
    return _APIS.get(auth_type or "", "openai.chat")


@dataclass(slots=True)
class _Chat:
    """One file read line by line: the main agent's last telemetry call (its ``assistant`` line repeats it) and the
    sessions whose next call follows a compression."""

    path: Path
    read: LogRead
    pending: tuple[int, int, int] | None = None
    compressed: set[str] = field(default_factory=set)
    flags: dict[str, Any] | None = None  # a subagent transcript's CLI flags, from its .meta.json

    def line(self, i: int, obj: dict[str, Any]) -> None:
        kind = obj.get("type")
        if kind == "system" and obj.get("subtype") == "ui_telemetry":
            event = get_dict(get_dict(obj, "systemPayload"), "uiEvent")
            if event.get("event.name") == API_RESPONSE:
                self.telemetry(i, obj, event)
        elif kind == "system" and obj.get("subtype") == "chat_compression":
            self.compressed.add(_session(obj))
        elif kind == "assistant" and isinstance(obj.get("usageMetadata"), dict):
            self.assistant(i, obj, obj["usageMetadata"])

    def telemetry(self, i: int, obj: dict[str, Any], event: dict[str, Any]) -> None:
        sid = _session(obj)
        prompt, read = tokens(event.get("input_token_count")), tokens(event.get("cached_content_token_count"))
        output = tokens(event.get("output_token_count"))
        agent, prompt_id = get_str(event, "subagent_id"), get_str(event, "prompt_id") or ""
        rid = get_str(event, "response_id")
        kind: CallKind
        if agent:
            call_id, chain, kind = f"{CLIENT}:{prompt_id}", [sid, agent], "subagent"
        else:
            self.pending = (prompt, read, output)
            call_id = f"{CLIENT}:{rid or obj.get('uuid')}"
            chain, kind = [sid], "compaction" if prompt_id.startswith("compress-") else "main"
        model = get_str(event, "model") or get_str(obj, "model") or ""
        self.add(i, obj, (prompt, read, output), api_of(get_str(event, "auth_type")), model, call_id, chain, kind)

    def assistant(self, i: int, obj: dict[str, Any], meta: dict[str, Any]) -> None:
        prompt, read = tokens(meta.get("promptTokenCount")), tokens(meta.get("cachedContentTokenCount"))
        counts = (prompt, read, tokens(meta.get("candidatesTokenCount")))
        sid, agent = _session(obj), get_str(obj, "agentId")
        kind: CallKind
        if agent is None:
            if counts == self.pending:
                self.pending = None
                return  # the main agent's copy of the call its telemetry line counted
            call_id, chain, kind = f"{CLIENT}:{obj.get('uuid')}", [sid], "main"
        else:
            round_ = obj.get("agentRound")
            key = f"{sid}#{agent}#{round_ - 1}" if isinstance(round_, int) else obj.get("uuid")
            call_id, chain, kind = f"{CLIENT}:{key}", [sid, agent], "subagent"
        flags = self.subagent_flags() if agent else {}
        model = get_str(obj, "model") or get_str(flags, "model") or ""
        self.add(i, obj, counts, api_of(get_str(flags, "authType")), model, call_id, chain, kind)

    def add(
        self,
        i: int,
        obj: dict[str, Any],
        counts: tuple[int, int, int],
        api: str,
        model: str,
        call_id: str,
        chain: list[str],
        kind: CallKind,
    ) -> None:
        prompt, read, output = counts
        session, parent = lineage(chain)
        events: tuple[str, ...] = ()
        if kind == "main" and session in self.compressed:
            self.compressed.discard(session)
            events = ("compacted",)
        self.read.usage_records.append(
            UsageRecord(
                session=session,
                client=CLIENT,
                api=api,
                usage=usage_of(api, prompt, read, 0, output),
                model=model,
                at=unix_seconds(obj.get("timestamp")),
                call_id=call_id,
                parent=parent,
                project=get_str(obj, "cwd"),
                kind=kind,
                events=events,
                source=str(self.path),
                index=i,
                write_unknown=api == _APIS["anthropic"],  # Anthropic's write is not kept (module docstring)
            )
        )

    def subagent_flags(self) -> dict[str, Any]:
        """The CLI flags (``authType``, ``model``) a subagent transcript's calls used: its ``.meta.json``'s
        ``persistedCliFlags`` (the transcript's lines name neither)."""
        if self.flags is None:
            self.flags = {}
            try:
                meta = json.loads(self.path.with_name(f"{self.path.stem}.meta.json").read_bytes())
            except (OSError, ValueError):
                return self.flags
            self.flags = get_dict(meta, "persistedCliFlags") if isinstance(meta, dict) else {}
        return self.flags


def _session(obj: dict[str, Any]) -> str:
    sid = get_str(obj, "sessionId")
    if sid is None:
        raise ValueError("line without sessionId")
    return sid
