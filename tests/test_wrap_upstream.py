"""A fake upstream for the wrapper tests: a real HTTP/1.1 server on loopback speaking Anthropic Messages, OpenAI
Chat Completions and Responses (JSON and SSE), which can answer late, fail, or cut a stream mid-way. Used by
``test_wrap.py``, ``test_wrap_faults.py``, ``test_session_scale.py`` and ``test_examples.py``; the tests here
check the fake itself, with plain httpx.
"""

from __future__ import annotations

import json
import random
import socket
import threading
import time
from collections.abc import Callable, Iterator
from dataclasses import dataclass
from http.server import BaseHTTPRequestHandler, ThreadingHTTPServer
from typing import Any

import httpx
import pytest

from .conftest import anthropic_tools, openai_tools, policy

# ---- a fake upstream speaking Anthropic Messages, OpenAI Chat Completions and Responses ---------------------

ANTHROPIC_USAGE = {
    "input_tokens": 7,
    "cache_creation_input_tokens": 50,
    "cache_read_input_tokens": 1200,
    "output_tokens": 3,
}
CHAT_USAGE = {
    "prompt_tokens": 1300,
    "completion_tokens": 3,
    "total_tokens": 1303,
    "prompt_tokens_details": {"cached_tokens": 1152},
}
RESPONSES_USAGE = {
    "input_tokens": 1300,
    "input_tokens_details": {"cached_tokens": 1024},
    "output_tokens": 3,
    "output_tokens_details": {"reasoning_tokens": 0},
    "total_tokens": 1303,
}


@dataclass
class Reply:
    """What the fake upstream answers: JSON (``body``), SSE (``events``, chunked; ``cut_after`` events
    then the connection drops without the final chunk), after ``delay`` seconds."""

    status: int = 200
    body: Any = None
    events: list[tuple[str | None, Any]] | None = None
    cut_after: int | None = None
    delay: float = 0.0


@dataclass
class Seen:
    path: str
    headers: dict[str, str]
    body: dict[str, Any]


def anthropic_message(text: str = "Hello.", usage: dict[str, Any] | None = None, content: Any = None) -> dict[str, Any]:
    return {
        "id": "msg_1",
        "type": "message",
        "role": "assistant",
        "model": "claude-sonnet-4-6",
        "content": content if content is not None else [{"type": "text", "text": text}],
        "stop_reason": "end_turn",
        "stop_sequence": None,
        "usage": usage or ANTHROPIC_USAGE,
    }


