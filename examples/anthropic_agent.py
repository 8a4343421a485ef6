"""A tool-using agent loop with a research subagent, on the real ``anthropic`` SDK, wrapped by agentcache.

    python examples/anthropic_agent.py "What should I pack for Lisbon and Oslo this week?"
    python examples/anthropic_agent.py --base-url http://127.0.0.1:8080 --model smollm2 --json

``--base-url`` defaults to ``$ANTHROPIC_BASE_URL`` (else Anthropic's API), the key to ``$ANTHROPIC_API_KEY``
(a local server accepts any), ``--model`` to ``$ANTHROPIC_MODEL`` or ``claude-opus-4-8``. Any server that
speaks the Messages API works, e.g. llama.cpp's ``llama-server``.

The two agentcache lines:

    sessions = agentcache.Sessions()
    client = agentcache.wrap(anthropic.Anthropic(), session=sessions.session())

and ``session.fork("researcher")`` where a subagent starts: it shares the parent's lineage and cache scope,
so its first request reads the tools and system prompt the parent already cached. After the task, a
reviewer subagent checks the answer (a fork made by the orchestrator, not by the model).
"""

from __future__ import annotations

import os
import sys
from typing import Any

from _common import (
    SYSTEM,
    Recorder,
    agent_args,
    anthropic_tools,
    parse_args,
    print_summary,
    run_tool,
    sdk_missing,
    summary,
)

import agentcache

try:
    import anthropic
except ImportError:  # agentcache's 'sdk' extra
    sdk_missing("anthropic")

DEFAULT_TASK = "Is it warmer in Lisbon or in Oslo right now, and by how many degrees Fahrenheit?"


def agent_loop(
    client: Any,
    session: agentcache.Session,
    sdk: anthropic.Anthropic,
    task: str,
    model: str,
    max_turns: int,
    max_tokens: int,
    depth: int = 0,
) -> str:
    """Run ``task`` to an answer: call the model, run the tools it asks for, repeat."""
    messages: list[dict[str, Any]] = [{"role": "user", "content": task}]
    text = ""
    for _ in range(max_turns):
        reply = client.messages.create(
            model=model, max_tokens=max_tokens, system=SYSTEM, tools=anthropic_tools(), messages=messages
        )
        messages.append({"role": "assistant", "content": reply.content})  # SDK objects: agentcache dumps them
        text = "".join(b.text for b in reply.content if b.type == "text").strip()
        calls = [b for b in reply.content if b.type == "tool_use"]
        if not calls:
            return text
        results = []
        for call in calls:
            args = parse_args(call.input)
            if call.name == "delegate":
                output = research(session, sdk, str(args.get("task", "")), model, max_turns, max_tokens, depth)
            else:
                output = run_tool(call.name, args)
            results.append({"type": "tool_result", "tool_use_id": call.id, "content": output})
        messages.append({"role": "user", "content": results})
    return text


def research(
    parent: agentcache.Session,
    sdk: anthropic.Anthropic,
    task: str,
    model: str,
    max_turns: int,
    max_tokens: int,
    depth: int,
) -> str:
    """A subagent: same tools and system prompt (so the prefix is shared), its own session and history."""
    if depth >= 1:
        return "Subagents cannot delegate further."
    with parent.fork("researcher") as child:
        client = agentcache.wrap(sdk, session=child)
        return agent_loop(client, child, sdk, task, model, max_turns, max_tokens, depth + 1) or "(no findings)"


def review(
    parent: agentcache.Session, sdk: anthropic.Anthropic, task: str, answer: str, model: str, max_tokens: int
) -> str:
    """The orchestrator's reviewer subagent: one request on the shared prefix."""
    with parent.fork("reviewer") as child:
        client = agentcache.wrap(sdk, session=child)
        prompt = f"Task: {task}\nDraft answer: {answer}\nReply 'OK' or name one concrete problem."
        reply = client.messages.create(
            model=model,
            max_tokens=max_tokens,
            system=SYSTEM,
            tools=anthropic_tools(),
            messages=[{"role": "user", "content": prompt}],
        )
        return "".join(b.text for b in reply.content if b.type == "text").strip()


def main(argv: list[str] | None = None) -> int:
    a = agent_args(__doc__ or "", DEFAULT_TASK, "ANTHROPIC_BASE_URL", "ANTHROPIC_MODEL", "claude-opus-4-8", argv)

    recorder = Recorder()
    sessions = agentcache.Sessions(sinks=[recorder])
    sdk = anthropic.Anthropic(base_url=a.base_url, api_key=os.environ.get("ANTHROPIC_API_KEY", "not-needed-locally"))
    with sessions.session("atlas") as session:
        client = agentcache.wrap(sdk, session=session)
        answer = agent_loop(client, session, sdk, a.task, a.model, a.max_turns, a.max_tokens)
        verdict = review(session, sdk, a.task, answer, a.model, a.max_tokens)
        root = session.session_id
    result = summary(sessions, recorder, root, answer)
    result["review"] = verdict
    print_summary(result, a.json)
    return 0


if __name__ == "__main__":
    sys.exit(main())
