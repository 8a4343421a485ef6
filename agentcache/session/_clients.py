"""What agent clients declare about themselves: the one table of session, subagent and parent headers that
real clients send, each row with its source, and :func:`declared_by`, which reads a request's headers
against it (the proxy's identity uses it; any door that sees headers may).

The rows (confirmed by traffic captured from each client against a scripted upstream, /work/notes/client-traffic.md
in the project's working notes):

* **Claude Code** sends ``x-claude-code-session-id`` (its session id, kept by ``--continue``) on every request,
  its subagents' and its side requests' (the title request that opens a fresh run) included; a subagent's
  requests add ``x-claude-code-agent-id`` and, for a subagent of a subagent, ``x-claude-code-parent-agent-id``.
  So the session id names the lineage: a request with an agent id is that subagent's session
  (``<session>/<agent>``) whose parent is the parent agent's session or the main one; a request without one is
  inferred inside the lineage (see :class:`~agentcache.Sessions`: its first agent loop is the main session).
  Source: ``@anthropic-ai/claude-code`` 2.1.197 (npm), the headers of the Anthropic client it creates.
* **opencode** sends ``x-session-id`` (also ``x-session-affinity``; ``x-opencode-session`` to opencode-hosted
  providers) on every request, its title request included; a subagent (``task`` tool) is a session of its own
  with ``x-parent-session-id``. To OpenAI its session id is also ``session-id`` and ``prompt_cache_key``.
  Source: ``opencode-ai`` 1.18.33 (npm) traffic; sst/opencode ``packages/opencode/src/session/llm.ts``.
* **Codex CLI** sends ``thread-id`` (this thread; older releases ``session_id`` / ``conversation_id``, the same
  per-thread id there) and ``session-id`` (the root thread); a spawned subagent adds
  ``x-codex-parent-thread-id`` (the spawning thread) and ``x-openai-subagent`` (``collab_spawn``, ``review``,
  ``compact``...). Its ``prompt_cache_key`` and ``session-id`` are the root's on subagent requests too, so only
  the thread id tells a subagent from its parent. A subagent request without a parent thread is inferred inside
  the declared id's lineage. Source: ``@openai/codex`` 0.171.0 (npm) traffic; openai/codex
  ``codex-rs/codex-api/src/requests/headers.rs`` (``build_conversation_headers``, ``subagent_header``) and
  ``codex-rs/core/src/responses_metadata.rs`` (``compatibility_headers``).

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
    ClientDeclaration(  # before Codex: opencode's OpenAI requests carry a ``session-id`` too
        "opencode",
        ("x-session-id", "x-opencode-session"),
        parent=("x-parent-session-id",),
        lineage=True,
        source="opencode-ai 1.18.33 (npm); sst/opencode packages/opencode/src/session/llm.ts",
    ),
    ClientDeclaration(
        "codex",
        ("thread-id", "thread_id", "conversation_id", "session-id", "session_id"),
        parent=("x-codex-parent-thread-id",),
        subagent=("x-openai-subagent",),
        source="@openai/codex 0.171.0 (npm); openai/codex codex-rs/codex-api/src/requests/headers.rs, "
        "codex-rs/core/src/responses_metadata.rs",
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