def anthropic_events(usage: dict[str, Any] | None = None) -> list[tuple[str | None, Any]]:
    start = {**anthropic_message(usage={**(usage or ANTHROPIC_USAGE), "output_tokens": 1}), "content": []}
    return [
        ("message_start", {"type": "message_start", "message": start}),
        (
            "content_block_start",
            {"type": "content_block_start", "index": 0, "content_block": {"type": "text", "text": ""}},
        ),
        (
            "content_block_delta",
            {"type": "content_block_delta", "index": 0, "delta": {"type": "text_delta", "text": "Hel"}},
        ),
        (
            "content_block_delta",
            {"type": "content_block_delta", "index": 0, "delta": {"type": "text_delta", "text": "lo."}},
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


def chat_completion(content: str = "Hello.", tool_calls: Any = None) -> dict[str, Any]:
    message: dict[str, Any] = {"role": "assistant", "content": content}
    if tool_calls:
        message = {"role": "assistant", "content": None, "tool_calls": tool_calls}
    return {
        "id": "chatcmpl-1",
        "object": "chat.completion",
        "created": 0,
        "model": "gpt-4o",
        "choices": [{"index": 0, "message": message, "finish_reason": "tool_calls" if tool_calls else "stop"}],
        "usage": CHAT_USAGE,
    }


def chat_events(include_usage: bool) -> list[tuple[str | None, Any]]:
    base = {"id": "chatcmpl-1", "object": "chat.completion.chunk", "created": 0, "model": "gpt-4o"}
    out: list[tuple[str | None, Any]] = [
        (
            None,
            {
                **base,
                "choices": [{"index": 0, "delta": {"role": "assistant", "content": "Hel"}, "finish_reason": None}],
            },
        ),
        (None, {**base, "choices": [{"index": 0, "delta": {"content": "lo."}, "finish_reason": "stop"}]}),
    ]
    if include_usage:
        out.append((None, {**base, "choices": [], "usage": CHAT_USAGE}))
    out.append((None, "[DONE]"))
    return out


def response_object(text: str = "Hello.") -> dict[str, Any]:
    return {
        "id": "resp_1",
        "object": "response",
        "created_at": 0,
        "model": "gpt-4o",
        "status": "completed",
        "output": [
            {
                "type": "message",
                "id": "msg_1",
                "role": "assistant",
                "status": "completed",
                "content": [{"type": "output_text", "text": text, "annotations": []}],
            }
        ],
        "parallel_tool_calls": True,
        "tool_choice": "auto",
        "tools": [],
        "usage": RESPONSES_USAGE,
    }


def responses_events() -> list[tuple[str | None, Any]]:
    created = {**response_object(), "status": "in_progress", "output": [], "usage": None}
    return [
        ("response.created", {"type": "response.created", "sequence_number": 0, "response": created}),
        (
            "response.output_text.delta",
            {
                "type": "response.output_text.delta",
                "sequence_number": 1,
                "item_id": "msg_1",
                "output_index": 0,
                "content_index": 0,
                "delta": "Hello.",
                "logprobs": [],
            },
        ),
        ("response.completed", {"type": "response.completed", "sequence_number": 2, "response": response_object()}),
    ]


def default_reply(path: str, body: dict[str, Any]) -> Reply:
    """A valid answer for ``path`` (streamed when the body asks for it)."""
    stream = bool(body.get("stream"))
    if path.endswith("/messages"):
        return Reply(events=anthropic_events()) if stream else Reply(body=anthropic_message())
    if path.endswith("/chat/completions"):
        include = bool((body.get("stream_options") or {}).get("include_usage"))
        return Reply(events=chat_events(include)) if stream else Reply(body=chat_completion())
    if path.endswith("/responses"):
        return Reply(events=responses_events()) if stream else Reply(body=response_object())
    if path == "/close_session":
        return Reply(body={"success": True})
    return Reply(404, {"error": {"type": "not_found", "message": path}})


class FakeUpstream:
    """A threaded HTTP/1.1 server on 127.0.0.1 (TCP_NODELAY), optionally answering ``GET /v1/models`` as a local
    ``engine`` would. ``script`` holds callables
    ``(path, body) -> Reply`` answered in order; when it is empty, ``fallback`` (default
    :func:`default_reply`) answers.
    ``seen`` records every request."""

    def __init__(self, engine: str | None = None) -> None:
        #: When set, ``GET /v1/models`` answers as that engine does (``owned_by``: ``llamacpp``, ``sglang``...).
        self.engine = engine
        #: The paths of the ``GET`` requests it answered (a client asking what the server is).
        self.probes: list[str] = []
        self.script: list[Callable[[str, dict[str, Any]], Reply]] = []
        self.fallback: Callable[[str, dict[str, Any]], Reply] = default_reply
        self.seen: list[Seen] = []
        self._lock = threading.Lock()
        upstream = self

        class Handler(BaseHTTPRequestHandler):
            protocol_version = "HTTP/1.1"

            def setup(self) -> None:
                super().setup()
                self.connection.setsockopt(socket.IPPROTO_TCP, socket.TCP_NODELAY, 1)

            def log_message(self, *args: Any) -> None:
                pass

            def do_GET(self) -> None:
                with upstream._lock:
                    upstream.probes.append(self.path)
                if upstream.engine is None or self.path != "/v1/models":
                    self.send_error(404)
                    return
                data = json.dumps({"object": "list", "data": [{"id": "m", "owned_by": upstream.engine}]}).encode()
                self.send_response(200)
                self.send_header("Content-Type", "application/json")
                self.send_header("Content-Length", str(len(data)))
                self.end_headers()
                self.wfile.write(data)

            def do_POST(self) -> None:
                raw = self.rfile.read(int(self.headers.get("Content-Length") or 0))
                body = json.loads(raw) if raw else {}
                with upstream._lock:
                    upstream.seen.append(Seen(self.path, {k.lower(): v for k, v in self.headers.items()}, body))
                    responder = upstream.script.pop(0) if upstream.script else upstream.fallback
                reply = responder(self.path, body)
                if reply.delay:
                    time.sleep(reply.delay)
                if reply.events is None:
                    data = json.dumps(reply.body).encode()
                    self.send_response(reply.status)
                    self.send_header("Content-Type", "application/json")
                    self.send_header("Content-Length", str(len(data)))
                    self.end_headers()
                    self.wfile.write(data)
                    return
                self.send_response(reply.status)
                self.send_header("Content-Type", "text/event-stream")
                self.send_header("Transfer-Encoding", "chunked")
                self.end_headers()
                for i, (name, data_obj) in enumerate(reply.events):
                    if reply.cut_after is not None and i == reply.cut_after:
                        self.wfile.flush()
                        self.close_connection = True
                        self.connection.shutdown(socket.SHUT_RDWR)
                        return
                    payload = data_obj if isinstance(data_obj, str) else json.dumps(data_obj)
                    chunk = (f"event: {name}\n" if name else "") + f"data: {payload}\n\n"
                    encoded = chunk.encode()
                    self.wfile.write(f"{len(encoded):x}\r\n".encode() + encoded + b"\r\n")
                    self.wfile.flush()
                self.wfile.write(b"0\r\n\r\n")

        class Server(ThreadingHTTPServer):
            request_queue_size = 256  # many concurrent clients in the scale tests

            def handle_error(self, request: Any, client_address: Any) -> None:
                pass  # a client that timed out closed its end: expected in fault tests

        self.server = Server(("127.0.0.1", 0), Handler)
        self.server.daemon_threads = True
        self.thread = threading.Thread(target=self.server.serve_forever, daemon=True)
        self.thread.start()

    @property
    def url(self) -> str:
        return f"http://127.0.0.1:{self.server.server_address[1]}"

    def close(self) -> None:
        self.server.shutdown()
        self.server.server_close()


@pytest.fixture
def upstream() -> Iterator[FakeUpstream]:
    up = FakeUpstream()
    yield up
    up.close()


def anthropic_client(up: FakeUpstream, async_: bool = False, **kw: Any) -> Any:
    import anthropic

    cls = anthropic.AsyncAnthropic if async_ else anthropic.Anthropic
    return cls(base_url=up.url, api_key="sk-test", max_retries=0, **kw)


def openai_client(up: FakeUpstream, async_: bool = False, **kw: Any) -> Any:
    import openai

    cls = openai.AsyncOpenAI if async_ else openai.OpenAI
    return cls(base_url=up.url + "/v1", api_key="sk-test", max_retries=0, **kw)


def a_body(turns: int = 1, tools: list[dict[str, Any]] | None = None) -> dict[str, Any]:
    msgs: list[dict[str, Any]] = []
    for i in range(turns):
        msgs.append({"role": "user", "content": f"question {i}"})
        if i < turns - 1:
            msgs.append({"role": "assistant", "content": f"answer {i}"})
    return {
        "model": "claude-sonnet-4-6",
        "max_tokens": 64,
        "system": policy(),
        "tools": tools or anthropic_tools(),
        "messages": msgs,
    }


def o_body(turns: int = 1, tools: list[dict[str, Any]] | None = None) -> dict[str, Any]:
    msgs: list[dict[str, Any]] = [{"role": "system", "content": policy()}]
    for i in range(turns):
        msgs.append({"role": "user", "content": f"question {i}"})
        if i < turns - 1:
            msgs.append({"role": "assistant", "content": f"answer {i}"})
    return {"model": "gpt-4o", "messages": msgs, "tools": tools or openai_tools()}


def shuffled(tools: list[dict[str, Any]], seed: int) -> list[dict[str, Any]]:
    out = list(tools)
    random.Random(seed).shuffle(out)
    return out


def sse_lines(response: httpx.Response) -> list[str]:
    return [line for line in response.iter_lines() if line.startswith("data: ")]


def test_fake_upstream_json_sse_and_records(upstream: FakeUpstream) -> None:
    with httpx.Client(base_url=upstream.url, trust_env=False) as http:
        assert http.post("/v1/messages", json={"messages": []}).json()["usage"]["cache_read_input_tokens"] == 1200
        with http.stream("POST", "/v1/chat/completions", json={"stream": True}) as r:
            assert sse_lines(r)[-1] == "data: [DONE]"
    assert [s.path for s in upstream.seen] == ["/v1/messages", "/v1/chat/completions"]


def test_fake_upstream_cuts_a_chunked_stream(upstream: FakeUpstream) -> None:
    upstream.script.append(lambda path, body: Reply(events=anthropic_events(), cut_after=2))
    http = httpx.Client(base_url=upstream.url, trust_env=False)
    with pytest.raises(httpx.RemoteProtocolError), http.stream("POST", "/v1/messages", json={"stream": True}) as r:
        sse_lines(r)
    http.close()
