"""``agentcache replay`` without a server: wire conversions on real tau-bench bodies, token ids for ``/generate``,
and the runner against in-process fake engines (httpx ``MockTransport``) that stream like llama.cpp, SGLang
and Anthropic: ordering, concurrency, session affinity (``id_slot``, ``session_id`` + ``/close_session``),
usage and TTFT parsing, errors."""

from __future__ import annotations

import itertools
import json
import threading
from collections import defaultdict
from pathlib import Path
from typing import Any

import httpx
import pytest

from agentcache.loaders import Record, load
from agentcache.replay import ReplayConfig, convert, group_sessions, percentile, replay, to_token_ids
from agentcache.replay._convert import anthropic_to_chat, chat_to_anthropic, first_divergence, responses_to_chat

ROOT = Path(__file__).resolve().parent.parent
TAU = ROOT / "data" / "tau-bench" / "gpt-4o-airline.json"
RECORDS = load(TAU).records


def session(n: int = 0) -> list[Record]:
    return group_sessions(RECORDS, None, None)[n]


def test_chat_to_anthropic_on_a_real_tool_session() -> None:
    body = session(0)[-1].body
    out = chat_to_anthropic(body)
    assert out["system"] == body["messages"][0]["content"]
    assert [t["name"] for t in out["tools"]] == [t["function"]["name"] for t in body["tools"]]
    assert out["tools"][0]["input_schema"] == body["tools"][0]["function"]["parameters"]
    roles = [m["role"] for m in out["messages"]]
    assert all(a != b for a, b in itertools.pairwise(roles)), "roles must alternate"
    uses = [b for m in out["messages"] for b in m["content"] if b["type"] == "tool_use"]
    results = [b for m in out["messages"] for b in m["content"] if b["type"] == "tool_result"]
    calls = [c for m in body["messages"] for c in m.get("tool_calls") or []]
    assert len(uses) == len(calls) and uses[0]["input"] == json.loads(calls[0]["function"]["arguments"])
    assert {r["tool_use_id"] for r in results} <= {u["id"] for u in uses}
    assert body == session(0)[-1].body  # input untouched


def test_anthropic_round_trip_keeps_meaning() -> None:
    body = session(3)[-1].body
    back = anthropic_to_chat(chat_to_anthropic(body))
    assert [m["role"] for m in back["messages"]] == [m["role"] for m in body["messages"]]
    for a, b in zip(back["messages"], body["messages"], strict=True):
        assert (a.get("content") or "") == (b.get("content") or "")
        for x, y in zip(a.get("tool_calls") or [], b.get("tool_calls") or [], strict=True):
            assert x["id"] == y["id"] and json.loads(x["function"]["arguments"]) == json.loads(
                y["function"]["arguments"]
            )
    assert back["tools"] == body["tools"]


def test_anthropic_tool_choice_and_options() -> None:
    tools = [{"type": "function", "function": {"name": "f", "parameters": {}}}]
    chat = {"model": "m", "messages": [{"role": "user", "content": "hi"}], "tools": tools, "tool_choice": "required"}
    chat |= {"stop": "END", "max_tokens": 9}
    out = chat_to_anthropic(chat)
    assert out["tool_choice"] == {"type": "any"} and out["stop_sequences"] == ["END"] and out["max_tokens"] == 9
    assert anthropic_to_chat(out)["tool_choice"] == "required"


def test_responses_to_chat() -> None:
    body = {"model": "m", "instructions": "be brief", "input": [
        {"role": "user", "content": "weather?"},
        {"type": "function_call", "call_id": "c1", "name": "get", "arguments": '{"city":"Oslo"}'},
        {"type": "function_call_output", "call_id": "c1", "output": "rain"},
    ], "max_output_tokens": 5}  # fmt: skip
    chat = responses_to_chat(body)
    assert [m["role"] for m in chat["messages"]] == ["system", "user", "assistant", "tool"]
    assert chat["messages"][2]["tool_calls"][0]["function"]["name"] == "get" and chat["max_tokens"] == 5
    assert convert("openai.responses", body, "anthropic.messages")["system"] == "be brief"


def test_converted_turns_stay_prefixes_of_each_other() -> None:
    turns = session(3)
    for target in ("openai.chat", "anthropic.messages"):
        bodies = [convert(r.api, r.body, target) for r in turns]
        for a, b in itertools.pairwise(bodies):
            shown = json.dumps(b["messages"])
            for i, msg in enumerate(a["messages"][:-1]):
                assert json.dumps(msg) in shown, (target, i)


