"""Shared pieces of the proxy tests: a fake upstream (an ``httpx.MockTransport`` handler speaking the Anthropic
Messages, OpenAI Chat and Responses wire formats, streaming and not, with fault injection) and helpers that
drive the proxy app in-process through ``httpx.ASGITransport``.

The fake reports prompt-cache reuse like a provider would: ``cache_read`` is the length (in bytes / 4) of the
longest prefix of the request's ``messages``/``input`` JSON it has seen before, so tests can check that usage
flows through the proxy's tap into metrics and the report.
"""

from __future__ import annotations

import asyncio
import json
import socket
import threading
from collections.abc import AsyncIterator, Awaitable, Callable
from contextlib import asynccontextmanager
from dataclasses import dataclass, field
from typing import Any, Self

import httpx
from starlette.applications import Starlette

from agentcache._config import Settings
from agentcache.proxy import ProxyConfig, ProxyState, create_app

ANTHROPIC_KEY = "sk-ant-test-key-one"
OTHER_KEY = "sk-ant-test-key-two"


@dataclass
class Seen:
    """One request the fake upstream received."""

    method: str
    path: str
    query: str
    headers: httpx.Headers
    body: bytes

    def json(self) -> Any:
        return json.loads(self.body)


@dataclass
class FakeUpstream:
    """A scriptable provider. ``fault(seen) -> httpx.Response | None`` may answer (or raise) instead."""

    requests: list[Seen] = field(default_factory=list)
    prefixes: set[str] = field(default_factory=set)
    fault: Callable[[Seen], Any] | None = None
    gate: asyncio.Event | None = None

    def transport(self) -> httpx.MockTransport:
        return httpx.MockTransport(self.handle)

    async def handle(self, request: httpx.Request) -> httpx.Response:
        body = await request.aread()
        seen = Seen(request.method, request.url.path, request.url.query.decode(), request.headers, body)
        self.requests.append(seen)
        if self.gate is not None:
            await self.gate.wait()
        if self.fault is not None:
            answer = self.fault(seen)
            if answer is not None:
                return answer  # type: ignore[no-any-return]
        if request.method == "POST" and seen.path in ("/v1/messages", "/v1/chat/completions", "/v1/responses"):
            return self._generate(seen)
        if seen.path == "/close_session":
            return httpx.Response(200, json={"success": True})
        return httpx.Response(
            200, json={"echo": seen.path, "method": seen.method, "bytes": len(body)}, headers={"x-upstream": "fake"}
        )

    def _cached(self, units: list[Any]) -> tuple[int, int]:
        """(read, total) pseudo-tokens: the longest seen prefix of ``units`` (cache markers ignored) and the
        whole."""
        units = _unmarked(units)
        keys = [json.dumps(units[: i + 1], sort_keys=True) for i in range(len(units))]
        read = 0
        for k in keys:
            if k in self.prefixes:
                read = len(k) // 4
        self.prefixes.update(keys)
        total = len(keys[-1]) // 4 if keys else 0
        return read, max(total, read)

    def _generate(self, seen: Seen) -> httpx.Response:
        doc = seen.json()
        stream = bool(doc.get("stream"))
        if seen.path == "/v1/messages":
            read, total = self._cached(doc.get("messages") or [])
            usage = {"input_tokens": total - read, "cache_read_input_tokens": read, "cache_creation_input_tokens": 0}
            if not stream:
                return httpx.Response(200, json=anthropic_message(usage), headers={"request-id": "req_1"})
            return sse_response(anthropic_events(usage))
        if seen.path == "/v1/chat/completions":
            read, total = self._cached(doc.get("messages") or [])
            usage = {"prompt_tokens": total, "completion_tokens": 3, "prompt_tokens_details": {"cached_tokens": read}}
            if not stream:
                return httpx.Response(200, json=chat_completion(usage))
            return sse_response(chat_chunks(usage), done=True)
        read, total = self._cached(doc.get("input") if isinstance(doc.get("input"), list) else [doc.get("input")])
        usage = {"input_tokens": total, "output_tokens": 3, "input_tokens_details": {"cached_tokens": read}}
        if not stream:
            return httpx.Response(200, json=responses_object(usage))
        return sse_response(responses_events(usage))


def _unmarked(value: Any) -> Any:
    if isinstance(value, dict):
        return {k: _unmarked(v) for k, v in value.items() if k != "cache_control"}
    if isinstance(value, list):
        return [_unmarked(v) for v in value]
    return value


