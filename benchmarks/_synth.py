"""A long synthetic agent session built from real tau-bench messages (for ``audit_bench.py``).

tau-bench runs are short (median 14 messages per request, at most 60), so one long session is stitched
from real exchanges of all 200 runs in ``data/tau-bench/gpt-4o-airline.json``:

* message 0: the airline policy (the real system message, identical in every run);
* message 1: the first user message of run 0;
* then 99 *exchanges*, each a real assistant message plus the real message that answered it in its run:
  an assistant tool call + its ``tool`` result, or an assistant text reply + the next ``user`` message.
  Every fifth exchange is a text/user exchange; the others are tool exchanges.

That is 200 messages and 100 requests (one per assistant turn, with 2, 4, ..., 200 messages).
tau-bench has only 37 tool results above 500 tokens, so ~100K tokens cannot be reached with 99 distinct
exchanges (the 99 largest tool exchanges total ~85K). So the tool exchanges are the largest distinct ones,
plus as few *second uses* of the largest ones as reach the token target; a second use gets a fresh
``tool_call_id`` (suffix ``-2``), as an agent that looks up the same reservation twice would produce, so
its blocks are new bytes. The dialogue exchanges are the largest text/user ones. Messages are otherwise
byte-for-byte the recorded ones (tau-bench itself reuses ``tool_call_id`` values across runs: 134 distinct
ids for 1,164 tool results; they are kept). The exchanges are shuffled with a fixed seed, so the session
is deterministic and large tool results are spread over it rather than bunched.
"""

from __future__ import annotations

import copy
import json
import random
from dataclasses import dataclass
from pathlib import Path
from typing import Any

from agentcache import CanonicalRequest
from agentcache.adapters import canonicalize
from agentcache.model._rules import default_model
from agentcache.model._tokens import TokenCounter

ROOT = Path(__file__).resolve().parents[1]
TAU_DIR = ROOT / "data" / "tau-bench"
TAU_FILE = TAU_DIR / "gpt-4o-airline.json"
TOOLS_FILE = TAU_DIR / "airline_tools.json"
OPENAI_MODEL = "gpt-4o"
DIALOGUE_EVERY = 5

Message = dict[str, Any]


@dataclass(frozen=True, slots=True)
class Exchange:
    """A real assistant message and the message that followed it in run ``run`` at ``traj[index]``."""

    assistant: Message
    reply: Message
    tokens: int
    run: int
    index: int
    use: int = 1


@dataclass(frozen=True, slots=True)
class Session:
    """The stitched conversation in OpenAI chat form (system message first) and its tools."""

    messages: list[Message]
    tools: list[dict[str, Any]]
    tool_exchanges: int
    dialogue_exchanges: int
    reused: int


def _load() -> tuple[list[dict[str, Any]], list[dict[str, Any]]]:
    with TAU_FILE.open(encoding="utf-8") as f:
        runs: list[dict[str, Any]] = json.load(f)
    with TOOLS_FILE.open(encoding="utf-8") as f:
        tools: list[dict[str, Any]] = json.load(f)
    return runs, tools


def _message_tokens(counter: TokenCounter, msgs: list[Message]) -> int:
    req: CanonicalRequest = canonicalize("openai.chat", {"model": OPENAI_MODEL, "messages": msgs}, counter)
    return req.tokens


def _exchanges(runs: list[dict[str, Any]], counter: TokenCounter) -> tuple[list[Exchange], list[Exchange]]:
    tool: list[Exchange] = []
    dialogue: list[Exchange] = []
    for r, run in enumerate(runs):
        traj: list[Message] = run["traj"]
        for i in range(1, len(traj) - 1):
            a, nxt = traj[i], traj[i + 1]
            if a["role"] != "assistant":
                continue
            calls = a.get("tool_calls") or []
            if calls and nxt["role"] == "tool" and nxt.get("tool_call_id") == calls[0].get("id") and len(calls) == 1:
                tool.append(Exchange(a, nxt, _message_tokens(counter, [a, nxt]), r, i))
            elif not calls and nxt["role"] == "user":
                dialogue.append(Exchange(a, nxt, _message_tokens(counter, [a, nxt]), r, i))
    return tool, dialogue


def _second_use(ex: Exchange) -> Exchange:
    a = copy.deepcopy(ex.assistant)
    reply = copy.deepcopy(ex.reply)
    new_id = f"{a['tool_calls'][0]['id']}-2"
    a["tool_calls"][0]["id"] = new_id
    reply["tool_call_id"] = new_id
    return Exchange(a, reply, ex.tokens, ex.run, ex.index, 2)


