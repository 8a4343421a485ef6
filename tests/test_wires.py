"""Each wire's facts, reached through ``wire_for(api)``: usage of real responses and streams (the fake upstream of
``tests/clients``, in-process), error bodies, conversation items, routes, replay's stream reading and conversion."""

from __future__ import annotations

import asyncio
import json
from typing import Any

import httpx
import pytest

from agentcache._exceptions import ConfigError, InputError
from agentcache.adapters import endpoint_for, usage_wire, wire_for, wire_for_route
from agentcache.model._usage_stream import UsageAccumulator
from agentcache.proxy._errors import error_body
from tests.clients.fake_upstream import FakeUpstream

SYSTEM = "You are a careful assistant. " * 40  # long enough to be counted as a cached prefix by the fake

BODIES: dict[str, dict[str, Any]] = {
    "anthropic.messages": {
        "model": "claude-x",
        "max_tokens": 64,
        "system": SYSTEM,
        "messages": [{"role": "user", "content": "Say hello to the team."}],
    },
    "openai.chat": {
        "model": "gpt-x",
        "messages": [{"role": "system", "content": SYSTEM}, {"role": "user", "content": "Say hello to the team."}],
    },
    "openai.responses": {
        "model": "gpt-x",
        "instructions": SYSTEM,
        "input": [{"role": "user", "content": "Say hello to the team."}],
    },
}


def _exchange(api: str, bodies: list[dict[str, Any]]) -> list[httpx.Response]:
    """``bodies`` posted in turn to the fake upstream's route for ``api`` (one cache across them)."""
    upstream = FakeUpstream()

    async def go() -> list[httpx.Response]:
        transport = httpx.ASGITransport(app=upstream.app)
        async with httpx.AsyncClient(transport=transport, base_url="http://fake") as client:
            return [await client.post(wire_for(api).route, json=b) for b in bodies]

    return asyncio.run(go())


def _events(text: str) -> list[Any]:
    """The ``data:`` payloads of an SSE stream: JSON events, and Chat's ``[DONE]`` as the string."""
    out: list[Any] = []
    for line in text.splitlines():
        if line.startswith("data:"):
            data = line[5:].strip()
            out.append(data if data == "[DONE]" else json.loads(data))
    return out


@pytest.mark.parametrize("api", sorted(BODIES))
def test_a_wires_usage_reads_its_responses_and_streams_alike(api: str) -> None:
    body = BODIES[api]
    streamed = {**body, "stream": True}
    if api == "openai.chat":
        streamed["stream_options"] = {"include_usage": True}
    first, second, stream = _exchange(api, [body, body, streamed])
    wire = wire_for(api)
    cold, warm = wire.read_usage(first.json()), wire.read_usage(second.json())
    assert cold is not None and warm is not None
    assert cold.cache_read_tokens == 0 and cold.prompt_tokens > 100
    assert cold.response_model == body["model"]  # the fake answers with the model it was asked for
    assert warm.prompt_tokens == cold.prompt_tokens
    assert warm.cache_read_tokens == warm.prompt_tokens  # the same request again: all of it read
    assert warm.output_tokens == 8
    acc = UsageAccumulator(api)
    events = _events(stream.text)
    for event in events:
        assert not acc.ended  # the terminal event is the last one
        acc.add_event(event)
    assert acc.ended
    assert acc.usage is not None
    assert (acc.usage.prompt_tokens, acc.usage.cache_read_tokens) == (warm.prompt_tokens, warm.prompt_tokens)
    assert acc.usage.response_model == body["model"]
    last = stream.text.strip().splitlines()[-1].encode()
    assert any(marker in last for marker in wire.sse_end_markers)


def test_anthropic_stream_usage_merges_the_deltas_and_keeps_the_message_id() -> None:
    (stream,) = _exchange("anthropic.messages", [{**BODIES["anthropic.messages"], "stream": True}])
    acc = UsageAccumulator("anthropic.messages")
    for event in _events(stream.text):
        acc.add_event(event)
    usage = acc.usage
    assert usage is not None
    assert usage.output_tokens == 8  # message_start said 1; message_delta's cumulative 8 wins
    assert usage.response_id is not None and usage.response_id.startswith("msg_")


@pytest.mark.parametrize("api", sorted(BODIES))
def test_usage_doc_is_read_back_by_the_same_wire(api: str) -> None:
    wire = wire_for(api)
    usage = wire.read_usage({"usage": wire.usage_doc(1000, 600, 100, 5)})
    assert usage is not None
    assert (usage.prompt_tokens, usage.cache_read_tokens, usage.cache_write_tokens) == (1000, 600, 100)
    assert (usage.uncached_tokens, usage.output_tokens) == (300, 5)


def test_input_tokens_alone_is_settled_by_the_wire() -> None:
    usage = {"usage": {"input_tokens": 900, "output_tokens": 3}}
    anthropic, responses = (
        wire_for("anthropic.messages").read_usage(usage),
        wire_for("openai.responses").read_usage(usage),
    )
    assert anthropic is not None and anthropic.source == "anthropic"
    assert responses is not None and responses.source == "openai.responses"
    assert usage_wire("sglang.generate") is wire_for("openai.chat")  # another API's usage reads as Chat's


