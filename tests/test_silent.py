"""The library prints nothing: a program that imports agentcache, wraps real SDK clients and makes calls (streaming
too, plus a failing sink, which logs a warning) writes nothing to stdout or stderr unless it configures logging;
once it does, agentcache's events reach its handler through the standard ``logging`` module."""

from __future__ import annotations

import subprocess
import sys
import textwrap

import pytest

pytest.importorskip("anthropic")
pytest.importorskip("openai")

PROGRAM = textwrap.dedent(
    """
    import json, logging, sys, threading
    from http.server import BaseHTTPRequestHandler, ThreadingHTTPServer
    import anthropic, openai
    import agentcache

    MESSAGE = {"id": "m", "type": "message", "role": "assistant", "model": "claude-haiku-4-5",
               "content": [{"type": "text", "text": "ok"}], "stop_reason": "end_turn", "stop_sequence": None,
               "usage": {"input_tokens": 10, "cache_read_input_tokens": 5, "output_tokens": 1}}
    CHAT = {"id": "c", "object": "chat.completion", "created": 0, "model": "gpt-4.1",
            "choices": [{"index": 0, "message": {"role": "assistant", "content": "ok"}, "finish_reason": "stop"}],
            "usage": {"prompt_tokens": 10, "completion_tokens": 1, "total_tokens": 11}}
    CHUNK = {"id": "c", "object": "chat.completion.chunk", "created": 0, "model": "gpt-4.1",
             "choices": [{"index": 0, "delta": {"content": "ok"}, "finish_reason": "stop"}]}

    class Upstream(BaseHTTPRequestHandler):
        def do_POST(self):
            body = json.loads(self.rfile.read(int(self.headers["content-length"])))
            if self.path.endswith("/messages"):
                data, kind = json.dumps(MESSAGE).encode(), "application/json"
            elif body.get("stream"):
                data, kind = ("data: " + json.dumps(CHUNK) + "\\n\\ndata: [DONE]\\n\\n").encode(), "text/event-stream"
            else:
                data, kind = json.dumps(CHAT).encode(), "application/json"
            self.send_response(200)
            self.send_header("content-type", kind)
            self.send_header("content-length", str(len(data)))
            self.end_headers()
            self.wfile.write(data)

        def log_message(self, *args):
            pass

    server = ThreadingHTTPServer(("127.0.0.1", 0), Upstream)
    threading.Thread(target=server.serve_forever, daemon=True).start()
    url = f"http://127.0.0.1:{server.server_address[1]}"

    def broken_sink(event):
        raise RuntimeError("sink down")

    sessions = agentcache.Sessions(sinks=[broken_sink])
    messages = [{"role": "user", "content": "hello"}]
    with sessions.session("s") as session:
        ant = agentcache.wrap(anthropic.Anthropic(api_key="k", base_url=url), session=session, provider="anthropic")
        oai = agentcache.wrap(openai.OpenAI(api_key="k", base_url=url + "/v1"), session=session.fork("sub"))
        for _ in range(3):
            ant.messages.create(model="claude-haiku-4-5", max_tokens=8, messages=messages)
            oai.chat.completions.create(model="gpt-4.1", messages=messages)
            for _chunk in oai.chat.completions.create(model="gpt-4.1", messages=messages, stream=True):
                pass
    if sys.argv[1:] == ["configured"]:
        logging.basicConfig(level=logging.INFO, stream=sys.stdout, format="%(name)s %(levelname)s %(message)s")
        with sessions.session("t") as again:
            ant = agentcache.wrap(anthropic.Anthropic(api_key="k", base_url=url), session=again, provider="anthropic")
            ant.messages.create(model="claude-haiku-4-5", max_tokens=8, messages=messages)
    server.shutdown()
    """
)


def run(*args: str) -> subprocess.CompletedProcess[str]:
    return subprocess.run(
        [sys.executable, "-W", "ignore", "-c", PROGRAM, *args], capture_output=True, text=True, timeout=120
    )


def test_nothing_is_printed_when_logging_is_not_configured() -> None:
    done = run()
    assert done.returncode == 0, done.stderr
    assert done.stdout == "" and done.stderr == ""


def test_the_hosts_logging_configuration_decides() -> None:
    done = run("configured")
    assert done.returncode == 0, done.stderr
    lines = done.stdout.splitlines()
    assert any(line.startswith("agentcache.session INFO") and "session.open" in line for line in lines)
    assert any(line.startswith("agentcache.session WARNING") and "session.sink_failed" in line for line in lines)
    assert done.stderr == ""