def _pick_tools(pool: list[Exchange], n: int, budget: int) -> list[Exchange]:
    """``n`` tool exchanges totalling about ``budget`` tokens with as few second uses as possible:
    the largest distinct exchanges, plus second uses of the largest ones while the total is short;
    then the smallest first use is swapped for the unused exchange that lands closest to ``budget``."""
    ranked = sorted(pool, key=lambda e: (-e.tokens, e.run, e.index))
    r = 0
    while r < n and sum(e.tokens for e in ranked[: n - r]) + sum(e.tokens for e in ranked[:r]) < budget:
        r += 1
    firsts, seconds = ranked[: n - r], [_second_use(e) for e in ranked[:r]]
    total = sum(e.tokens for e in firsts) + sum(e.tokens for e in seconds)
    spare = ranked[n - r :]
    if firsts and spare:
        drop = firsts[-1]
        swap = min(spare, key=lambda e: (abs(total - drop.tokens + e.tokens - budget), e.run, e.index))
        if abs(total - drop.tokens + swap.tokens - budget) < abs(total - budget):
            firsts[-1] = swap
    return firsts + seconds


def build_session(n_messages: int = 200, target_tokens: int = 100_000) -> Session:
    """The stitched session: ``n_messages`` messages (even, system included), ~``target_tokens`` prompt
    tokens in its last request (OpenAI chat form, tiktoken o200k_base as agentcache counts them)."""
    if n_messages < 4 or n_messages % 2:
        raise ValueError("n_messages must be even and >= 4")
    counter = TokenCounter()
    runs, tools = _load()
    system, first_user = runs[0]["traj"][0], runs[0]["traj"][1]
    n_ex = (n_messages - 2) // 2
    n_dialogue = n_ex // DIALOGUE_EVERY
    n_tool = n_ex - n_dialogue
    tool_pool, dialogue_pool = _exchanges(runs, counter)
    dialogue = sorted(dialogue_pool, key=lambda e: (-e.tokens, e.run, e.index))[:n_dialogue]
    static = canonicalize(
        "openai.chat", {"model": OPENAI_MODEL, "messages": [system, first_user], "tools": tools}, counter
    ).tokens
    budget = target_tokens - static - sum(e.tokens for e in dialogue)
    chosen = _pick_tools(tool_pool, n_tool, budget)
    # Spread large and small exchanges over the session (fixed seed: the session is deterministic).
    chosen.sort(key=lambda e: (e.run, e.index, e.use))
    random.Random(0).shuffle(chosen)
    dialogue.sort(key=lambda e: (e.run, e.index))
    messages: list[Message] = [system, first_user]
    tools_iter, dialogue_iter = iter(chosen), iter(dialogue)
    for k in range(n_ex):
        ex = next(dialogue_iter) if k % DIALOGUE_EVERY == DIALOGUE_EVERY - 1 else next(tools_iter)
        messages += [ex.assistant, ex.reply]
    reused = sum(1 for e in chosen if e.use == 2)
    return Session(messages, tools, n_tool, n_dialogue, reused)


def openai_bodies(session: Session) -> list[dict[str, Any]]:
    """One Chat Completions body per assistant turn (tau-bench's request shape): 2, 4, ... messages."""
    return [
        {"model": OPENAI_MODEL, "messages": session.messages[:k], "tools": session.tools, "temperature": 0.0}
        for k in range(2, len(session.messages) + 1, 2)
    ]


def _anthropic_message(m: Message) -> Message:
    if m["role"] == "tool":
        return {
            "role": "user",
            "content": [{"type": "tool_result", "tool_use_id": m["tool_call_id"], "content": m["content"]}],
        }
    if m["role"] == "assistant":
        content: list[dict[str, Any]] = []
        if m.get("content"):
            content.append({"type": "text", "text": m["content"]})
        for call in m.get("tool_calls") or []:
            fn = call["function"]
            args = json.loads(fn["arguments"])
            content.append({"type": "tool_use", "id": call["id"], "name": fn["name"], "input": args})
        return {"role": "assistant", "content": content}
    return {"role": m["role"], "content": m["content"]}


def anthropic_bodies(session: Session) -> list[dict[str, Any]]:
    """The same turns as Anthropic Messages bodies: system as one text block, tools as
    ``input_schema``, tool calls as ``tool_use`` and results as ``tool_result`` user messages
    (one wire message per chat message, so message ``k`` of both forms is the same turn)."""
    system = {"type": "text", "text": session.messages[0]["content"]}
    tools = [
        {
            "name": t["function"]["name"],
            "description": t["function"]["description"],
            "input_schema": t["function"]["parameters"],
        }
        for t in session.tools
    ]
    msgs = [_anthropic_message(m) for m in session.messages[1:]]
    return [
        {
            "model": default_model("anthropic"),
            "max_tokens": 1024,
            "system": [system],
            "tools": tools,
            "messages": msgs[: k - 1],
        }
        for k in range(2, len(session.messages) + 1, 2)
    ]
