"""A tool-using agent loop with a research subagent, on the real ``openai`` SDK, wrapped by agentcache.

    python examples/openai_agent.py "What should I pack for Lisbon and Oslo this week?"
    python examples/openai_agent.py --base-url http://127.0.0.1:8080/v1 --model smollm2 --json

``--base-url`` defaults to ``$OPENAI_BASE_URL`` (else OpenAI's API), the key to ``$OPENAI_API_KEY`` (a local
server accepts any), ``--model`` to ``$OPENAI_MODEL`` or ``gpt-4o``. Any Chat Completions server works
(llama.cpp, SGLang, vLLM...).

The two agentcache lines:

    sessions = agentcache.Sessions()
    client = agentcache.wrap(openai.OpenAI(), session=sessions.session())

and ``session.fork("researcher")`` where a subagent starts: on OpenAI it carries the parent's
``prompt_cache_key``, so it is routed to where the shared tools and system prompt are cached. The
reviewer subagent streams its answer (``stream_options.include_usage`` makes the usage chunk arrive).
"""

from __future__ import annotations

import os
import sys
from typing import Any

from _common import (
    SYSTEM,
    Recorder,
    agent_args,
    openai_tools,
    parse_args,
    print_summary,
    run_tool,
    sdk_missing,
    summary,
)

import agentcache

try:
    import openai
except ImportError:  # agentcache's 'sdk' extra
    sdk_missing("openai")

DEFAULT_TASK = "Is it warmer in Lisbon or in Oslo right now, and by how many degrees Fahrenheit?"


def agent_loop(
    client: Any,
    session: agentcache.Session,
    sdk: openai.OpenAI,
    task: str,
    model: str,
    max_turns: int,
    max_tokens: int,
    depth: int = 0,
) -> str:
    """Run ``task`` to an answer: call the model, run the tools it asks for, repeat."""
    messages: list[dict[str, Any]] = [{"role": "system", "content": SYSTEM}, {"role": "user", "content": task}]
    text = ""
    for _ in range(max_turns):
        reply = client.chat.completions.create(
            model=model, max_tokens=max_tokens, messages=messages, tools=openai_tools()
        )
        message = reply.choices[0].message
        messages.append(message.model_dump(exclude_none=True))
        text = (message.content or "").strip()
        if not message.tool_calls:
            return text
        for call in message.tool_calls:
            args = parse_args(call.function.arguments)
            if call.function.name == "delegate":
                output = research(session, sdk, str(args.get("task", "")), model, max_turns, max_tokens, depth)
            else:
                output = run_tool(call.function.name, args)
            messages.append({"role": "tool", "tool_call_id": call.id, "content": output})
    return text


def research(
    parent: agentcache.Session,
    sdk: openai.OpenAI,
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


def review(parent: agentcache.Session, sdk: openai.OpenAI, task: str, answer: str, model: str, max_tokens: int) -> str:
    """The orchestrator's reviewer subagent: one streamed request on the shared prefix."""
    with parent.fork("reviewer") as child:
        client = agentcache.wrap(sdk, session=child)
        prompt = f"Task: {task}\nDraft answer: {answer}\nReply 'OK' or name one concrete problem."
        stream = client.chat.completions.create(
            model=model,
            max_tokens=max_tokens,
            tools=openai_tools(),
            messages=[{"role": "system", "content": SYSTEM}, {"role": "user", "content": prompt}],
            stream=True,
            stream_options={"include_usage": True},
        )
        return "".join(c.choices[0].delta.content or "" for c in stream if c.choices).strip()


def main(argv: list[str] | None = None) -> int:
    a = agent_args(__doc__ or "", DEFAULT_TASK, "OPENAI_BASE_URL", "OPENAI_MODEL", "gpt-4o", argv)

    recorder = Recorder()
    sessions = agentcache.Sessions(sinks=[recorder])
    sdk = openai.OpenAI(base_url=a.base_url, api_key=os.environ.get("OPENAI_API_KEY", "not-needed-locally"))
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
