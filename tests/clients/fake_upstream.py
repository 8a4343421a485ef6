"""A scripted fake provider for real agent CLIs: Anthropic Messages, OpenAI Responses and OpenAI Chat Completions,
streaming (SSE) and not, on a real loopback socket (uvicorn on asyncio, whose TCP transports set TCP_NODELAY).

Every request is recorded (method, path, headers, parsed body). What the fake answers is scripted by a directive in
the conversation's newest prompt (the last user message that is not a tool result):

* ``agentcache-script:shell`` — call the client's shell tool once (``echo agentcache-ok``), then answer in text;
* ``agentcache-script:task`` — call the client's subagent tool once with the prompt ``agentcache-script:shell``
  (so the subagent loops too), then answer in text;
* ``agentcache-script:fork`` — the same, asking for a subagent that inherits the conversation (Codex
  ``fork_context``, Qwen Code ``subagent_type: "fork"``; a client without forks gets a plain subagent);
* anything else — answer in text at once.

Answers, tool-call ids and response ids are a function of the prompt and the number of tool results after it, so a
run through the proxy and a direct run get byte-identical answers. Usage is reported in pseudo-tokens (bytes / 4)
with ``cache_read`` the longest prefix of the message list seen before, like a provider's prefix cache; markers and
one-text-block lists are read as :func:`unmarked` reads them, so agentcache's documented edits do not change the
figures a client may print (Claude Code shows a subagent's token count to its parent).

With ``realistic=True`` the fake answers as a provider does for its logs to be audited: usage from
:mod:`tests.clients.fake_cache` (Anthropic breakpoints, 5m/1h TTLs and their write split; OpenAI's automatic
1024-token/128-step cache) on a virtual clock a test advances (``fake.clock.advance(s)``, or ``POST
/_fake/advance {"seconds": s}``), a unique id per response and a ``request-id`` header, and every answer's usage in
``fake.usage_log`` (the truth an audit of the client's own log must reproduce).
"""

from __future__ import annotations

import argparse
import hashlib
import json
import re
import sys
import threading
import uuid
from collections.abc import AsyncIterator, Iterator
from contextlib import contextmanager
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

from starlette.applications import Starlette
from starlette.requests import Request
from starlette.responses import JSONResponse, Response, StreamingResponse
from starlette.routing import Route

if __package__ in (None, ""):
    # Run as a file (``python tests/clients/fake_upstream.py``): make ``tests`` importable from the repository root.
    sys.path.insert(0, str(Path(__file__).resolve().parents[2]))

from tests.clients.fake_cache import AnthropicCache, Clock, OpenAICache

DIRECTIVE = re.compile(r"agentcache-script:(\w+)")
SHELL_COMMAND = "echo agentcache-ok"
AGENT_ID = re.compile(r"[0-9a-f]{8}-[0-9a-f]{4}-[0-9a-f]{4}-[0-9a-f]{4}-[0-9a-f]{12}")
SUBAGENT_PROMPT = "Run this and report the output. agentcache-script:shell"
#: Tool names by role, as the clients name them (Claude Code 2.1: Bash/Agent, older Task; Codex: shell,
#: shell_command, exec_command, spawn_agent; opencode: bash/task; Qwen Code 0.24: run_shell_command/agent).
SHELL_TOOLS = ("Bash", "bash", "shell_command", "exec_command", "shell", "run_shell_command")
SUBAGENT_TOOLS = ("Agent", "Task", "task", "spawn_agent", "agent")


@dataclass
class Recorded:
    """One request the fake received; ``body`` is the parsed JSON (``None`` when not JSON)."""

    method: str
    path: str
    headers: dict[str, str]
    body: Any
    route: str = ""

    def as_dict(self) -> dict[str, Any]:
        return {"method": self.method, "path": self.path, "headers": self.headers, "body": self.body}


@dataclass
class Plan:
    """What to answer: a tool call (``tool`` set) or text."""

    key: str
    tool: str | None = None
    arguments: dict[str, Any] = field(default_factory=dict)
    text: str = ""
    namespace: str | None = None


