"""``agentcache replay``: send recorded sessions to a real endpoint and measure what its cache did.

Any format :func:`agentcache.loaders.load` reads; bodies are converted to the target wire format (OpenAI Chat ⇄
Anthropic Messages, Responses → Chat, or SGLang ``/generate`` token ids). Sessions run in parallel (bounded),
each session's requests in order, streaming; each config reports requests completed, errors, prompt and cached
tokens as the server reported them, TTFT p50/p95/p99 and total time. This is the tool for comparing no cache /
engine prefix cache / tiered cache on the same traffic. On a llama.cpp endpoint each turn also gets
``predicted_cached_tokens``: the engine model's prediction (:mod:`agentcache.engine`, the server's own template
and tokenizer), and the result a ``prediction`` summary against what the server reported.

Library use::

    from agentcache.loaders import load
    from agentcache.replay import ReplayConfig, replay

    records = load("data/tau-bench/gpt-4o-airline.json").records
    result = replay(records, ReplayConfig("http://127.0.0.1:30000", concurrency=4, via="agentcache", max_turns=3))
    print(result.completed, result.cached_tokens, result.ttft(50))
"""

from __future__ import annotations

from ._client import TurnResult
from ._convert import TARGET_APIS, convert, to_token_ids
from ._report import ReplayResult, markdown_table, percentile, render_table
from ._runner import ReplayConfig, detect_endpoint, group_sessions, replay, run_replay

__all__ = [
    "TARGET_APIS",
    "ReplayConfig",
    "ReplayResult",
    "TurnResult",
    "convert",
    "detect_endpoint",
    "group_sessions",
    "markdown_table",
    "percentile",
    "render_table",
    "replay",
    "run_replay",
    "to_token_ids",
]
