"""An OpenAI Agents SDK agent whose ``AsyncOpenAI`` client is wrapped by agentcache, on llama.cpp.

    python examples/openai_agents_sdk.py                  # starts llama-server with SmolLM2
    python examples/openai_agents_sdk.py --via direct     # the same run without agentcache
    python examples/openai_agents_sdk.py --via proxy      # through an `agentcache proxy` subprocess

The Agents SDK takes the client as an argument, so the recipe is one line:
``OpenAIChatCompletionsModel(model=..., openai_client=agentcache.wrap(AsyncOpenAI(...)))`` (or
``agents.set_default_openai_client(agentcache.wrap(AsyncOpenAI(...)))`` for every agent). Its Chat Completions
model calls ``chat.completions.create``; its Responses model calls ``responses.create`` and, when streaming,
``responses.with_streaming_response.create``: all three are intercepted.

As in ``langchain_agent.py``, the agent gets the tools of an unordered registry in a new order every user turn.
Tracing is turned off (it would upload to OpenAI).
"""

from __future__ import annotations

import asyncio
import json
import sys
from contextlib import ExitStack
from typing import Any

from _common import (
    QUESTIONS,
    SYSTEM,
    framework_args,
    framework_summary,
    local_tool,
    print_framework_summary,
    registry_specs,
    serve_locally,
)

import agentcache


def make_tools(turn: int, seed: int) -> list[Any]:
    """This turn's registry tools as Agents SDK function tools (JSON-schema arguments)."""
    from agents import FunctionTool

    def tool(spec: dict[str, Any]) -> Any:
        async def invoke(ctx: Any, args: str) -> str:
            return local_tool(spec["name"], json.loads(args or "{}"))

        schema = {**spec["schema"], "additionalProperties": False}
        return FunctionTool(
            name=spec["name"],
            description=spec["description"],
            params_json_schema=schema,
            on_invoke_tool=invoke,
            strict_json_schema=False,
        )

    return [tool(spec) for spec in registry_specs(turn, seed)]


async def conversation(base_url: str, via: str, model: str, turns: int, max_tokens: int, seed: int) -> dict[str, Any]:
    """The conversation; returns the summary (see ``_common.framework_summary``)."""
    import openai
    from agents import Agent, ModelSettings, OpenAIChatCompletionsModel, Runner, set_tracing_disabled

    set_tracing_disabled(True)
    client: Any = openai.AsyncOpenAI(base_url=base_url + "/v1", api_key="local")
    session = agentcache.Sessions().session("agents-sdk") if via == "wrap" else None
    if session is not None:
        client = agentcache.wrap(client, session=session)
    llm = OpenAIChatCompletionsModel(model=model, openai_client=client)
    settings = ModelSettings(max_tokens=max_tokens, temperature=0)
    history: list[Any] = []
    rows: list[tuple[int, int]] = []
    answer = ""
    for turn, question in enumerate(QUESTIONS[:turns]):
        agent = Agent(
            name="atlas", instructions=SYSTEM, model=llm, model_settings=settings, tools=make_tools(turn, seed)
        )
        result = await Runner.run(agent, [*history, {"role": "user", "content": question}], max_turns=4)
        for response in result.raw_responses:
            usage = response.usage
            cached = usage.input_tokens_details.cached_tokens if usage.input_tokens_details else 0
            rows.append((usage.input_tokens, cached or 0))
        history = result.to_input_list()
        answer = str(result.final_output)
    return framework_summary(via, rows, answer, session)


def main(argv: list[str] | None = None) -> int:
    a = framework_args(__doc__, argv)
    with ExitStack() as stack:
        base_url = serve_locally(stack, a.base_url, a.via)
        if base_url is None:
            print("llama-server or SmolLM2 not found: run scripts/build-llama-server --with-model", file=sys.stderr)
            return 2
        result = asyncio.run(conversation(base_url, a.via, a.model, a.turns, a.max_tokens, a.seed))
    print_framework_summary(result, a.json)
    return 0


if __name__ == "__main__":
    sys.exit(main())
