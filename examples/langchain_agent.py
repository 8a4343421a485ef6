"""A LangChain agent (``create_agent``) whose chat model's SDK client is wrapped by agentcache, on llama.cpp.

    python examples/langchain_agent.py                         # ChatOpenAI; starts llama-server with SmolLM2
    python examples/langchain_agent.py --chat anthropic        # ChatAnthropic (llama-server speaks /v1/messages)
    python examples/langchain_agent.py --via direct            # the same run without agentcache
    python examples/langchain_agent.py --via proxy             # through an `agentcache proxy` subprocess
    python examples/langchain_agent.py --base-url http://127.0.0.1:8080

LangChain builds its own SDK client inside the chat model and calls ``....with_raw_response.create``, which
``agentcache.wrap`` intercepts. Hand the model a wrapped client:

* ``ChatOpenAI(..., root_client=w, client=w.chat.completions)`` with ``w = agentcache.wrap(openai.OpenAI(...))``
  (and ``root_async_client`` / ``async_client`` the same way for ``ainvoke``);
* ``ChatAnthropic`` has no client argument: set ``model._client = agentcache.wrap(model._client)`` (and
  ``model._async_client``) after creating it; both are cached properties, so the wrapped client stays.

The agent is rebuilt for every user turn with the tools of an unordered registry (a new order each time), as
an application that collects its tools from plugins does. llama-server renders tools first
(``tools_first.jinja``), so a new order is a change at the first token: wrapped, agentcache sends the tools in
the order first seen and the server reuses the conversation so far.
"""

from __future__ import annotations

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
    """This turn's registry tools as LangChain tools (JSON-schema arguments)."""
    from langchain_core.tools import StructuredTool

    def tool(spec: dict[str, Any]) -> Any:
        def run(**kwargs: Any) -> str:
            return local_tool(spec["name"], kwargs)

        return StructuredTool.from_function(
            run, name=spec["name"], description=spec["description"], args_schema=spec["schema"]
        )

    return [tool(spec) for spec in registry_specs(turn, seed)]


def chat_model(kind: str, base_url: str, model: str, max_tokens: int, session: agentcache.Session | None) -> Any:
    """A LangChain chat model on ``base_url``; its SDK client wrapped when ``session`` is given."""
    if kind == "anthropic":
        from langchain_anthropic import ChatAnthropic

        llm = ChatAnthropic(model=model, base_url=base_url, api_key="local", max_tokens=max_tokens, temperature=0)
        if session is not None:
            llm._client = agentcache.wrap(llm._client, session=session)  # a cached property: set once, kept
        return llm
    import openai
    from langchain_openai import ChatOpenAI

    opts: dict[str, Any] = {}
    if session is not None:
        wrapped = agentcache.wrap(openai.OpenAI(base_url=base_url + "/v1", api_key="local"), session=session)
        opts = {"root_client": wrapped, "client": wrapped.chat.completions}
    return ChatOpenAI(
        model=model, base_url=base_url + "/v1", api_key="local", max_tokens=max_tokens, temperature=0, **opts
    )


def usage_of(message: Any) -> tuple[int, int]:
    """(prompt tokens, cached tokens) LangChain reports for one model reply (``usage_metadata``)."""
    meta = getattr(message, "usage_metadata", None) or {}
    details = meta.get("input_token_details") or {}
    return int(meta.get("input_tokens") or 0), int(details.get("cache_read") or 0)


def run(kind: str, base_url: str, via: str, model: str, turns: int, max_tokens: int, seed: int) -> dict[str, Any]:
    """The conversation; returns the summary (see ``_common.framework_summary``)."""
    from langchain.agents import create_agent
    from langchain_core.messages import AIMessage

    session = agentcache.Sessions().session("langchain") if via == "wrap" else None
    llm = chat_model(kind, base_url, model, max_tokens, session)
    history: list[Any] = []
    rows: list[tuple[int, int]] = []
    answer = ""
    for turn, question in enumerate(QUESTIONS[:turns]):
        agent = create_agent(llm, tools=make_tools(turn, seed), system_prompt=SYSTEM)
        out = agent.invoke({"messages": [*history, {"role": "user", "content": question}]})
        new = out["messages"][len(history) :]
        history = out["messages"]
        replies = [m for m in new if isinstance(m, AIMessage)]
        rows += [usage_of(m) for m in replies]
        answer = str(replies[-1].content) if replies else ""
    return framework_summary(via, rows, answer, session)


def main(argv: list[str] | None = None) -> int:
    a = framework_args(__doc__, argv, chat=True)
    with ExitStack() as stack:
        base_url = serve_locally(stack, a.base_url, a.via)
        if base_url is None:
            print("llama-server or SmolLM2 not found: run scripts/build-llama-server --with-model", file=sys.stderr)
            return 2
        result = run(a.chat, base_url, a.via, a.model, a.turns, a.max_tokens, a.seed)
    print_framework_summary(result, a.json)
    return 0


if __name__ == "__main__":
    sys.exit(main())