def anthropic_message(usage: dict[str, Any]) -> dict[str, Any]:
    return {
        "id": "msg_1",
        "type": "message",
        "role": "assistant",
        "model": "claude-opus-4-8",
        "content": [{"type": "text", "text": "Hello there."}],
        "stop_reason": "end_turn",
        "stop_sequence": None,
        "usage": {**usage, "output_tokens": 3},
    }


def anthropic_events(usage: dict[str, Any]) -> list[tuple[str, dict[str, Any]]]:
    msg = anthropic_message(usage)
    start = {**msg, "content": [], "stop_reason": None, "usage": {**usage, "output_tokens": 1}}
    return [
        ("message_start", {"type": "message_start", "message": start}),
        (
            "content_block_start",
            {"type": "content_block_start", "index": 0, "content_block": {"type": "text", "text": ""}},
        ),
        (
            "content_block_delta",
            {"type": "content_block_delta", "index": 0, "delta": {"type": "text_delta", "text": "Hello"}},
        ),
        (
            "content_block_delta",
            {"type": "content_block_delta", "index": 0, "delta": {"type": "text_delta", "text": " there."}},
        ),
        ("content_block_stop", {"type": "content_block_stop", "index": 0}),
        (
            "message_delta",
            {
                "type": "message_delta",
                "delta": {"stop_reason": "end_turn", "stop_sequence": None},
                "usage": {"output_tokens": 3},
            },
        ),
        ("message_stop", {"type": "message_stop"}),
    ]


def chat_completion(usage: dict[str, Any]) -> dict[str, Any]:
    return {
        "id": "chatcmpl-1",
        "object": "chat.completion",
        "created": 1,
        "model": "gpt-4o",
        "choices": [{"index": 0, "message": {"role": "assistant", "content": "Hello there."}, "finish_reason": "stop"}],
        "usage": usage,
    }


def chat_chunks(usage: dict[str, Any]) -> list[tuple[str | None, dict[str, Any]]]:
    base = {"id": "chatcmpl-1", "object": "chat.completion.chunk", "created": 1, "model": "gpt-4o"}
    return [
        (None, {**base, "choices": [{"index": 0, "delta": {"role": "assistant", "content": "Hello"}}], "usage": None}),
        (
            None,
            {
                **base,
                "choices": [{"index": 0, "delta": {"content": " there."}, "finish_reason": "stop"}],
                "usage": None,
            },
        ),
        (None, {**base, "choices": [], "usage": usage}),
    ]


def responses_object(usage: dict[str, Any], status: str = "completed") -> dict[str, Any]:
    return {
        "id": "resp_1",
        "object": "response",
        "created_at": 1,
        "status": status,
        "model": "gpt-4o",
        "output": [
            {
                "type": "message",
                "id": "msg_1",
                "status": "completed",
                "role": "assistant",
                "content": [{"type": "output_text", "text": "Hello there.", "annotations": []}],
            }
        ]
        if status == "completed"
        else [],
        "usage": usage if status == "completed" else None,
        "parallel_tool_calls": True,
        "tool_choice": "auto",
        "tools": [],
    }


def responses_events(usage: dict[str, Any]) -> list[tuple[str | None, dict[str, Any]]]:
    return [
        (
            "response.created",
            {"type": "response.created", "sequence_number": 0, "response": responses_object({}, "in_progress")},
        ),
        (
            "response.completed",
            {"type": "response.completed", "sequence_number": 1, "response": responses_object(usage)},
        ),
    ]


def sse_bytes(events: list[tuple[str | None, dict[str, Any]]], done: bool = False) -> list[bytes]:
    out = []
    for name, data in events:
        head = f"event: {name}\n" if name else ""
        out.append(f"{head}data: {json.dumps(data)}\n\n".encode())
    if done:
        out.append(b"data: [DONE]\n\n")
    return out


def sse_response(events: list[tuple[str | None, dict[str, Any]]], done: bool = False) -> httpx.Response:
    chunks = sse_bytes(events, done)

    async def gen() -> AsyncIterator[bytes]:
        for c in chunks:
            yield c

    return httpx.Response(200, headers={"content-type": "text/event-stream"}, content=gen())


def settings() -> Settings:
    return Settings()