def test_token_ids_are_prefix_stable_and_in_vocab() -> None:
    turns = session(0)[:4]
    ids = [to_token_ids(r.api, r.body, 1000) for r in turns]
    for a, b in itertools.pairwise(ids):
        assert len(b) > len(a) and first_divergence(a, b) == len(a)
    assert all(0 <= t < 1000 for t in ids[-1])


def test_percentile() -> None:
    assert percentile([], 50) is None
    assert percentile([3.0], 99) == 3.0
    assert percentile([1.0, 2.0, 3.0, 4.0], 50) == 2.5
    assert percentile(list(map(float, range(101))), 95) == 95.0


def test_group_sessions_limits() -> None:
    groups = group_sessions(RECORDS, 3, 2)
    assert len(groups) == 3 and all(len(g) == 2 for g in groups)
    assert [r.session for r in groups[0]] == [groups[0][0].session] * 2


# -- fake engines ---------------------------------------------------------------------------------------------


def _sse(events: list[dict[str, Any]]) -> bytes:
    return b"".join(b"data: " + json.dumps(e).encode() + b"\n\n" for e in events) + b"data: [DONE]\n\n"


class FakeEngine:
    """A llama.cpp-like (or SGLang-like) server: prompt cache per slot (llama) or one shared cache (sglang),
    reporting cached tokens as the common prefix (in characters) with what the slot processed before."""

    def __init__(self, kind: str = "llama.cpp", slots: int = 2, fail_on: int | None = None) -> None:
        self.kind = kind
        self.slots = slots
        self.fail_on = fail_on
        self.cache: dict[int, str] = defaultdict(str)
        self.requests: list[dict[str, Any]] = []
        self.closed: list[str] = []
        self.lock = threading.Lock()

    def __call__(self, request: httpx.Request) -> httpx.Response:
        path = request.url.path
        if path == "/v1/models":
            owner = "llamacpp" if self.kind == "llama.cpp" else "sglang"
            return httpx.Response(200, json={"data": [{"id": f"{self.kind}-model", "owned_by": owner}]})
        if path == "/props":
            return (
                httpx.Response(200, json={"total_slots": self.slots})
                if self.kind == "llama.cpp"
                else httpx.Response(404)
            )
        if path in ("/apply-template", "/tokenize"):  # a llama.cpp-like fake without them: no predictions
            return httpx.Response(404)
        if path == "/close_session":
            self.closed.append(json.loads(request.content)["session_id"])
            return httpx.Response(200, json={})
        body = json.loads(request.content)
        with self.lock:
            self.requests.append(body)
            n = len(self.requests)
            prompt = json.dumps(body.get("messages") or body.get("input_ids"))[:-1]
            slot = body.get("id_slot", 0) if self.kind == "llama.cpp" else 0
            cached = first_divergence(self.cache[slot], prompt)  # type: ignore[arg-type]
            self.cache[slot] = prompt
        if self.fail_on == n:
            return httpx.Response(500, json={"error": {"message": "boom"}})
        if path == "/v1/messages":
            return httpx.Response(200, content=_sse([
                {"type": "message_start", "message": {"usage": {
                    "input_tokens": len(prompt) - cached, "cache_read_input_tokens": cached, "output_tokens": 0}}},
                {"type": "content_block_start", "index": 0, "content_block": {"type": "text", "text": ""}},
                {"type": "content_block_delta", "index": 0, "delta": {"type": "text_delta", "text": "ok"}},
                {"type": "message_delta", "delta": {}, "usage": {"output_tokens": 1}},
            ]))  # fmt: skip
        if path == "/generate":
            meta = {"prompt_tokens": len(body["input_ids"]), "cached_tokens": min(cached, len(body["input_ids"])),
                    "completion_tokens": 1, "cached_tokens_details": {"device": 1, "host": 2}}  # fmt: skip
            return httpx.Response(200, content=_sse([{"text": "a", "output_ids": [1], "meta_info": meta}]))
        usage = {
            "prompt_tokens": len(prompt),
            "completion_tokens": 1,
            "prompt_tokens_details": {"cached_tokens": cached},
        }
        return httpx.Response(200, content=_sse([
            {"choices": [{"delta": {"role": "assistant"}}]},
            {"choices": [{"delta": {"content": "ok"}}]},
            {"choices": [], "usage": usage},
        ]))  # fmt: skip


def run_fake(engine: FakeEngine, **kwargs: Any) -> Any:
    config = ReplayConfig("http://fake/v1", **{"max_sessions": 4, "max_turns": 3, **kwargs})
    return replay(RECORDS, config, transport=httpx.MockTransport(engine))


