"""Usage normalisation into ``CacheUsage`` (every provider and engine format, dicts and SDK objects) and cost."""

from __future__ import annotations

import logging
from typing import Any

import pytest

from agentcache import CacheUsage, UsageTotals, cost_usd, normalize_usage
from agentcache.model import _rules
from agentcache.model._rules import anthropic_rules
from agentcache.model._usage import read_field
from agentcache.model._usage_stream import TERMINAL_EVENTS, UsageAccumulator, merge_anthropic_usage


def _u(data: Any, api: str | None = None) -> CacheUsage:
    usage = normalize_usage(data, api)
    assert usage is not None
    return usage


def test_anthropic_usage_with_ttl_split() -> None:
    u = _u(
        {
            "usage": {
                "input_tokens": 12,
                "cache_creation_input_tokens": 300,
                "cache_read_input_tokens": 5000,
                "cache_creation": {"ephemeral_5m_input_tokens": 100, "ephemeral_1h_input_tokens": 200},
                "output_tokens": 40,
            }
        }
    )
    assert (u.prompt_tokens, u.cache_read_tokens, u.cache_write_tokens, u.cache_write_1h_tokens) == (
        5312,
        5000,
        300,
        200,
    )
    assert (u.uncached_tokens, u.output_tokens, u.source) == (12, 40, "anthropic")
    assert u.hit_rate == pytest.approx(5000 / 5312)
    # 1.25x for the 5m part, 2x for the 1h part, 0.1x reads, at $5/MTok (Opus 4.8)
    assert cost_usd(u, "anthropic", "claude-opus-4-8") == pytest.approx((12 + 500 + 125 + 400) * 5 / 1e6)


def test_anthropic_nulls_and_llama_cpp_messages_shape() -> None:
    u = _u(
        {"input_tokens": 9, "cache_creation_input_tokens": None, "cache_read_input_tokens": None, "output_tokens": 1}
    )
    assert (u.prompt_tokens, u.cache_read_tokens, u.cache_write_tokens) == (9, 0, 0)
    llama = _u({"usage": {"cache_read_input_tokens": 83, "input_tokens": 1, "output_tokens": 40}})
    assert (llama.prompt_tokens, llama.cache_read_tokens, llama.source) == (84, 83, "anthropic")


def test_openai_chat_and_cache_write_tokens() -> None:
    u = _u({"usage": {"prompt_tokens": 2048, "completion_tokens": 5, "prompt_tokens_details": {"cached_tokens": 1920}}})
    assert (u.prompt_tokens, u.cache_read_tokens, u.uncached_tokens, u.source) == (2048, 1920, 128, "openai.chat")
    assert cost_usd(u, "openai", "gpt-4o") == pytest.approx((128 * 2.5 + 1920 * 1.25) / 1e6)
    w = _u({"prompt_tokens": 3000, "prompt_tokens_details": {"cached_tokens": 1000}, "cache_write_tokens": 1500})
    assert (w.cache_write_tokens, w.uncached_tokens) == (1500, 500)


def test_openai_responses() -> None:
    u = _u(
        {
            "usage": {
                "input_tokens": 1500,
                "input_tokens_details": {"cached_tokens": 1408},
                "output_tokens": 7,
                "total_tokens": 1507,
            }
        }
    )
    assert (u.prompt_tokens, u.cache_read_tokens, u.source) == (1500, 1408, "openai.responses")
    # input_tokens alone is ambiguous: the api decides
    assert _u({"input_tokens": 10, "output_tokens": 1}, "openai.responses").source == "openai.responses"
    assert _u({"input_tokens": 10, "output_tokens": 1}, "anthropic.messages").source == "anthropic"