def _digest(*parts: str) -> str:
    return hashlib.sha256("\x00".join(parts).encode()).hexdigest()[:24]


def _texts(content: Any) -> list[str]:
    """The text of a message content (string, or a list of typed parts)."""
    if isinstance(content, str):
        return [content]
    out: list[str] = []
    if isinstance(content, list):
        for part in content:
            if isinstance(part, dict) and isinstance(part.get("text"), str):
                out.append(part["text"])
            elif isinstance(part, str):
                out.append(part)
    return out


def _prompt_and_results(route: str, body: dict[str, Any]) -> tuple[str, int, str]:
    """(newest prompt text, number of tool results after it, the last tool result's text) of a request body."""
    prompt: list[str] = []
    results = 0
    last = ""
    if route == "messages":
        for msg in body.get("messages") or []:
            content = msg.get("content")
            blocks = content if isinstance(content, list) else []
            tool_results = sum(1 for b in blocks if isinstance(b, dict) and b.get("type") == "tool_result")
            if msg.get("role") == "user" and not tool_results:
                prompt, results = _texts(content), 0
            results += tool_results
            for b in blocks:
                if isinstance(b, dict) and b.get("type") == "tool_result":
                    last = "\n".join(_texts(b.get("content")))
    elif route == "responses":
        items = body.get("input")
        if isinstance(items, str):
            return items, 0, ""
        for item in items or []:
            kind = item.get("type", "message")
            if kind == "message" and item.get("role") == "user":
                prompt, results = _texts(item.get("content")), 0
            elif kind.endswith("_call_output"):
                results += 1
                output = item.get("output")
                last = output if isinstance(output, str) else json.dumps(output)
    else:  # chat
        for msg in body.get("messages") or []:
            if msg.get("role") == "user":
                prompt, results = _texts(msg.get("content")), 0
            elif msg.get("role") == "tool":
                results += 1
                last = "\n".join(_texts(msg.get("content")))
    return "\n".join(prompt), results, last


def _tool_names(body: dict[str, Any]) -> dict[str, str | None]:
    """Tool name -> its namespace (Codex groups its subagent tools in a Responses ``namespace`` tool)."""
    names: dict[str, str | None] = {}

    def walk(tools: Any, namespace: str | None) -> None:
        for tool in tools or []:
            if not isinstance(tool, dict):
                continue
            if tool.get("type") == "namespace":
                walk(tool.get("tools"), tool.get("name"))
                continue
            name = tool.get("name") or (tool.get("function") or {}).get("name")
            if isinstance(name, str):
                names[name] = namespace

    walk(body.get("tools"), None)
    return names


def _shell_arguments(name: str) -> dict[str, Any]:
    if name == "shell":
        return {"command": ["bash", "-lc", SHELL_COMMAND]}
    if name == "exec_command":
        return {"cmd": SHELL_COMMAND}
    if name == "shell_command":
        return {"command": SHELL_COMMAND}
    return {"command": SHELL_COMMAND, "description": "Print a marker"}


def _subagent_arguments(name: str, fork: bool = False) -> dict[str, Any]:
    if name == "spawn_agent":
        return {"message": SUBAGENT_PROMPT, "fork_context": True} if fork else {"message": SUBAGENT_PROMPT}
    if name == "task":
        return {"description": "Run a marker", "prompt": SUBAGENT_PROMPT, "subagent_type": "general"}
    if name == "agent":  # Qwen Code runs subagents in the background unless told otherwise
        kind = "fork" if fork else "general-purpose"
        return {
            "description": "Run a marker",
            "prompt": SUBAGENT_PROMPT,
            "subagent_type": kind,
            "run_in_background": False,
        }
    return {"description": "Run a marker", "prompt": SUBAGENT_PROMPT, "subagent_type": "general-purpose"}


