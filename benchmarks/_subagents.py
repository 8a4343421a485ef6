"""A generated subagent fan-out workload shaped like Claude Code's ``Agent``/``Task`` subagents (see
``/work/notes/client-traffic.md`` and ``tests/clients/``): no third-party prompt text, only its shape.

Each parent run: the main agent takes two turns, then launches ``siblings`` subagents at once (a few ms apart).
Every subagent request has the shape Claude Code sends:

* ``tools``: 22 tools (the subagent's set), none marked;
* ``system``: 3 text blocks, a short attribution header, the agent instructions and the subagent instructions,
  the client's markers on ``system[1]`` and ``system[2]`` (5m);
* ``messages[0]``: user, a list of blocks: the task context the parent hands every subagent (the same for all
  siblings, ~5K tokens: the #82739 shape), then the subagent's own task prompt (a few dozen tokens that differ)
  and a trailing environment block (cwd, date, git status: the #50213 shape); the client's marker on the newest
  block;
* then tool calls and results, 2-10 s apart (one turn waits for its response: ``ttft`` + the answer).

The parent continues after its subagents returned. Everything is deterministic (seeded); the text is generated
from a small word list, and its token counts are what the tokenizer says of it.
"""

from __future__ import annotations

import random
from typing import Any

from agentcache.loaders import Record

MODEL = "claude-opus-4-8"
_WORDS = tuple(
    [
        "agent",
        "file",
        "read",
        "write",
        "search",
        "result",
        "repository",
        "function",
        "class",
        "module",
        "test",
        "error",
        "path",
        "value",
        "return",
        "list",
        "config",
        "option",
        "request",
        "response",
        "session",
        "cache",
        "prefix",
        "token",
        "model",
        "tool",
        "input",
        "output",
        "schema",
        "type",
        "string",
        "number",
        "boolean",
        "array",
        "object",
        "required",
        "description",
        "parameter",
        "command",
        "shell",
        "directory",
        "branch",
        "commit",
        "diff",
        "status",
        "build",
        "check",
        "lint",
        "format",
        "review",
        "plan",
        "step",
        "task",
        "context",
        "summary",
        "report",
        "issue",
        "change",
        "line",
        "range",
    ]
)


def _text(rng: random.Random, words: int) -> str:
    return " ".join(rng.choice(_WORDS) for _ in range(words)) + "."


def _tools(rng: random.Random, n: int = 22) -> list[dict[str, Any]]:
    tools = []
    for i in range(n):
        props = {f"arg_{j}": {"type": "string", "description": _text(rng, 12)} for j in range(3)}
        tools.append(
            {
                "name": f"Tool{i:02d}",
                "description": _text(rng, 60),
                "input_schema": {"type": "object", "properties": props, "required": ["arg_0"]},
            }
        )
    return tools


def _marked(text: str) -> dict[str, Any]:
    return {"type": "text", "text": text, "cache_control": {"type": "ephemeral"}}


def _unmark(message: dict[str, Any]) -> dict[str, Any]:
    content = message["content"]
    if isinstance(content, list):
        content = [{k: v for k, v in b.items() if k != "cache_control"} for b in content]
    return {**message, "content": content}


def _conversation(
    system: list[dict[str, Any]],
    tools: list[dict[str, Any]],
    first: list[dict[str, Any]],
    turns: int,
    rng: random.Random,
) -> list[dict[str, Any]]:
    """The request bodies of one agent loop: ``first`` user blocks, then ``turns`` tool calls and results."""
    bodies = []
    messages: list[dict[str, Any]] = [{"role": "user", "content": [*first[:-1], _marked(first[-1]["text"])]}]
    for t in range(turns + 1):
        bodies.append(
            {
                "model": MODEL,
                "max_tokens": 32000,
                "stream": True,
                "system": system,
                "tools": tools,
                "messages": messages,
            }
        )
        call = {"type": "tool_use", "id": f"toolu_{rng.getrandbits(48):012x}", "name": f"Tool{rng.randrange(22):02d}"}
        call["input"] = {"arg_0": _text(rng, 6)}
        result = {"type": "tool_result", "tool_use_id": call["id"], "content": _text(rng, rng.randint(80, 600))}
        messages = [
            *(_unmark(m) for m in messages),
            {"role": "assistant", "content": [{"type": "text", "text": _text(rng, 20)}, call]},
            {"role": "user", "content": [{**result, "cache_control": {"type": "ephemeral"}}]},
        ]
        del t
    return bodies


def subagents(parents: int = 12, siblings: int = 4, seed: int = 14, ttft: float = 1.0) -> list[Record]:
    """The fan-out workload: ``parents`` runs, each launching ``siblings`` subagents at once (module docstring).
    Session ids: ``run<n>`` for the main agent, ``run<n>/agent-<k>`` for its subagents (``meta["parent"]``)."""
    rng = random.Random(seed)
    header = {"type": "text", "text": "x-anthropic-billing-header: cc_version=2.1; cc_entrypoint=cli;"}
    agent_system = _text(rng, 1800)  # the agent instructions every run shares (~2K tokens)
    sub_system = _text(rng, 700)
    main_tools, sub_tools = _tools(rng, 25), _tools(random.Random(seed), 22)
    out: list[Record] = []
    for n in range(parents):
        t = 120.0 * n
        main = f"run{n}"
        main_sys = [header, _marked(agent_system), _marked(_text(rng, 900))]
        context = _text(rng, 4200)  # what the parent hands its subagents (~5K tokens)
        env = f"<env>cwd: /work/project-{n}\ndate: 2026-12-01\ngit status: clean\n</env>"
        main_bodies = _conversation(main_sys, main_tools, [{"type": "text", "text": context}], 3, rng)
        for i, body in enumerate(main_bodies[:2]):
            out.append(Record(main, "anthropic.messages", body, t + i * 6.0, meta={"parent": None}))
        spawn = t + 14.0
        ends = []
        for k in range(siblings):
            task = f"Subagent task {k}: " + _text(rng, rng.randint(25, 45))
            first = [{"type": "text", "text": context}, {"type": "text", "text": task}, {"type": "text", "text": env}]
            sys = [header, _marked(agent_system), _marked(sub_system)]
            at = spawn + 0.005 * k
            for body in _conversation(sys, sub_tools, first, rng.randint(2, 5), rng):
                out.append(Record(f"{main}/agent-{k}", "anthropic.messages", body, at, meta={"parent": main}))
                at += ttft + rng.uniform(2.0, 10.0)
            ends.append(at)
        resume = max(ends) + 2.0
        for i, body in enumerate(main_bodies[2:]):
            out.append(Record(main, "anthropic.messages", body, resume + i * 6.0, meta={"parent": None}))
    out.sort(key=lambda r: r.at or 0.0)
    return [Record(r.session, r.api, r.body, r.at, None, "subagents", i, r.meta) for i, r in enumerate(out)]