def test_llama_affinity_pins_each_session_to_a_free_slot() -> None:
    engine = FakeEngine("llama.cpp", slots=2)
    result = run_fake(engine, via="agentcache", concurrency=2)
    assert result.completed == 12 and result.errors == 0
    assert all(
        "id_slot" in b and b["stream"] and b["stream_options"] == {"include_usage": True} for b in engine.requests
    )
    assert all(b["model"] == "llama.cpp-model" and b["max_tokens"] == 16 for b in engine.requests)
    by_session = defaultdict(set)
    for turn in result.turns:
        by_session[turn.session].add(turn.slot)
    assert all(len(slots) == 1 for slots in by_session.values())
    assert all(t.cached_tokens and t.cached_tokens > 0 for t in result.turns if t.turn > 0)
    assert result.config["engine"] == "llama.cpp" and result.config["affinity"] is True
    assert result.ttft(50) is not None and result.to_dict()["completed"] == 12


def test_direct_sends_no_affinity_and_keeps_turn_order() -> None:
    engine = FakeEngine("llama.cpp", slots=2)
    result = run_fake(engine, via="direct", concurrency=4)
    assert all("id_slot" not in b for b in engine.requests)
    seen: dict[str, int] = {}
    for body in engine.requests:
        key = json.dumps(body["messages"][1])  # the first user message identifies the session
        assert len(body["messages"]) > seen.get(key, 0)
        seen[key] = len(body["messages"])
    assert [t.turn for t in result.turns[:3]] == [0, 1, 2]


def test_sglang_sessions_carry_session_id_and_are_closed() -> None:
    engine = FakeEngine("sglang")
    result = run_fake(engine, via="agentcache", concurrency=3)
    sessions = {t.session for t in result.turns}
    assert {b["session_id"] for b in engine.requests} == sessions
    assert sorted(engine.closed) == sorted(sessions)


def test_sglang_generate_with_token_ids_reports_tiers() -> None:
    engine = FakeEngine("sglang")
    result = run_fake(engine, api="sglang", vocab_size=5000, max_tokens=4)
    assert all(set(b) == {"input_ids", "sampling_params", "stream"} for b in engine.requests)
    assert engine.requests[0]["sampling_params"]["max_new_tokens"] == 4
    assert result.completed == 12 and result.turns[0].tiers == {"device": 1, "host": 2}


def test_anthropic_target_converts_and_reads_anthropic_usage() -> None:
    engine = FakeEngine("llama.cpp", slots=4)
    result = run_fake(engine, api="anthropic", via="agentcache")
    assert all("system" in b and b["max_tokens"] == 16 for b in engine.requests)
    later = [t for t in result.turns if t.turn > 0]
    assert later and all(t.cached_tokens and t.prompt_tokens and t.cached_tokens < t.prompt_tokens for t in later)


def test_an_error_is_counted_and_the_session_goes_on() -> None:
    engine = FakeEngine("llama.cpp", fail_on=2)
    result = run_fake(engine, concurrency=1, max_sessions=1)
    assert result.errors == 1 and result.completed == 2
    failed = next(t for t in result.turns if not t.ok)
    assert failed.turn == 1 and failed.status == 500 and "boom" in (failed.error or "")


def test_unreachable_endpoint_is_an_error_per_request() -> None:
    def refuse(request: httpx.Request) -> httpx.Response:
        raise httpx.ConnectError("refused", request=request)

    result = replay(
        RECORDS, ReplayConfig("http://nowhere", max_sessions=1, max_turns=2), transport=httpx.MockTransport(refuse)
    )
    assert result.completed == 0 and result.errors == 2 and "ConnectError" in (result.turns[0].error or "")


@pytest.mark.parametrize("api", ["openai", "anthropic"])
def test_case_files_replay(api: str) -> None:
    records = load(ROOT / "tests" / "cases" / "k01-tools-reordered.json").records
    engine = FakeEngine("other")
    result = replay(records, ReplayConfig("http://fake", api=api), transport=httpx.MockTransport(engine))
    assert result.completed == len(records) and result.errors == 0


def test_a_stale_keepalive_connection_is_retried_once() -> None:
    engine = FakeEngine("llama.cpp")
    dropped: list[str] = []

    def flaky(request: httpx.Request) -> httpx.Response:
        if request.url.path == "/v1/chat/completions" and not dropped:
            dropped.append("once")
            raise httpx.RemoteProtocolError("Server disconnected without sending a response.", request=request)
        return engine(request)

    config = ReplayConfig("http://fake", max_sessions=1, max_turns=2)
    result = replay(RECORDS, config, transport=httpx.MockTransport(flaky))
    assert dropped == ["once"] and result.completed == 2 and result.errors == 0