def test_error_bodies_are_in_each_wires_format() -> None:
    anthropic = json.loads(wire_for("anthropic.messages").error_body(413, "too big"))
    assert anthropic == {"type": "error", "error": {"type": "request_too_large", "message": "too big"}}
    chat = json.loads(wire_for("openai.chat").error_body(502, "down"))
    assert chat == {"error": {"message": "down", "type": "server_error", "param": None, "code": "bad_gateway"}}
    assert wire_for("openai.responses").error_body(502, "down") == wire_for("openai.chat").error_body(502, "down")
    assert error_body("anthropic", 529, "busy") == wire_for("anthropic.messages").error_body(529, "busy")
    assert json.loads(error_body("anthropic", 529, "busy"))["error"]["type"] == "api_error"


def test_routes_and_sdk_paths_name_their_wire() -> None:
    assert wire_for_route("/v1/messages/") is wire_for("anthropic.messages")
    assert wire_for_route("/v1/responses") is wire_for("openai.responses")
    assert wire_for_route("/v1/models") is None
    assert [(w.sdk, w.sdk_resource, w.sdk_path) for w in map(wire_for, sorted(BODIES))] == [
        ("anthropic", ("messages",), "/v1/messages"),
        ("openai", ("chat", "completions"), "/chat/completions"),
        ("openai", ("responses",), "/responses"),
    ]
    with pytest.raises(ConfigError):
        wire_for("sglang.generate")


def test_conversation_items_and_prefix_units_per_wire() -> None:
    anthropic, chat, responses = (wire_for(a) for a in sorted(BODIES))
    assert anthropic.conversation(BODIES["anthropic.messages"]) == BODIES["anthropic.messages"]["messages"]
    assert anthropic.prefix_units(BODIES["anthropic.messages"]) == [None, SYSTEM]
    assert chat.conversation(BODIES["openai.chat"]) == [{"role": "user", "content": "Say hello to the team."}]
    assert chat.prefix_units(BODIES["openai.chat"]) == [None, None, {"role": "system", "content": SYSTEM}]
    assert responses.conversation({"input": "hi"}) == ["hi"]
    assert responses.prefix_units(BODIES["openai.responses"]) == [None, SYSTEM]
    assert chat.routing_key({"prompt_cache_key": "k1"}) == "k1"
    assert anthropic.routing_key({"prompt_cache_key": "k1"}) is None
    with pytest.raises(InputError, match="list of input"):
        responses.conversation({"input": {"role": "user"}})


@pytest.mark.parametrize("api", ["anthropic.messages", "openai.chat"])
def test_replay_reads_generated_text_through_the_endpoint(api: str) -> None:
    body = {**BODIES[api], "stream": True}
    (stream,) = _exchange(api, [body])
    endpoint = endpoint_for(api)
    events = [e for e in _events(stream.text) if isinstance(e, dict)]
    assert not any(endpoint.stream_error(e) for e in events)
    first = next(i for i, e in enumerate(events) if endpoint.first_output(e))
    text = "".join(endpoint.generated(e)[0] for e in events[first:])
    (whole,) = _exchange(api, [BODIES[api]])
    doc = whole.json()
    expected = doc["content"][0]["text"] if api == "anthropic.messages" else doc["choices"][0]["message"]["content"]
    assert text == expected and text


def test_replay_request_bodies_per_endpoint() -> None:
    chat = endpoint_for("openai.chat").replay_body(
        {"messages": [], "max_completion_tokens": 9}, 32, want_ids=True, token_ids=lambda b: []
    )
    assert chat == {
        "messages": [],
        "max_tokens": 32,
        "stream": True,
        "stream_options": {"include_usage": True},
        "logprobs": True,
    }
    sglang = endpoint_for("sglang.generate")
    native = sglang.replay_body({"messages": [], "session_id": "s"}, 16, want_ids=False, token_ids=lambda b: [1, 2])
    assert native == {
        "input_ids": [1, 2],
        "sampling_params": {"max_new_tokens": 16, "temperature": 0.0},
        "stream": True,
        "session_id": "s",
    }
    assert sglang.plans_as == "openai.chat" and endpoint_for("anthropic.messages").plans_as == "anthropic.messages"
    assert endpoint_for("anthropic.messages").replay_headers("k") == {
        "anthropic-version": "2023-06-01",
        "x-api-key": "k",
    }
    assert sglang.first_output({"text": "he", "meta_info": {}}) and not sglang.first_output({"text": ""})


def test_conversion_goes_through_chat() -> None:
    anthropic = wire_for("anthropic.messages")
    chat = anthropic.to_chat(BODIES["anthropic.messages"])
    assert chat["messages"] == [{"role": "system", "content": SYSTEM}, *BODIES["anthropic.messages"]["messages"]]
    back = anthropic.from_chat(chat)
    assert back["system"] == SYSTEM and back["messages"][0]["content"] == [
        {"type": "text", "text": "Say hello to the team."}
    ]
    assert wire_for("openai.responses").to_chat(BODIES["openai.responses"])["messages"] == chat["messages"]
    assert not wire_for("openai.responses").replay_target


def test_the_fake_upstream_runs_as_a_file(tmp_path: Any) -> None:
    """``python tests/clients/fake_upstream.py`` from any folder (capturing a client's traffic) finds ``tests``."""
    import subprocess
    import sys
    from pathlib import Path

    script = Path(__file__).parent / "clients" / "fake_upstream.py"
    done = subprocess.run(
        [sys.executable, str(script), "--help"], cwd=tmp_path, capture_output=True, text=True, timeout=60
    )
    assert done.returncode == 0, done.stderr
    assert "--port PORT" in done.stdout and "--log LOG" in done.stdout