@asynccontextmanager
async def proxy(
    fake: FakeUpstream | None = None, **config: Any
) -> AsyncIterator[tuple[httpx.AsyncClient, ProxyState, FakeUpstream]]:
    """The proxy app in-process (started), a client bound to it, and the fake upstream."""
    fake = fake or FakeUpstream()
    app: Starlette = create_app(ProxyConfig(**config), settings=settings(), transport=fake.transport())
    state: ProxyState = app.state.proxy
    async with state.running():
        transport = httpx.ASGITransport(app=app)
        async with httpx.AsyncClient(transport=transport, base_url="http://proxy") as client:
            yield client, state, fake


def anthropic_body(messages: list[dict[str, Any]], **extra: Any) -> dict[str, Any]:
    from tests.conftest import anthropic_tools, policy

    return {
        "model": "claude-opus-4-8",
        "max_tokens": 64,
        "system": policy(),
        "tools": anthropic_tools(),
        "messages": messages,
        **extra,
    }


def chat_body(messages: list[dict[str, Any]], **extra: Any) -> dict[str, Any]:
    from tests.conftest import openai_tools, policy

    return {
        "model": "gpt-4o",
        "messages": [{"role": "system", "content": policy()}, *messages],
        "tools": openai_tools(),
        **extra,
    }


def conversation(n: int, run: int = 0) -> list[dict[str, Any]]:
    """``n`` alternating Anthropic user/assistant messages of real tau-bench text."""
    from tests.conftest import anthropic_messages

    return anthropic_messages(n, run)


def test_fake_upstream_reports_growing_cache_reads() -> None:
    fake = FakeUpstream()
    first = fake._cached([{"a": 1}])
    second = fake._cached([{"a": 1}, {"b": 2}])
    assert first[0] == 0 and second[0] > 0 and second[1] > second[0]


class ServerThread:
    """An ASGI app served by uvicorn on a free loopback port, in a background thread; with ``proxy``, served as
    ``agentcache proxy`` serves it (:func:`agentcache.proxy._server.uvicorn_config`: its timeouts, no server or
    date header of the server's own). ``options``: more ``uvicorn.Config`` options."""

    def __init__(self, app: Any, proxy: ProxyConfig | None = None, **options: Any) -> None:
        import socket
        import threading

        import uvicorn

        from agentcache.proxy._server import uvicorn_config

        with socket.socket() as s:
            s.bind(("127.0.0.1", 0))
            self.port: int = s.getsockname()[1]
        if proxy is not None:
            config = uvicorn_config(app, proxy, port=self.port, log_level="warning", lifespan="on", **options)
        else:
            config = uvicorn.Config(
                app, host="127.0.0.1", port=self.port, log_level="warning", lifespan="on", **options
            )
        self.server = uvicorn.Server(config)
        self.thread = threading.Thread(target=self.server.run, daemon=True)

    @property
    def url(self) -> str:
        return f"http://127.0.0.1:{self.port}"

    def __enter__(self) -> ServerThread:
        import time

        self.thread.start()
        deadline = time.monotonic() + 20
        while not self.server.started:
            if time.monotonic() > deadline or not self.thread.is_alive():
                raise RuntimeError("uvicorn did not start")
            time.sleep(0.01)
        return self

    def __exit__(self, *exc: object) -> None:
        self.server.should_exit = True
        self.thread.join(timeout=20)


def eventually(check: Callable[[], bool], timeout: float = 10.0) -> None:
    """Wait until ``check()`` holds: the proxy records a request after its last byte reached the client."""
    import time

    deadline = time.monotonic() + timeout
    while not check():
        if time.monotonic() > deadline:
            raise AssertionError("condition not reached in time")
        time.sleep(0.01)


