"""Reported cache usage, normalised into one :class:`CacheUsage`, and its input-side cost.

Every provider and engine reports prompt-cache reuse in its own fields; all are read into the same
shape, in tokens (``prompt_tokens = cache_read_tokens + cache_write_tokens + uncached_tokens``):

================  =========================================================================================
source            fields read (wire names)
================  =========================================================================================
``anthropic``     ``usage.input_tokens`` (the uncached remainder), ``cache_creation_input_tokens``,
                  ``cache_creation.ephemeral_5m_input_tokens`` / ``ephemeral_1h_input_tokens``,
                  ``cache_read_input_tokens`` (Messages API "Prompt caching"; llama.cpp's ``/v1/messages``
                  uses the same fields)
``openai.chat``   ``usage.prompt_tokens`` (whole prompt), ``prompt_tokens_details.cached_tokens``,
                  ``cache_write_tokens`` (top level or in ``prompt_tokens_details``, when present)
``litellm``       LiteLLM's OpenAI-form ``usage`` of an Anthropic call: ``prompt_tokens`` (whole prompt),
                  ``prompt_tokens_details.cached_tokens`` / ``cache_read_input_tokens`` and the Anthropic-only
                  ``cache_creation_input_tokens`` (docs.litellm.ai/docs/completion/prompt_caching)
``openai.responses``  ``usage.input_tokens`` (whole prompt), ``input_tokens_details.cached_tokens``
``sglang``        ``meta_info.prompt_tokens`` / ``cached_tokens`` / ``cached_tokens_details``
                  ``{device, host, storage}`` (``/generate``), or ``cached_tokens_details`` beside the
                  OpenAI usage fields (``/v1`` with ``--enable-cache-report``)
``llama.cpp``     ``timings.cache_n`` (reused) and ``timings.prompt_n`` (processed) of ``llama-server``
``deepseek``      ``usage.prompt_cache_hit_tokens`` / ``prompt_cache_miss_tokens``
================  =========================================================================================

Inputs may be plain dicts or SDK response objects (read with ``model_dump()`` where present, so
fields the SDK does not declare, such as llama.cpp's ``timings``, are kept). Reading is tolerant:
a missing or ``null`` field counts as 0; a body with no recognisable usage gives None.
:class:`~agentcache.model._usage_stream.UsageAccumulator` reads a streamed response event by event (the one
reader behind both the wrapper's SDK streams and the proxy's SSE tap).

The price of usage is the target's (:meth:`agentcache.targets.Target.cost`, :func:`agentcache.cost_usd`);
totals over many requests are in :mod:`agentcache.model._totals`.
"""

from __future__ import annotations

from typing import Any

from ..adapters import usage_wire
from ._usage_read import CacheUsage, as_dict, read_field, read_usage, served_by

__all__ = [
    "CacheUsage",
    "as_dict",
    "normalize_usage",
    "read_field",
    "served_by",
]


def normalize_usage(data: Any, api: str | None = None) -> CacheUsage | None:
    """Normalise a response body, or its ``usage`` alone, into a :class:`CacheUsage`.

    ``data``: a dict or SDK object (a whole response, a ``usage`` object, an SGLang ``meta_info``,
    or llama.cpp ``timings``). ``api``: the response's wire API (``anthropic.messages``, ``openai.chat``,
    ``openai.responses``; another reads as Chat) when known: its wire's usage shape settles the one ambiguous shape
    (``input_tokens`` alone); None sniffs it. Returns None when no usage is present. A whole response also gives
    its ``id`` (``response_id``) and the provider's cache-miss ``diagnosis`` (Anthropic ``diagnostics``, OpenAI
    ``prompt_cache_diagnostics``). Never raises on odd input.
    """
    return read_usage(data) if api is None else usage_wire(api).read_usage(data)