def test_sglang_native_and_v1_tiers() -> None:
    meta = {
        "meta_info": {
            "prompt_tokens": 900,
            "cached_tokens": 768,
            "completion_tokens": 32,
            "cached_tokens_details": {"device": 512, "host": 256, "storage": 0},
        }
    }
    u = _u(meta)
    assert (u.prompt_tokens, u.cache_read_tokens, u.source) == (900, 768, "sglang")
    assert dict(u.tiers) == {"device": 512, "host": 256, "storage": 0}
    assert _u({"meta_info": {"prompt_tokens": 5, "cached_tokens": 2, "cached_tokens_details": None}}).tiers == {}
    v1 = _u(
        {
            "usage": {
                "prompt_tokens": 900,
                "prompt_tokens_details": {"cached_tokens": 640},
                "cached_tokens_details": {"device": 640, "host": 0},
            }
        }
    )
    assert (v1.source, v1.cache_read_tokens, dict(v1.tiers)) == ("sglang", 640, {"device": 640, "host": 0})
    assert cost_usd(u, "engine", "qwen3-32b") is None


def test_llama_cpp_timings() -> None:
    body = {
        "usage": {"prompt_tokens": 1318, "completion_tokens": 4, "prompt_tokens_details": {"cached_tokens": 1120}},
        "timings": {"cache_n": 1120, "prompt_n": 198, "predicted_n": 4},
    }
    u = _u(body)
    assert (u.prompt_tokens, u.cache_read_tokens, u.uncached_tokens, u.source) == (1318, 1120, 198, "llama.cpp")
    alone = _u({"timings": {"cache_n": 10, "prompt_n": 5}})
    assert (alone.prompt_tokens, alone.cache_read_tokens) == (15, 10)


def test_deepseek_hit_and_miss() -> None:
    u = _u(
        {
            "usage": {
                "prompt_tokens": 1000,
                "prompt_cache_hit_tokens": 896,
                "prompt_cache_miss_tokens": 104,
                "completion_tokens": 3,
            }
        }
    )
    assert (u.prompt_tokens, u.cache_read_tokens, u.uncached_tokens, u.source) == (1000, 896, 104, "deepseek")
    # not in the price table: priced as the documented default (gpt-5.4: $2.50 input, $0.25 cached)
    assert cost_usd(u, "openai", "deepseek-chat") == pytest.approx((104 * 2.5 + 896 * 0.25) / 1e6)


def test_sdk_objects_are_read_with_model_dump() -> None:
    anthropic = pytest.importorskip("anthropic")
    openai = pytest.importorskip("openai")
    msg = anthropic.types.Message.model_validate(
        {
            "id": "m",
            "type": "message",
            "role": "assistant",
            "model": "claude-opus-4-8",
            "content": [],
            "stop_reason": "end_turn",
            "stop_sequence": None,
            "usage": {
                "input_tokens": 3,
                "cache_read_input_tokens": 2000,
                "cache_creation_input_tokens": 10,
                "output_tokens": 2,
            },
        }
    )
    assert _u(msg).cache_read_tokens == 2000 and _u(msg.usage).cache_write_tokens == 10
    chat = openai.types.chat.ChatCompletion.model_validate(
        {
            "id": "c",
            "object": "chat.completion",
            "created": 0,
            "model": "gpt-4o",
            "choices": [],
            "usage": {
                "prompt_tokens": 1200,
                "completion_tokens": 1,
                "total_tokens": 1201,
                "prompt_tokens_details": {"cached_tokens": 1024},
            },
            "timings": {"cache_n": 1024, "prompt_n": 176},
        }
    )
    u = _u(chat)
    assert (u.source, u.cache_read_tokens, u.prompt_tokens) == ("llama.cpp", 1024, 1200)  # extra field kept


def test_unreadable_inputs_give_none() -> None:
    for data in (None, 3, "x", {}, {"usage": None}, {"usage": {"foo": 1}}, object()):
        assert normalize_usage(data) is None
    odd = _u({"usage": {"prompt_tokens": "many", "prompt_tokens_details": {"cached_tokens": True}}})
    assert (odd.prompt_tokens, odd.cache_read_tokens) == (0, 0)