def test_usage_tap_reads_llama_timings_and_every_terminal_event() -> None:
    """llama.cpp puts ``timings`` on the final Chat chunk, with no ``usage`` unless ``include_usage`` was set:
    they alone give the usage. Responses streams also end on ``response.incomplete`` / ``response.failed``."""
    import zlib

    from agentcache.proxy._forward import UsageTap

    base = {"id": "chatcmpl-1", "object": "chat.completion.chunk", "created": 1, "model": "smollm2"}
    timings = {"cache_n": 1120, "prompt_n": 198, "predicted_n": 4, "prompt_ms": 40.1}
    chunks: list[tuple[str | None, dict[str, Any]]] = [
        (None, {**base, "choices": [{"index": 0, "delta": {"content": "Hello"}}]}),
        (None, {**base, "choices": [{"index": 0, "delta": {}, "finish_reason": "stop"}], "timings": timings}),
    ]
    raw = b"".join(sse_bytes(chunks, done=True))
    tap = UsageTap("openai.chat", "text/event-stream")
    for i in range(0, len(raw), 5):
        tap.feed(raw[i : i + 5])
    got = tap.result()
    assert tap.ended and got is not None
    assert (got.source, got.prompt_tokens, got.cache_read_tokens, got.output_tokens) == ("llama.cpp", 1318, 1120, 4)

    body = {**chat_completion({"prompt_tokens": 1318, "completion_tokens": 4}), "timings": timings}
    tap = UsageTap("openai.chat", "application/json", "deflate")
    tap.feed(zlib.compress(json.dumps(body).encode()))
    assert (got := tap.result()) is not None and (got.source, got.cache_read_tokens) == ("llama.cpp", 1120)
    assert not tap.ended  # a whole body has no terminal event

    usage = {"input_tokens": 50, "input_tokens_details": {"cached_tokens": 40}, "output_tokens": 1}
    for kind in ("response.incomplete", "response.failed"):
        tap = UsageTap("openai.responses", "text/event-stream")
        done = {"type": kind, "sequence_number": 1, "response": {**responses_object(usage), "status": "incomplete"}}
        tap.feed(b"".join(sse_bytes([(kind, done)])))
        assert tap.ended and (got := tap.result()) is not None and got.cache_read_tokens == 40


def test_usage_tap_parses_only_lines_that_can_carry_usage(monkeypatch: Any) -> None:
    """The proxy path stays cheap: a ``data:`` line is JSON-parsed only when it mentions ``usage`` or
    ``timings``; terminal events are spotted by substring."""
    from types import SimpleNamespace

    from agentcache.model import _bodytap
    from agentcache.proxy._forward import UsageTap

    parsed: list[Any] = []

    def loads(data: bytes) -> Any:
        parsed.append(obj := json.loads(data))
        return obj

    monkeypatch.setattr(_bodytap, "json", SimpleNamespace(loads=loads))
    tap = UsageTap("anthropic.messages", "text/event-stream")
    tap.feed(b"".join(sse_bytes(anthropic_events({"input_tokens": 5, "cache_read_input_tokens": 20}))))
    assert [p["type"] for p in parsed] == ["message_start", "message_delta"]
    assert tap.ended and (got := tap.result()) is not None and (got.cache_read_tokens, got.output_tokens) == (20, 3)


#: A raw upstream's connection handler.
Handler = Callable[[asyncio.StreamReader, asyncio.StreamWriter], Awaitable[None]]


class RawUpstream:
    """A raw asyncio HTTP server in a thread; each connection runs ``handler``. ``heads`` keeps every request head
    read by ``tests.test_proxy_aiotransport.read_request``. Connections set TCP_NODELAY (no delayed-ACK stalls); a
    client that goes away ends its connection quietly."""

    def __init__(self, handler: Handler) -> None:
        self.handler = handler
        self.heads: list[bytes] = []
        self.loop = asyncio.new_event_loop()
        self._ready = threading.Event()
        self.thread = threading.Thread(target=self._run, daemon=True)

    def _run(self) -> None:
        asyncio.set_event_loop(self.loop)

        async def start() -> None:
            self.server = await asyncio.start_server(self._conn, "127.0.0.1", 0)
            self.port = self.server.sockets[0].getsockname()[1]
            self._ready.set()

        self.loop.run_until_complete(start())
        self.loop.run_forever()

    async def _conn(self, reader: asyncio.StreamReader, writer: asyncio.StreamWriter) -> None:
        writer.get_extra_info("socket").setsockopt(socket.IPPROTO_TCP, socket.TCP_NODELAY, 1)
        try:
            await self.handler(reader, writer)
        except (asyncio.IncompleteReadError, ConnectionError):
            pass
        finally:
            writer.close()

    @property
    def url(self) -> str:
        return f"http://127.0.0.1:{self.port}"

    def __enter__(self) -> Self:
        self.thread.start()
        self._ready.wait(10)
        return self

    def __exit__(self, *exc: object) -> None:
        async def stop() -> None:
            self.server.close()
            tasks = [t for t in asyncio.all_tasks() if t is not asyncio.current_task()]
            for task in tasks:
                task.cancel()
            await asyncio.gather(*tasks, return_exceptions=True)

        asyncio.run_coroutine_threadsafe(stop(), self.loop).result(10)
        self.loop.call_soon_threadsafe(self.loop.stop)
        self.thread.join(10)
        self.loop.close()
