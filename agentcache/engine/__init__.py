"""The engine model, exact to the token: a request as the engine sees it (its prompt token ids, through the
model's own chat template and tokenizer) and the engine's reuse rules.

* :class:`TokenRenderer` (:class:`LlamaServerRenderer`, :class:`LocalRenderer`): body → prompt token ids; the
  interface a planner calls.
* :class:`LlamaCppCache`: llama.cpp ``llama-server``'s slots and host-memory prompt cache, fed each request's
  token ids; predicts the ``cached_tokens`` the server reports.

SGLang's radix tree (page size, tiers, eviction) lives in :mod:`agentcache.plan`.

Library use::

    from agentcache.engine import LlamaCppCache, LlamaServerRenderer

    renderer = LlamaServerRenderer("http://127.0.0.1:8080")
    cache = LlamaCppCache(slots=2)
    ids = await renderer.render("openai.chat", body)
    prediction = cache.begin(ids)          # .slot, .cached_tokens
    ...                                    # the response generated `generated` token ids
    cache.end(prediction.slot, generated)
"""

from __future__ import annotations

from ._llama import LlamaCppCache, LlamaPrediction, common_prefix
from ._render import LlamaServerRenderer, LocalRenderer, TokenRenderer, chat_body

__all__ = [
    "LlamaCppCache",
    "LlamaPrediction",
    "LlamaServerRenderer",
    "LocalRenderer",
    "TokenRenderer",
    "chat_body",
    "common_prefix",
]
