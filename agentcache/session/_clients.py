"""What agent clients declare about themselves: the one table of session, subagent and parent headers that
real clients send, each row with its source, and :func:`declared_by`, which reads a request's headers
against it (the proxy's identity uses it; any door that sees headers may).

The rows:

* **Claude Code** sends ``X-Claude-Code-Session-Id`` (its session id) on every request, its subagents' and its
  side requests' (title, summary, quota) included; a subagent's requests add ``x-claude-code-agent-id`` and, for
  a subagent of a subagent, ``x-claude-code-parent-agent-id``. So the session id names the lineage: a request
  with an agent id is that subagent's session (``<session>/<agent>``), its parent the parent agent's session or
  the main one; a request without one belongs to the lineage's main conversation when it continues it (or is
  the lineage's first), and is otherwise a side conversation of the lineage, inferred inside it.
  Source: the request headers built by the ``@anthropic-ai/claude-code`` 2.1.197 client (npm), function that
  creates its Anthropic client (``"X-Claude-Code-Session-Id"``, ``"x-claude-code-agent-id"``,
  ``"x-claude-code-parent-agent-id"``).
* **Codex CLI** sends its thread id (``thread-id``; older releases ``session_id`` / ``conversation_id``, all
  the same per-thread id there) and, on a spawned subagent's requests, ``x-codex-parent-thread-id`` (the
  spawning thread) and ``x-openai-subagent`` (``collab_spawn``, ``review``, ``compact``...). Its
  ``prompt_cache_key`` is shared by a thread and its subagents, so it cannot tell them apart: the thread id can.
  A subagent request without a parent thread is inferred inside the declared id's lineage.
  Source: openai/codex ``codex-rs/codex-api/src/requests/headers.rs`` (``build_conversation_headers``,
  ``subagent_header``) and ``codex-rs/core/src/responses_metadata.rs`` (``compatibility_headers``:
  ``x-codex-parent-thread-id``, ``x-openai-subagent``).
* **opencode** sends ``x-opencode-session`` (its session id) to opencode-hosted providers; to OpenAI it sends
  its session id as ``prompt_cache_key`` (taken at that level). Its subagents are sessions of their own.
  Source: sst/opencode ``packages/opencode/src/session/llm.ts`` (the ``headers`` of ``streamText``).

Values are cut to 256 characters; a header with an empty value is absent.
"""

from __future__ import annotations

from collections.abc import Mapping
from dataclasses import dataclass

__all__ = ["CLIENTS", "ClientDeclaration", "Declared", "declared_by"]

_MAX_ID = 256


@dataclass(frozen=True, slots=True)
class ClientDeclaration:
    """One client's identity headers (lower-case names; the first present of each tuple wins).

    ``session``: the session (or thread) id. ``agent``: a subagent's id inside that session (the session id
    then names the lineage). ``parent``: the parent's id (an agent id when ``agent`` is set, else a session id).
    ``subagent``: headers whose presence marks a subagent request. ``lineage``: the session id is shared by the
    client's main conversation and its side requests. ``source``: where the client's behaviour is documented.
    """

    client: str
    session: tuple[str, ...]
    agent: tuple[str, ...] = ()
    parent: tuple[str, ...] = ()
    subagent: tuple[str, ...] = ()
    lineage: bool = False
    source: str = ""


@dataclass(frozen=True, slots=True)
class Declared:
    """What a request declares: ``client`` (a :class:`ClientDeclaration` name), ``session``, ``parent`` (None at
    a root) and ``lineage`` (``session`` names a lineage whose session is to be inferred inside it)."""

    client: str
    session: str
    parent: str | None = None
    lineage: bool = False


CLIENTS: tuple[ClientDeclaration, ...] = (
    ClientDeclaration(
        "claude-code",
        ("x-claude-code-session-id",),
        agent=("x-claude-code-agent-id",),
        parent=("x-claude-code-parent-agent-id",),
        lineage=True,
        source="@anthropic-ai/claude-code 2.1.197 (npm): the headers of its Anthropic client",
    ),
    ClientDeclaration(
        "codex",
        ("thread-id", "thread_id", "conversation_id", "session-id", "session_id"),
        parent=("x-codex-parent-thread-id",),
        subagent=("x-openai-subagent",),
        source="openai/codex codex-rs/codex-api/src/requests/headers.rs, codex-rs/core/src/responses_metadata.rs",
    ),
    ClientDeclaration(
        "opencode",
        ("x-opencode-session",),
        source="sst/opencode packages/opencode/src/session/llm.ts",
    ),
)


def _first(headers: Mapping[str, str], names: tuple[str, ...]) -> str | None:
    for name in names:
        value = (headers.get(name) or "").strip()[:_MAX_ID]
        if value:
            return value
    return None


def declared_by(headers: Mapping[str, str]) -> Declared | None:
    """The identity ``headers`` declare under :data:`CLIENTS` (the first client whose session header is present),
    or None. ``headers``: a case-insensitive mapping (starlette's, httpx's) or one with lower-case keys."""
    for row in CLIENTS:
        session = _first(headers, row.session)
        if session is None:
            continue
        parent = _first(headers, row.parent)
        agent = _first(headers, row.agent)
        if agent is not None:  # a subagent inside a declared lineage
            up = f"{session}/{parent}" if parent is not None else session
            return Declared(row.client, f"{session}/{agent}", up)
        if parent is not None:
            return Declared(row.client, session, parent)
        marked = _first(headers, row.subagent) is not None
        return Declared(row.client, session, None, row.lineage or marked)
    return None
