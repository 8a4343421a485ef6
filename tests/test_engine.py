"""The llama.cpp slot model's rules, each against the server-source behaviour it copies (see
agentcache/engine/_llama.py), and the local renderer on a real ``tokenizers`` tokenizer."""

from __future__ import annotations

import asyncio
import json
from pathlib import Path

import pytest

from agentcache.engine import LlamaCppCache, LocalRenderer, common_prefix

A = list(range(100, 200))  # a 100-token prompt
B = list(range(500, 600))  # another, sharing nothing with A


def test_common_prefix() -> None:
    assert common_prefix([1, 2, 3], [1, 2, 4]) == 2
    assert common_prefix([1, 2], [1, 2, 3]) == 2
    assert common_prefix([], [1]) == 0 and common_prefix([5] * 1000, [5] * 999 + [6]) == 999


def test_an_extension_reuses_the_slot_and_the_generated_tokens_but_the_last() -> None:
    cache = LlamaCppCache(slots=1)
    first = cache.begin(A)
    assert (first.slot, first.cached_tokens, first.prompt_tokens) == (0, 0, 100)
    cache.end(0, [7, 8, 9], 3)  # three sampled: the last is never decoded
    assert cache.slot_tokens(0) == (*A, 7, 8)
    second = cache.begin([*A, 7, 8, 9, 10])  # the next prompt carries the generated reply on
    assert second.cached_tokens == 102
    cache.end(0, [], 0)
    assert cache.begin([*A, 7, 8, 9, 10]).cached_tokens == 103  # the whole prompt cached: one token re-evaluated


def test_unused_slots_go_last_first_and_similarity_picks_the_matching_slot() -> None:
    cache = LlamaCppCache(slots=3)
    assert cache.begin(A).slot == 2  # every slot never used: the LRU scan keeps the last of the ties
    cache.end(2)
    assert cache.begin(B).slot == 1  # no similarity to A: least recently used (never used) of 0 and 1
    cache.end(1)
    again = cache.begin([*A, 1, 2])
    assert (again.slot, again.cached_tokens) == (2, 100)


def test_below_the_similarity_threshold_lru_and_the_prompt_cache_decide() -> None:
    cache = LlamaCppCache(slots=1)
    cache.begin(A)
    cache.end(0)
    cache.begin(B)  # evicts A from the slot into the host-memory prompt cache
    cache.end(0)
    assert cache.cached_prompts >= 1
    back = cache.begin([*A, 5])
    assert back.loaded and back.cached_tokens == 100  # restored from the prompt cache
    without = LlamaCppCache(slots=1, prompt_cache=False)
    for prompt in (A, B):
        without.begin(prompt)
        without.end(0)
    assert without.begin([*A, 5]).cached_tokens == 0


def test_a_pinned_slot_and_a_busy_one() -> None:
    cache = LlamaCppCache(slots=2)
    assert cache.begin(A, id_slot=0).slot == 0
    assert cache.begin(B, id_slot=0).slot is None  # busy: the server defers it
    assert cache.begin(B).slot == 1


def test_kv_unified_clears_idle_slots_into_the_prompt_cache() -> None:
    cache = LlamaCppCache(slots=2, kv_unified=True)
    cache.begin(A)
    cache.end(1)
    cache.begin(B)  # slot 0 (LRU); slot 1 is idle: saved and cleared
    assert cache.slot_tokens(1) == ()
    cache.end(0)
    assert cache.begin([*A, 3]).cached_tokens == 100  # LRU slot, A loaded from the prompt cache


def test_a_rejected_request_leaves_the_cache_as_it_was() -> None:
    cache = LlamaCppCache(slots=1)
    cache.begin(A)
    cache.end(0)
    refused = cache.begin(B)
    cache.reject(refused)
    assert cache.slot_tokens(0) == tuple(A) and cache.begin([*A, 1]).cached_tokens == 100


def test_the_prompt_cache_token_limit_drops_the_oldest() -> None:
    cache = LlamaCppCache(slots=1, ram_limit_tokens=150, cache_idle_slots=False)
    for prompt in (A, B, [9] * 60):
        cache.begin(prompt)
        cache.end(0)
    assert cache.cached_prompts == 1  # A went first to make room for B
    assert cache.begin([*A, 1]).cached_tokens == 0


def test_local_renderer_renders_the_template_and_tokenizes(tmp_path: Path) -> None:
    tokenizers = pytest.importorskip("tokenizers")
    from tokenizers import models, pre_tokenizers, trainers

    tok = tokenizers.Tokenizer(models.BPE(unk_token="<unk>"))
    tok.pre_tokenizer = pre_tokenizers.ByteLevel(add_prefix_space=False)
    trainer = trainers.BpeTrainer(special_tokens=["<unk>", "<s>", "<|im_start|>", "<|im_end|>"], vocab_size=300)
    tok.train_from_iterator(["hello world, the tools come first", "user assistant system"] * 20, trainer)
    tok.save(str(tmp_path / "tokenizer.json"))
    template = (
        "{% if tools %}<|im_start|>tools\n{% for t in tools %}{{ t | tojson }}\n{% endfor %}<|im_end|>\n{% endif %}"
        "{% for m in messages %}<|im_start|>{{ m.role }}\n{{ m.content }}<|im_end|>\n{% endfor %}"
        "{% if add_generation_prompt %}<|im_start|>assistant\n{% endif %}"
    )
    (tmp_path / "tokenizer_config.json").write_text(json.dumps({"chat_template": template, "bos_token": "<s>"}))
    renderer = LocalRenderer(tmp_path, add_bos=True)
    body = {"model": "m", "messages": [{"role": "user", "content": "hello world"}]}
    text = renderer.prompt("openai.chat", body)
    assert text == "<|im_start|>user\nhello world<|im_end|>\n<|im_start|>assistant\n"
    ids = asyncio.run(renderer.render("openai.chat", body))
    assert ids[0] == tok.token_to_id("<s>") and ids[1] == tok.token_to_id("<|im_start|>")
    tools = [{"type": "function", "function": {"name": "f", "parameters": {}}}]
    with_tools = renderer.render_sync("openai.chat", {**body, "tools": tools})
    assert with_tools[:2] == ids[:2] and len(with_tools) > len(ids)  # tools first: the prefix changes after BOS
    anthropic = {"model": "m", "max_tokens": 5, "messages": [{"role": "user", "content": "hello world"}]}
    assert renderer.render_sync("anthropic.messages", anthropic) == ids


def test_unknown_generated_tokens_are_taken_from_the_prompt_that_echoes_the_reply() -> None:
    cache = LlamaCppCache(slots=1)
    cache.begin(A)
    cache.end(0, [], 4, echoed=True)  # four sampled, ids unknown: three stay in the slot
    assert cache.begin([*A, 1, 2, 3, 4, 5]).cached_tokens == 103
    cache.end(0, [], 4, echoed=True)
    cache.begin(B)  # a prompt that does not extend the slot settles nothing
    assert cache.slot_tokens(0) == tuple(B)
