"""Request sequences shaped like the real clients' (Claude Code 2.1.197 and 2.1.332, Codex CLI 0.171, aider 0.86, as
captured against a scripted upstream; the text is tau-bench's, not the clients' prompts): the shapes, headers, ids
and markers are theirs. Used by the marker and identity tests."""

from __future__ import annotations

import copy
from typing import Any

from agentcache.adapters import canonicalize
from agentcache.model._rules import anthropic_rules
from agentcache.simulate._anthropic import markers_valid
from tests.conftest import anthropic_tools, openai_tools, policy

EPH = {"type": "ephemeral"}
CC_SESSION = "0f6c2d1e-7b3a-4c55-9e21-5d8a7c3b9f10"


def cc_system(variant: str = "main") -> list[dict[str, Any]]:
    """Claude Code's three system blocks: an unmarked billing header, then two marked ones."""
    return [
        {"type": "text", "text": "x-anthropic-billing-header: cc_version=2.1.197; cc_entrypoint=sdk-cli"},
        {"type": "text", "text": f"You are a coding agent ({variant}).", "cache_control": dict(EPH)},
        {"type": "text", "text": policy() if variant == "main" else policy()[:3000], "cache_control": dict(EPH)},
    ]


def _newest_marked(messages: list[dict[str, Any]], version: str) -> None:
    """Claude Code's marker on the newest user or assistant block; older prompts go back as plain strings. 2.1.197
    never marks a ``role: "system"`` string (a trailing one stays unmarked); 2.1.332 sends its ``role: "system"``
    message as a marked one-block list while it is the newest message (the first request), a string afterwards."""
    system_too = version == "2.1.332" and messages[-1]["role"] == "system"
    newest = len(messages) - 1 if system_too else max(i for i, m in enumerate(messages) if m["role"] != "system")
    for m in messages[:newest]:
        c = m["content"]
        if isinstance(c, list):
            for b in c:
                b.pop("cache_control", None)
            if m["role"] in ("user", "system") and len(c) == 1 and c[0].get("type") == "text":
                m["content"] = c[0]["text"]
    last = messages[newest]["content"]
    if isinstance(last, str):
        messages[newest]["content"] = last = [{"type": "text", "text": last}]
    last[-1]["cache_control"] = dict(EPH)


def claude_code_run(
    prompts: int = 3, steps: int = 2, variant: str = "main", version: str = "2.1.197"
) -> list[dict[str, Any]]:
    """The main loop of one Claude Code run: per prompt, ``steps`` tool calls then a text answer. Every body
    carries the mid-conversation ``role: "system"`` message Claude Code sends as ``messages[1]`` (2.1.332: with an
    ``output_config`` key, a marked list on the first request; see :func:`_newest_marked`)."""
    tools = anthropic_tools()[:-2] if variant != "main" else anthropic_tools()
    opening = [{"type": "text", "text": "<reminder>context</reminder>"}, {"type": "text", "text": "Book a flight."}]
    system: dict[str, Any] = {"role": "system", "content": "The working directory is /tmp/work."}
    if version == "2.1.332":
        system["output_config"] = {"effort": "medium"}
    messages: list[dict[str, Any]] = [{"role": "user", "content": opening}, system]
    bodies = []
    for p in range(prompts):
        if p:
            messages.append({"role": "user", "content": [{"type": "text", "text": f"Follow-up {p}: and a hotel?"}]})
        for s in range(steps + 1):
            turn = copy.deepcopy(messages)
            _newest_marked(turn, version)
            bodies.append(
                {
                    "model": "claude-opus-4-8",
                    "max_tokens": 64000,
                    "stream": True,
                    "system": cc_system(variant),
                    "tools": tools,
                    "messages": turn,
                    "thinking": {"type": "adaptive"},
                }
            )
            if s < steps:
                tid = f"toolu_{variant}_{p}_{s}"
                use = {"type": "tool_use", "id": tid, "name": tools[0]["name"], "input": {"q": s}}
                messages.append({"role": "assistant", "content": [use]})
                result = {"type": "tool_result", "tool_use_id": tid, "content": f"result {p}.{s}"}
                messages.append({"role": "user", "content": [result]})
            else:
                messages.append({"role": "assistant", "content": [{"type": "text", "text": "Hello there."}]})
    return bodies


def claude_code_title() -> dict[str, Any]:
    """The side request that opens a fresh Claude Code run: no tools, unmarked system, one user message."""
    return {
        "model": "claude-opus-4-8",
        "max_tokens": 512,
        "system": [{"type": "text", "text": "Write a short title."}, {"type": "text", "text": "Be brief."}],
        "messages": [{"role": "user", "content": [{"type": "text", "text": "Book a flight."}]}],
        "thinking": {"type": "disabled"},
    }


def cc_headers(agent: str | None = None) -> dict[str, str]:
    h = {"x-api-key": "sk-ant-test-key-one", "x-claude-code-session-id": CC_SESSION, "x-app": "cli"}
    if agent is not None:
        h["x-claude-code-agent-id"] = agent
    return h