def test_unknown_model_is_priced_as_the_default_and_named_once(caplog: pytest.LogCaptureFixture) -> None:
    u = _u({"usage": {"prompt_tokens": 100, "prompt_tokens_details": {"cached_tokens": 0}}})
    with caplog.at_level(logging.WARNING, logger="agentcache"):
        assert cost_usd(u, "openai", "no-such-model-x") == pytest.approx(100 * 2.5 / 1e6)  # gpt-5.4's price
        assert cost_usd(u, "openai", "no-such-model-x") == pytest.approx(100 * 2.5 / 1e6)
        _rules._anthropic_rules.cache_clear()  # asked again after the cache forgot it: still named only once
        assert cost_usd(u, "anthropic", "claude-unknown-x") == pytest.approx(100 * 5.0 / 1e6)  # claude-opus-4-8
        assert not anthropic_rules("claude-unknown-x").known
    named = [r.msg for r in caplog.records if isinstance(r.msg, dict) and r.msg.get("event") == "model.unknown"]
    assert [(m["provider"], m["model"], m["priced_as"]) for m in named] == [
        ("openai", "no-such-model-x", "gpt-5.4"),
        ("anthropic", "claude-unknown-x", "claude-opus-4-8"),
    ]
    assert cost_usd(u, "engine", "anything") is None  # an engine has no prices
    totals = UsageTotals()
    totals.add(u, None)
    totals.add(u, 0.5)
    assert (totals.requests, totals.prompt_tokens, totals.unpriced, totals.cost_usd) == (2, 200, 1, 0.5)
    assert totals.to_dict()["hit_rate"] == 0.0


def test_anthropic_stream_usage_merge() -> None:
    start = {"input_tokens": 5, "cache_read_input_tokens": 4000, "cache_creation_input_tokens": 0, "output_tokens": 1}
    merged = merge_anthropic_usage(start, {"output_tokens": 57, "input_tokens": None})
    assert merged == {**start, "output_tokens": 57}
    assert _u({"usage": merged}).output_tokens == 57


# ---- UsageAccumulator: one stream reader for the wrapper (SDK events) and the proxy (parsed SSE) ----------------

_CHUNK = {"id": "c", "object": "chat.completion.chunk", "created": 0, "model": "m"}
_LLAMA_TIMINGS = {"cache_n": 1120, "prompt_n": 198, "prompt_ms": 40.1, "predicted_n": 4}


def _feed(api: str, *events: Any) -> UsageAccumulator:
    acc = UsageAccumulator(api)
    for event in events:
        acc.add_event(event)
    return acc


def test_accumulator_anthropic_merges_message_start_and_deltas() -> None:
    start = {
        "type": "message_start",
        "message": {"usage": {"input_tokens": 5, "cache_read_input_tokens": 4000, "output_tokens": 1}},
    }
    acc = _feed("anthropic.messages", start, {"type": "content_block_delta", "usage": {"input_tokens": 999}})
    assert acc.usage is not None and acc.usage.cache_read_tokens == 4000 and not acc.ended  # known from the start
    delta = {
        "type": "message_delta",
        "usage": {"output_tokens": 57, "input_tokens": None, "cache_read_input_tokens": 4100},
    }
    acc.add_event(delta)
    acc.add_event({"type": "message_stop"})
    u = acc.usage
    assert u is not None and (u.uncached_tokens, u.cache_read_tokens, u.output_tokens, u.source) == (
        5,
        4100,
        57,
        "anthropic",
    )
    assert acc.ended


def test_accumulator_openai_chat_usage_timings_and_meta_info() -> None:
    usage = {"prompt_tokens": 1300, "completion_tokens": 4, "prompt_tokens_details": {"cached_tokens": 1024}}
    delta = {**_CHUNK, "choices": [{"index": 0, "delta": {"content": "hi"}}], "usage": None}
    plain = _feed("openai.chat", delta, {**_CHUNK, "choices": [], "usage": usage}, delta, "[DONE]")
    assert plain.usage is not None and (plain.usage.source, plain.usage.cache_read_tokens) == ("openai.chat", 1024)
    assert plain.ended  # a later "usage": null does not erase it
    # llama.cpp without include_usage: timings on the final chunk are the only usage
    final = {**_CHUNK, "choices": [{"index": 0, "delta": {}, "finish_reason": "stop"}], "timings": _LLAMA_TIMINGS}
    alone = _feed("openai.chat", delta, final)
    assert alone.usage is not None and not alone.ended
    assert (alone.usage.source, alone.usage.prompt_tokens, alone.usage.cache_read_tokens) == ("llama.cpp", 1318, 1120)
    assert alone.usage.output_tokens == 4
    # with include_usage: timings and a later usage chunk are read together (from_openai_chat(usage, timings))
    both = _feed("openai.chat", final, {**_CHUNK, "choices": [], "usage": usage}).usage
    assert both is not None and (both.source, both.prompt_tokens, both.cache_read_tokens) == ("llama.cpp", 1318, 1120)
    meta = {"prompt_tokens": 900, "cached_tokens": 768, "cached_tokens_details": {"device": 768}}
    sgl = _feed("openai.chat", {**_CHUNK, "choices": [], "meta_info": meta}).usage
    assert sgl is not None and (sgl.source, sgl.cache_read_tokens, dict(sgl.tiers)) == ("sglang", 768, {"device": 768})
    assert _feed("openai.chat", delta, "[DONE]").usage is None


