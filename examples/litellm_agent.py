"""A tool-calling loop on ``litellm.completion`` whose OpenAI client is wrapped by agentcache, on llama.cpp.

    python examples/litellm_agent.py                  # starts llama-server with SmolLM2
    python examples/litellm_agent.py --via direct     # the same run without agentcache
    python examples/litellm_agent.py --via proxy      # through an `agentcache proxy` subprocess

litellm takes the SDK client per call for its OpenAI-compatible providers:
``litellm.completion(model="openai/<model>", api_base=..., client=agentcache.wrap(openai.OpenAI(...)), ...)``
(``acompletion`` with a wrapped ``AsyncOpenAI``). litellm 1.110 sends those requests with the client's
low-level ``post("/chat/completions", ...)`` and the raw-response header, which ``wrap`` intercepts.
For providers litellm calls with its own HTTP code (``anthropic/...``, ``bedrock/...``...) there is no SDK
client to wrap: point ``api_base`` at ``agentcache proxy`` instead (``--via proxy`` shows it for this server).

The tools come from an unordered registry, in a new order every user turn (see ``langchain_agent.py``).
"""

from __future__ import annotations

import os
import sys
from contextlib import ExitStack
from typing import Any

from _common import (
    QUESTIONS,
    SYSTEM,
    framework_args,
    framework_summary,
    local_tool,
    parse_args,
    print_framework_summary,
    registry_specs,
    serve_locally,
)

import agentcache

os.environ.setdefault("LITELLM_LOCAL_MODEL_COST_MAP", "True")  # litellm's bundled prices: no download at import


def tools_for(turn: int, seed: int) -> list[dict[str, Any]]:
    """This turn's registry tools in OpenAI's function format."""
    return [
        {
            "type": "function",
            "function": {"name": s["name"], "description": s["description"], "parameters": s["schema"]},
        }
        for s in registry_specs(turn, seed)
    ]


def run(base_url: str, via: str, model: str, turns: int, max_tokens: int, seed: int) -> dict[str, Any]:
    """The conversation; returns the summary (see ``_common.framework_summary``)."""
    import litellm
    import openai

    session = agentcache.Sessions().session("litellm") if via == "wrap" else None
    opts: dict[str, Any] = {}
    if session is not None:
        opts["client"] = agentcache.wrap(openai.OpenAI(base_url=base_url + "/v1", api_key="local"), session=session)
    messages: list[dict[str, Any]] = [{"role": "system", "content": SYSTEM}]
    rows: list[tuple[int, int]] = []
    answer = ""
    for turn, question in enumerate(QUESTIONS[:turns]):
        messages.append({"role": "user", "content": question})
        tools = tools_for(turn, seed)
        for _ in range(4):  # model calls and tool runs until the model answers in text
            reply = litellm.completion(
                model=f"openai/{model}",
                api_base=base_url + "/v1",
                api_key="local",
                messages=messages,
                tools=tools,
                max_tokens=max_tokens,
                temperature=0,
                **opts,
            )
            usage = reply.usage
            details = getattr(usage, "prompt_tokens_details", None)
            rows.append((usage.prompt_tokens, (details.cached_tokens if details else 0) or 0))
            message = reply.choices[0].message
            messages.append(message.model_dump(exclude_none=True))
            answer = (message.content or "").strip()
            if not message.tool_calls:
                break
            for call in message.tool_calls:
                output = local_tool(call.function.name, parse_args(call.function.arguments))
                messages.append({"role": "tool", "tool_call_id": call.id, "content": output})
    return framework_summary(via, rows, answer, session)


def main(argv: list[str] | None = None) -> int:
    a = framework_args(__doc__, argv)
    with ExitStack() as stack:
        base_url = serve_locally(stack, a.base_url, a.via)
        if base_url is None:
            print("llama-server or SmolLM2 not found: run scripts/build-llama-server --with-model", file=sys.stderr)
            return 2
        result = run(base_url, a.via, a.model, a.turns, a.max_tokens, a.seed)
    print_framework_summary(result, a.json)
    return 0


if __name__ == "__main__":
    sys.exit(main())