def client_markers(body: dict[str, Any]) -> set[str]:
    """Paths of the block markers in an Anthropic body."""
    return {canonicalize("anthropic.messages", body).blocks[i].path for i, _ in _markers(body)}


def _markers(body: dict[str, Any]) -> list[tuple[int, Any]]:
    return canonicalize("anthropic.messages", body).markers()


def check_sent(client: dict[str, Any], sent: dict[str, Any]) -> None:
    """Every marker the client set is still set; at most 4, none on an empty block, 1h before 5m (the API's
    rules); ``role: "system"`` messages keep their string content."""
    canon = canonicalize("anthropic.messages", sent)
    assert client_markers(client) <= client_markers(sent), (client_markers(client), client_markers(sent))
    assert len(canon.markers()) <= 4
    assert markers_valid(canon, anthropic_rules("claude-opus-4-8"))
    for mine, theirs in zip(client["messages"], sent["messages"], strict=True):
        if mine["role"] == "system":
            assert theirs == mine


def codex_body(cache_key: str, input_items: list[dict[str, Any]], *, sub: bool = False) -> dict[str, Any]:
    """A Codex Responses request: its root thread's ``prompt_cache_key``, developer messages, tools (a subagent
    has one namespace tool fewer)."""
    tools = openai_tools()
    responses_tools = [{"type": "function", **t["function"]} for t in tools]
    return {
        "model": "gpt-5.2-codex",
        "input": [
            {"type": "message", "role": "developer", "content": [{"type": "input_text", "text": policy()}]},
            *input_items,
        ],
        "tools": responses_tools[:-1] if sub else responses_tools,
        "stream": True,
        "store": False,
        "prompt_cache_key": cache_key,
    }


def codex_headers(thread: str, root: str, parent: str | None = None) -> dict[str, str]:
    h = {"authorization": "Bearer sk-test-openai", "session-id": root, "thread-id": thread}
    h["x-client-request-id"] = thread
    if parent is not None:
        h["x-codex-parent-thread-id"] = parent
        h["x-openai-subagent"] = "collab_spawn"
    return h


#: aider's example exchange and the two "files" turns every chat opens with (aider 0.86, ``--no-git``, no files).
AIDER_OPENING = [
    ("user", "Change get_factorial() to use math.factorial"),
    ("assistant", "To make this change we need to modify `mathweb/flask/app.py`."),
    ("user", "Refactor hello() into its own file."),
    ("assistant", "To make this change we need to modify `main.py` and make a new file `hello.py`."),
    ("user", "I switched to a new code base. Please don't consider the above files or try to edit them any longer."),
    ("assistant", "Ok."),
]
AIDER_FILES = [("user", "I am not sharing any files that you can edit yet."), ("assistant", "Ok.")]


def aider_chat(prompt: str, history: tuple[tuple[str, str], ...] = ()) -> dict[str, Any]:
    """One aider request (Chat Completions): its system prompt, the opening exchange, the chat ``history`` (a
    ``--restore-chat-history`` run restores it from markdown: each text with a trailing newline, user texts with two
    spaces, inserted before the files turns), the files turns, the prompt and the trailing reminder system message.
    ``--cache-prompts`` adds no field on OpenAI."""
    pairs = [*AIDER_OPENING, *history, *AIDER_FILES, ("user", prompt)]
    messages = [{"role": "system", "content": policy()}, *({"role": r, "content": t} for r, t in pairs)]
    messages.append({"role": "system", "content": "# *SEARCH/REPLACE block* Rules: use the format."})
    return {"model": "gpt-4.1", "messages": messages, "temperature": 0}


def aider_anthropic(prompt: str, history: tuple[tuple[str, str], ...] = ()) -> dict[str, Any]:
    """The same request in Anthropic mode: the system prompt apart, each message a one-text-block list, the rules
    appended to the prompt (no trailing system message), markers at the end of the examples and the files turns."""
    pairs = [*AIDER_OPENING, *history, *AIDER_FILES, ("user", prompt + "\n\n# *SEARCH/REPLACE block* Rules: ...")]
    messages = [{"role": r, "content": [{"type": "text", "text": t}]} for r, t in pairs]
    for i in (len(AIDER_OPENING) - 1, len(pairs) - 2):
        messages[i]["content"][0]["cache_control"] = {"type": "ephemeral"}
    body = {"model": "claude-sonnet-4-20250514", "messages": messages, "temperature": 0, "max_tokens": 64000}
    return {**body, "system": [{"type": "text", "text": policy()}]}


def aider_restored(prompt: str, answer: str) -> tuple[tuple[str, str], ...]:
    """A chat as ``--restore-chat-history`` gives it back: the whitespace around each text rewritten."""
    return (("user", prompt + "  \n"), ("assistant", "\n" + answer + "\n\n"))
