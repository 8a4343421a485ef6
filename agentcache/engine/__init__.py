"""The engine cache models: what a self-hosted engine's KV cache reuses, request by request.

One package for every model of an engine's prefix cache, from the coarsest to the most exact, and what they
share (a :class:`Prompt` of token ids, :func:`common_prefix`, page rounding in :meth:`Prompt.page_keys`):

* :class:`EngineSimulator` (:mod:`._unbounded`): one prefix cache shared by every session, unbounded, at
  canonical-block granularity; the bound ``audit`` and the live report simulate for an engine target.
* :class:`LlamaCppCache` (:mod:`._llama`): llama.cpp ``llama-server``'s slots and host-memory prompt cache, fed
  each request's token ids; predicts the ``cached_tokens`` the server reports (``replay``, the proxy's
  ``engine`` arm).
* :class:`TieredRadixCache` (:mod:`._radix`): SGLang's paged radix tree with L1/L2/L3 tiers and LRU,
  session-aware or one-slot eviction; what ``agentcache plan`` sweeps.
* :class:`TokenRenderer` (:class:`LlamaServerRenderer`, :class:`LocalRenderer`; :mod:`._render`): a request
  body → the prompt token ids the engine computes, through the model's own chat template and tokenizer.

Launching an engine is :mod:`agentcache.serve`'s job, not this package's.

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

from ._llama import LlamaCppCache, LlamaPrediction
from ._prompt import Prompt, common_prefix, ids_prompt, shared_prefix
from ._radix import EVICTIONS, Access, TieredRadixCache
from ._render import LlamaServerRenderer, LocalRenderer, TokenRenderer, chat_body
from ._unbounded import EngineSimulator

__all__ = [
    "EVICTIONS",
    "Access",
    "EngineSimulator",
    "LlamaCppCache",
    "LlamaPrediction",
    "LlamaServerRenderer",
    "LocalRenderer",
    "Prompt",
    "TieredRadixCache",
    "TokenRenderer",
    "chat_body",
    "common_prefix",
    "ids_prompt",
    "shared_prefix",
]