def plan(route: str, body: dict[str, Any]) -> Plan:
    """The scripted answer to one request (see the module docstring)."""
    prompt, results, last = _prompt_and_results(route, body)
    match = DIRECTIVE.search(prompt)
    directive = match.group(1) if match else ""
    key = _digest(route, prompt, str(results))
    tools = _tool_names(body)
    if results == 0 and directive in ("shell", "task", "fork"):
        wanted = SHELL_TOOLS if directive == "shell" else SUBAGENT_TOOLS
        for name in wanted:
            if name in tools:
                args = (
                    _shell_arguments(name) if directive == "shell" else _subagent_arguments(name, directive == "fork")
                )
                return Plan(key, tool=name, arguments=args, namespace=tools[name])
    agent = AGENT_ID.search(last)
    if results == 1 and directive in ("task", "fork") and "wait_agent" in tools and agent:
        # Codex's spawn_agent returns at once: wait for the subagent so its requests happen inside the run.
        args = {"targets": [agent.group(0)], "timeout_ms": 60_000}
        return Plan(key, tool="wait_agent", arguments=args, namespace=tools["wait_agent"])
    word = directive or "none"
    return Plan(key, text=f"agentcache-fake answer: directive {word}, {results} tool result(s).")


def unmarked(value: Any, shapes: bool = True) -> Any:
    """``value`` without ``cache_control`` keys; with ``shapes``, also one-text-block contents as the plain string
    they mean and tools in a canonical order (the ``messages.shape`` and ``tools.*`` repairs' edits)."""
    if isinstance(value, dict):
        out = {k: unmarked(v, shapes) for k, v in value.items() if k != "cache_control"}
        if shapes and isinstance(out.get("tools"), list):  # the repairs keep the session's tool order
            out["tools"] = sorted(out["tools"], key=lambda t: json.dumps(t, sort_keys=True))
        content = out.get("content")
        if (
            shapes
            and isinstance(content, list)
            and len(content) == 1
            and isinstance(content[0], dict)
            and set(content[0]) == {"type", "text"}
            and content[0]["type"] == "text"
        ):
            out["content"] = content[0]["text"]
        return out
    if isinstance(value, list):
        return [unmarked(v, shapes) for v in value]
    return value