def test_accumulator_openai_responses_terminal_events() -> None:
    usage = {"input_tokens": 1500, "input_tokens_details": {"cached_tokens": 1408}, "output_tokens": 7}
    created = {"type": "response.created", "response": {"status": "in_progress", "usage": None}}
    for kind in sorted(TERMINAL_EVENTS["openai.responses"]):
        acc = _feed("openai.responses", created, {"type": kind, "response": {"usage": usage}})
        assert acc.ended and acc.usage is not None
        assert (acc.usage.source, acc.usage.prompt_tokens, acc.usage.cache_read_tokens) == (
            "openai.responses",
            1500,
            1408,
        )
    assert _feed("openai.responses", created).usage is None and not _feed("openai.responses", created).ended


def test_accumulator_whole_body() -> None:
    acc = UsageAccumulator("openai.chat")
    acc.add_event({**_CHUNK, "choices": [], "usage": {"prompt_tokens": 1}})
    acc.add_body({"usage": {"prompt_tokens": 1318, "completion_tokens": 4}, "timings": _LLAMA_TIMINGS})
    assert acc.usage is not None and (acc.usage.source, acc.usage.cache_read_tokens) == ("llama.cpp", 1120)
    body = UsageAccumulator("anthropic.messages")
    body.add_body({"usage": {"input_tokens": 10, "output_tokens": 1}})
    assert body.usage is not None and (body.usage.source, body.usage.prompt_tokens) == ("anthropic", 10)
    sgl = UsageAccumulator("openai.chat")
    sgl.add_body({"text": "x", "meta_info": {"prompt_tokens": 9, "cached_tokens": 8}})
    assert sgl.usage is not None and sgl.usage.source == "sglang" and not sgl.ended
    odd = UsageAccumulator("openai.chat")
    odd.add_body([1, 2])
    assert odd.usage is None


