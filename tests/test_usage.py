"""Usage normalisation into ``CacheUsage`` (every provider and engine format, dicts and SDK objects) and cost."""

from __future__ import annotations

from typing import Any

import pytest

from agentcache import CacheUsage, UsageTotals, cost_usd, normalize_usage
from agentcache.model._usage import merge_anthropic_usage


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
    # 1.25x for the 5m part, 2x for the 1h part, 0.1x reads, at $3/MTok
    assert cost_usd(u, "anthropic", "claude-sonnet-4-5") == pytest.approx((12 + 500 + 125 + 400) * 3 / 1e6)


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
    assert cost_usd(u, "openai", "deepseek-chat") is None  # not in the price table


def test_sdk_objects_are_read_with_model_dump() -> None:
    anthropic = pytest.importorskip("anthropic")
    openai = pytest.importorskip("openai")
    msg = anthropic.types.Message.model_validate(
        {
            "id": "m",
            "type": "message",
            "role": "assistant",
            "model": "claude-sonnet-4-5",
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


def test_unknown_model_has_no_cost_and_totals_count_it() -> None:
    u = _u({"usage": {"prompt_tokens": 100, "prompt_tokens_details": {"cached_tokens": 0}}})
    assert cost_usd(u, "openai", "no-such-model") is None
    assert cost_usd(u, "anthropic", "claude-unknown") is None
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
