"""The units the loaders yield: a recorded request with its body (:class:`Record`), or an API call an agent's own
log knows only by its reported usage (:class:`UsageRecord`)."""

from __future__ import annotations

from dataclasses import dataclass, field
from typing import Any, Literal

from agentcache.model._usage import CacheUsage

Api = Literal["anthropic.messages", "openai.chat", "openai.responses"]
APIS: tuple[str, ...] = ("anthropic.messages", "openai.chat", "openai.responses")

#: What an API call was for, in an agent's own log: its conversation (``main``), a subagent's (``subagent``), a
#: context compaction run (``compaction``: it belongs to the conversation it compacts), or a call outside any
#: conversation (``side``: a title, a quota check).
CallKind = Literal["main", "subagent", "compaction", "side"]

#: Events an agent's log records between two calls of a session, as :attr:`UsageRecord.events` names them:
#: ``compacted`` (a compaction boundary: the history was replaced by a summary), ``resumed`` (a new process took
#: the session over: ``--continue``/``--resume``, or a restart).
EVENTS: tuple[str, ...] = ("compacted", "resumed")


@dataclass(frozen=True, slots=True)
class Record:
    """One recorded request.

    ``session``: session id, unique across all loaded files (loaders prefix it with the file stem).
    ``api``: the wire format of ``body``. ``body``: the request body exactly as sent (dict, key order
    preserved). ``at``: seconds since the first request of the file (a proxy recording's lines, with
    ``meta["recorded_by"]``: unix seconds), or None when not recorded (records are then replayed in file order).
    ``usage``: the provider's recorded usage object for this request, as it appeared on the wire, or None.
    ``response``: the whole recorded response object (its ``id``, ``usage`` and the provider's cache diagnostics,
    when recorded), or None. ``source``/``index``: file path and 0-based record index within it, for error
    messages.
    """

    session: str
    api: str
    body: dict[str, Any]
    at: float | None = None
    usage: dict[str, Any] | None = None
    source: str = ""
    index: int = 0
    meta: dict[str, Any] = field(default_factory=dict)
    response: dict[str, Any] | None = None


@dataclass(frozen=True, slots=True)
class UsageRecord:
    """One API call an agent's own log recorded by its usage alone: no request body (Claude Code transcripts,
    Codex rollouts, opencode and Qwen Code sessions keep the provider's usage, not what was sent).

    ``session``: the conversation the call belongs to (the agent's own session id; a subagent's is
    ``<parent>/<agent id>``), unique across clients. ``client``: the format of the log that held it, which names
    the agent that wrote it (``claude-code``, ``codex``, ``opencode``, ``qwen-code``: the ``LogFormat.name``).
    ``api``: the wire API whose usage semantics ``usage`` was read with (:class:`~agentcache.model._types.Api`
    values; it names the provider whose cache served the call). ``usage``: the reported usage, normalised once by
    the core's one usage parser (:func:`~agentcache.model._usage.normalize_usage`; Anthropic ``input_tokens`` is
    the uncached remainder, OpenAI's the whole prompt, both become ``prompt_tokens = read + write + uncached``).
    ``model``: the model the call used. ``at``: when the call was logged, unix seconds (UTC), None when the log
    has no time. ``call_id``: the key that identifies the call across files (Claude Code ``message.id`` +
    ``requestId``; a resumed session's copy of an old call has the same key, so each call counts once).
    ``parent``: the parent session of a subagent, else None. ``project``: the working directory or project the
    log names, else None. ``kind``: see :data:`CallKind`. ``events``: what the log recorded in the session since
    its previous call (:data:`EVENTS`). The provider's own cache-miss diagnosis, when the log kept it, is in
    ``usage.diagnosis``. ``source``/``index``: file and 0-based line of the record, for messages.
    ``write_unknown``: the log kept no cache-write count for a provider that charges writes (Qwen Code with
    Anthropic models), so the tokens not read are counted as uncached and the call's USD is a lower bound.
    """

    session: str
    client: str
    api: str
    usage: CacheUsage
    model: str
    at: float | None
    call_id: str
    parent: str | None = None
    project: str | None = None
    kind: CallKind = "main"
    events: tuple[str, ...] = ()
    source: str = ""
    index: int = 0
    write_unknown: bool = False