class PrefixCache:
    """Pseudo prompt-cache accounting: (read, total) of a unit list, cache markers stripped."""

    def __init__(self) -> None:
        self.seen: set[str] = set()
        self.lock = threading.Lock()

    def account(self, units: list[Any]) -> tuple[int, int]:
        clean = [unmarked(u) for u in units]
        read = total = 0
        with self.lock:
            for i in range(len(clean)):
                k = _digest(json.dumps(clean[: i + 1], sort_keys=True))
                size = max(1, len(json.dumps(clean[i])) // 4)
                if k in self.seen and read == total:
                    read += size
                self.seen.add(k)
                total += size
        return read, total


def _sse(event: str | None, data: dict[str, Any]) -> bytes:
    head = f"event: {event}\n" if event else ""
    return f"{head}data: {json.dumps(data)}\n\n".encode()


class FakeUpstream:
    """The app plus its request log. ``requests`` is appended to in arrival order (thread-safe)."""

    def __init__(self, realistic: bool = False) -> None:
        self.requests: list[Recorded] = []
        self.cache = PrefixCache()
        self.realistic = realistic
        self.clock = Clock()
        self.anthropic = AnthropicCache(self.clock)
        self.openai = OpenAICache(self.clock)
        self.usage_log: list[dict[str, Any]] = []
        self._lock = threading.Lock()
        self.app = Starlette(
            routes=[
                Route("/_fake/advance", self.advance, methods=["POST"]),
                Route("/v1/messages", self.messages, methods=["POST"]),
                Route("/v1/messages/count_tokens", self.count_tokens, methods=["POST"]),
                Route("/v1/responses", self.responses, methods=["POST"]),
                Route("/v1/chat/completions", self.chat, methods=["POST"]),
                Route("/v1/models", self.models, methods=["GET"]),
                Route("/{path:path}", self.other, methods=["GET", "POST", "PUT", "DELETE", "HEAD"]),
            ]
        )

    async def _record(self, request: Request, route: str) -> Recorded:
        raw = await request.body()
        try:
            body = json.loads(raw) if raw else None
        except ValueError:
            body = None
        rec = Recorded(request.method, request.url.path, dict(request.headers), body, route)
        with self._lock:
            self.requests.append(rec)
        return rec

    def model_requests(self) -> list[Recorded]:
        """The generation requests (messages / responses / chat), in order."""
        with self._lock:
            return [r for r in self.requests if r.route in ("messages", "responses", "chat")]

    async def advance(self, request: Request) -> Response:
        """``{"seconds": s}``: move the virtual clock on (cache entries age without waiting)."""
        self.clock.advance(float((await request.json())["seconds"]))
        return JSONResponse({"offset": self.clock.offset})

    def _answered(
        self, route: str, body: dict[str, Any], key: str, usage: dict[str, Any]
    ) -> tuple[str, dict[str, str]]:
        """The response id and extra headers of an answer; in realistic mode unique, and logged with its usage."""
        if not self.realistic:
            return key, {}
        rid, request_id = uuid.uuid4().hex[:24], f"req_{uuid.uuid4().hex[:24]}"
        entry = {"route": route, "id": rid, "request_id": request_id, "model": body.get("model"), "usage": usage}
        with self._lock:
            self.usage_log.append({**entry, "at": self.clock.now()})
        return rid, {"request-id": request_id}

    async def other(self, request: Request) -> Response:
        await self._record(request, "other")
        return JSONResponse({"error": {"type": "not_found_error", "message": "not served by the fake"}}, 404)

    async def models(self, request: Request) -> Response:
        await self._record(request, "models")
        return JSONResponse({"error": {"type": "not_found_error", "message": "no model list"}}, 404)

    async def count_tokens(self, request: Request) -> Response:
        rec = await self._record(request, "count_tokens")
        return JSONResponse({"input_tokens": max(1, len(json.dumps(rec.body)) // 4)})

    # --- Anthropic Messages ---

    async def messages(self, request: Request) -> Response:
        rec = await self._record(request, "messages")
        body: dict[str, Any] = rec.body or {}
        p = plan("messages", body)
        if self.realistic:
            usage = self.anthropic.usage(body)
        else:
            read, total = self.cache.account([body.get("tools"), body.get("system"), *(body.get("messages") or [])])
            usage = {
                "input_tokens": total - read,
                "cache_creation_input_tokens": 0,
                "cache_read_input_tokens": read,
                "output_tokens": 8,
            }
        rid, headers = self._answered("messages", body, p.key, usage)
        model = body.get("model", "fake")
        if p.tool:
            block: dict[str, Any] = {"type": "tool_use", "id": f"toolu_{p.key}", "name": p.tool, "input": p.arguments}
            stop = "tool_use"
        else:
            block = {"type": "text", "text": p.text}
            stop = "end_turn"
        message = {
            "id": f"msg_{rid}",
            "type": "message",
            "role": "assistant",
            "model": model,
            "content": [block],
            "stop_reason": stop,
            "stop_sequence": None,
            "usage": usage,
        }
        if not body.get("stream"):
            return JSONResponse(message, headers=headers)
        stream = self._messages_stream(message, block)
        return StreamingResponse(stream, media_type="text/event-stream", headers=headers)

    async def _messages_stream(self, message: dict[str, Any], block: dict[str, Any]) -> AsyncIterator[bytes]:
        usage = message["usage"]
        start = {**message, "content": [], "stop_reason": None, "usage": {**usage, "output_tokens": 1}}
        yield _sse("message_start", {"type": "message_start", "message": start})
        if block["type"] == "text":
            yield _sse(
                "content_block_start",
                {"type": "content_block_start", "index": 0, "content_block": {"type": "text", "text": ""}},
            )
            for piece in re.findall(r"\S+\s*", block["text"]):
                delta = {"type": "text_delta", "text": piece}
                yield _sse("content_block_delta", {"type": "content_block_delta", "index": 0, "delta": delta})
        else:
            empty = {**block, "input": {}}
            yield _sse("content_block_start", {"type": "content_block_start", "index": 0, "content_block": empty})
            delta = {"type": "input_json_delta", "partial_json": json.dumps(block["input"])}
            yield _sse("content_block_delta", {"type": "content_block_delta", "index": 0, "delta": delta})
        yield _sse("content_block_stop", {"type": "content_block_stop", "index": 0})
        yield _sse(
            "message_delta",
            {
                "type": "message_delta",
                "delta": {"stop_reason": message["stop_reason"], "stop_sequence": None},
                "usage": {"output_tokens": usage["output_tokens"]},
            },
        )
        yield _sse("message_stop", {"type": "message_stop"})

    # --- OpenAI Responses ---

    async def responses(self, request: Request) -> Response:
        rec = await self._record(request, "responses")
        body: dict[str, Any] = rec.body or {}
        p = plan("responses", body)
        items = body.get("input")
        units = [body.get("tools"), body.get("instructions"), *(items if isinstance(items, list) else [items])]
        read, total = self.openai.account(units) if self.realistic else self.cache.account(units)
        if p.tool:
            item: dict[str, Any] = {
                "type": "function_call",
                "id": f"fc_{p.key}",
                "call_id": f"call_{p.key}",
                "name": p.tool,
                "arguments": json.dumps(p.arguments),
                "status": "completed",
            }
            if p.namespace:
                item["namespace"] = p.namespace
        else:
            item = {
                "type": "message",
                "id": f"msg_{p.key}",
                "role": "assistant",
                "status": "completed",
                "content": [{"type": "output_text", "text": p.text, "annotations": []}],
            }
        usage = {
            "input_tokens": total,
            "input_tokens_details": {"cached_tokens": read},
            "output_tokens": 8,
            "output_tokens_details": {"reasoning_tokens": 0},
            "total_tokens": total + 8,
        }
        rid, headers = self._answered("responses", body, p.key, usage)
        response = {
            "id": f"resp_{rid}",
            "object": "response",
            "created_at": 1_700_000_000,
            "status": "completed",
            "model": body.get("model", "fake"),
            "output": [item],
            "usage": usage,
        }
        if not body.get("stream"):
            return JSONResponse(response, headers=headers)
        stream = self._responses_stream(response, item)
        return StreamingResponse(stream, media_type="text/event-stream", headers=headers)

    async def _responses_stream(self, response: dict[str, Any], item: dict[str, Any]) -> AsyncIterator[bytes]:
        seq = iter(range(1_000))
        pending = {**response, "status": "in_progress", "output": [], "usage": None}

        def ev(kind: str, **data: Any) -> bytes:
            return _sse(kind, {"type": kind, "sequence_number": next(seq), **data})

        yield ev("response.created", response=pending)
        yield ev("response.in_progress", response=pending)
        if item["type"] == "message":
            text = item["content"][0]["text"]
            yield ev(
                "response.output_item.added", output_index=0, item={**item, "content": [], "status": "in_progress"}
            )
            part = {"type": "output_text", "text": "", "annotations": []}
            yield ev("response.content_part.added", item_id=item["id"], output_index=0, content_index=0, part=part)
            for piece in re.findall(r"\S+\s*", text):
                yield ev("response.output_text.delta", item_id=item["id"], output_index=0, content_index=0, delta=piece)
            yield ev("response.output_text.done", item_id=item["id"], output_index=0, content_index=0, text=text)
            done_part = {**part, "text": text}
            yield ev("response.content_part.done", item_id=item["id"], output_index=0, content_index=0, part=done_part)
        else:
            added = {**item, "arguments": "", "status": "in_progress"}
            yield ev("response.output_item.added", output_index=0, item=added)
            yield ev(
                "response.function_call_arguments.delta", item_id=item["id"], output_index=0, delta=item["arguments"]
            )
            yield ev(
                "response.function_call_arguments.done", item_id=item["id"], output_index=0, arguments=item["arguments"]
            )
        yield ev("response.output_item.done", output_index=0, item=item)
        yield ev("response.completed", response=response)

    # --- OpenAI Chat Completions ---

    async def chat(self, request: Request) -> Response:
        rec = await self._record(request, "chat")
        body: dict[str, Any] = rec.body or {}
        p = plan("chat", body)
        units = [body.get("tools"), *(body.get("messages") or [])]
        read, total = self.openai.account(units) if self.realistic else self.cache.account(units)
        usage = {
            "prompt_tokens": total,
            "completion_tokens": 8,
            "total_tokens": total + 8,
            "prompt_tokens_details": {"cached_tokens": read},
        }
        if p.tool:
            call = {
                "id": f"call_{p.key}",
                "type": "function",
                "function": {"name": p.tool, "arguments": json.dumps(p.arguments)},
            }
            message: dict[str, Any] = {"role": "assistant", "content": None, "tool_calls": [call]}
            finish = "tool_calls"
        else:
            message = {"role": "assistant", "content": p.text}
            finish = "stop"
        rid, headers = self._answered("chat", body, p.key, usage)
        base = {"id": f"chatcmpl-{rid}", "created": 1_700_000_000, "model": body.get("model", "fake")}
        if not body.get("stream"):
            choice = {"index": 0, "message": message, "finish_reason": finish}
            doc = {**base, "object": "chat.completion", "choices": [choice], "usage": usage}
            return JSONResponse(doc, headers=headers)
        include_usage = bool((body.get("stream_options") or {}).get("include_usage"))
        stream = self._chat_stream(base, message, finish, usage, include_usage)
        return StreamingResponse(stream, media_type="text/event-stream", headers=headers)

    async def _chat_stream(
        self, base: dict[str, Any], message: dict[str, Any], finish: str, usage: dict[str, Any], include_usage: bool
    ) -> AsyncIterator[bytes]:
        def chunk(delta: dict[str, Any], reason: str | None = None) -> bytes:
            choice = {"index": 0, "delta": delta, "finish_reason": reason}
            return _sse(None, {**base, "object": "chat.completion.chunk", "choices": [choice]})

        yield chunk({"role": "assistant", "content": ""})
        if message.get("tool_calls"):
            call = message["tool_calls"][0]
            yield chunk({"tool_calls": [{"index": 0, **call}]})
        else:
            for piece in re.findall(r"\S+\s*", message["content"]):
                yield chunk({"content": piece})
        yield chunk({}, finish)
        if include_usage:
            yield _sse(None, {**base, "object": "chat.completion.chunk", "choices": [], "usage": usage})
        yield b"data: [DONE]\n\n"


@contextmanager
def serve(upstream: FakeUpstream | None = None) -> Iterator[tuple[FakeUpstream, str]]:
    """Run a fake upstream on a free loopback port: yields (fake, base URL without ``/v1``)."""
    from tests.test_proxy_support import ServerThread

    fake = upstream or FakeUpstream()
    with ServerThread(fake.app) as server:
        yield fake, server.url


def main() -> None:
    """Run the fake on a port and append every request as a JSON line to ``--log`` (for capturing traffic)."""
    import uvicorn

    parser = argparse.ArgumentParser(description=__doc__)
    parser.add_argument("--port", type=int, default=8799)
    parser.add_argument("--log", required=True)
    args = parser.parse_args()
    fake = FakeUpstream()
    original = fake._record

    async def record(request: Request, route: str) -> Recorded:
        rec = await original(request, route)
        with open(args.log, "a") as f:
            f.write(json.dumps({"route": route, **rec.as_dict()}) + "\n")
        return rec

    fake._record = record  # type: ignore[method-assign]
    uvicorn.run(fake.app, host="127.0.0.1", port=args.port, log_level="warning")


if __name__ == "__main__":
    main()