def test_accumulator_reads_sdk_event_objects() -> None:
    anthropic = pytest.importorskip("anthropic")
    openai = pytest.importorskip("openai")
    message = {"id": "m", "type": "message", "role": "assistant", "model": "claude-opus-4-8", "content": []}
    start = anthropic.types.RawMessageStartEvent.model_validate(
        {
            "type": "message_start",
            "message": {
                **message,
                "stop_reason": None,
                "stop_sequence": None,
                "usage": {"input_tokens": 7, "cache_read_input_tokens": 1200, "output_tokens": 1},
            },
        }
    )
    delta = anthropic.types.RawMessageDeltaEvent.model_validate(
        {"type": "message_delta", "delta": {"stop_reason": "end_turn"}, "usage": {"output_tokens": 3}}
    )
    stop = anthropic.types.RawMessageStopEvent.model_validate({"type": "message_stop"})
    acc = _feed("anthropic.messages", start, delta, stop)
    assert acc.ended and acc.usage is not None
    assert (acc.usage.cache_read_tokens, acc.usage.uncached_tokens, acc.usage.output_tokens) == (1200, 7, 3)

    chunk = openai.types.chat.ChatCompletionChunk.model_validate(
        {**_CHUNK, "choices": [{"index": 0, "delta": {}, "finish_reason": "stop"}], "timings": _LLAMA_TIMINGS}
    )
    assert chunk.usage is None  # the SDK keeps the undeclared `timings`; there is no usage
    assert read_field(chunk, "timings") == _LLAMA_TIMINGS and read_field(chunk, "object") == "chat.completion.chunk"
    assert read_field(chunk, "meta_info") is None and read_field(chunk, "model_dump") is not None  # a method
    u = _feed("openai.chat", chunk).usage
    assert u is not None and (u.source, u.prompt_tokens, u.cache_read_tokens) == ("llama.cpp", 1318, 1120)

    usage = {
        "input_tokens": 1300,
        "input_tokens_details": {"cached_tokens": 1024, "cache_write_tokens": 100},
        "output_tokens": 3,
        "output_tokens_details": {"reasoning_tokens": 0},
        "total_tokens": 1303,
    }
    response = {
        "id": "r",
        "object": "response",
        "created_at": 0,
        "model": "gpt-4o",
        "status": "completed",
        "output": [],
        "parallel_tool_calls": True,
        "tool_choice": "auto",
        "tools": [],
        "usage": usage,
    }
    done = openai.types.responses.ResponseCompletedEvent.model_validate(
        {"type": "response.completed", "sequence_number": 2, "response": response}
    )
    acc = _feed("openai.responses", done)
    assert acc.ended and acc.usage is not None
    assert (acc.usage.cache_read_tokens, acc.usage.cache_write_tokens, acc.usage.uncached_tokens) == (1024, 100, 176)


class _Hostile:
    """An event whose every attribute raises, and whose ``model_dump`` does too."""

    def __getattr__(self, name: str) -> Any:
        raise RuntimeError(name)

    def model_dump(self) -> Any:
        raise RuntimeError("dump")


def test_accumulator_never_raises_on_odd_input() -> None:
    odd: list[Any] = [
        None,
        3,
        "x",
        b"[DONE]",
        [],
        {"type": {}},
        {"type": ["message_stop"]},
        {"type": "message_start", "message": "x"},
        {"type": "message_start", "message": {"usage": 5}},
        {"type": "message_delta", "usage": "many"},
        {"type": "response.in_progress", "response": [1]},
        {"usage": "many", "timings": 5, "meta_info": []},
        {"usage": {"prompt_tokens": "many"}, "timings": {"cache_n": None}},
        _Hostile(),
    ]
    for api in ("anthropic.messages", "openai.chat", "openai.responses", "sglang"):
        acc = _feed(api, *odd)
        assert acc.usage is None or isinstance(acc.usage, CacheUsage)
        assert not acc.ended  # none of these is a terminal event
        acc.add_body(_Hostile())
        assert acc.usage is None
    broken_end = _feed("openai.responses", {"type": "response.completed", "response": [1]})
    assert broken_end.ended and broken_end.usage is None


def test_terminal_events_and_sse_markers_are_per_api() -> None:
    """Each api ends on its own terminal event only, and the proxy's byte-level pre-filter holds exactly the
    markers of those events (every extra marker costs a scan of every line)."""
    assert _feed("anthropic.messages", {"type": "message_stop"}).ended
    assert not _feed("anthropic.messages", {"type": "response.completed"}, "[DONE]").ended
    assert _feed("openai.chat", " [DONE]").ended and not _feed("openai.chat", {"type": "message_stop"}).ended
    assert _feed("sglang", "[DONE]").ended  # any other api ends like Chat
    assert not _feed("openai.responses", "[DONE]", {"type": "response.created"}).ended
    markers = {api: UsageAccumulator(api).sse_end_markers for api in (*TERMINAL_EVENTS, "sglang")}
    assert markers == {
        "anthropic.messages": (b'"message_stop"',),
        "openai.chat": (b"[DONE]",),
        "openai.responses": (b'"response.completed"', b'"response.failed"', b'"response.incomplete"'),
        "sglang": (b"[DONE]",),
    }
    assert set(UsageAccumulator.SSE_USAGE_MARKERS) == {b'"usage"', b'"timings"'}
    acc = UsageAccumulator("openai.chat")
    acc.end()
    assert acc.ended
