"""Recorded requests as the token sequences the planner's radix tree caches
(:class:`~agentcache.engine.Prompt`: one request's token ids, cut into pages by ``page_keys``).

Renderers (``Record -> Prompt``):

* :class:`BlockRenderer` (the default): the core's canonical form (``agentcache.adapters.canonicalize``, one
  :class:`~agentcache.model._build.BlockCache` per session) with the core's token counts (tiktoken ``o200k_base``
  estimates, :mod:`agentcache.model._tokens`). Block ``b`` of ``n`` tokens becomes ``n`` ids derived from its
  digest, so reuse is exact at block granularity and estimated in count: the model's own tokenizer and chat
  template are not applied.
* :class:`ServerRenderer`: the engine model's token renderer (:mod:`agentcache.engine`: a llama-server's own
  chat template and tokenizer through ``/apply-template`` + ``/tokenize``, or a local model directory):
  token-exact for that model.

Any ``Callable[[Record], Prompt]`` can be given instead.
"""

from __future__ import annotations

from array import array
from collections.abc import Callable
from typing import TYPE_CHECKING

from .._exceptions import InputError
from ..engine import Prompt
from ..loaders import Record
from ..model._build import BlockCache
from ..model._tokens import TokenCounter, default_counter

if TYPE_CHECKING:
    from ..engine import TokenRenderer

__all__ = ["BlockRenderer", "Renderer", "ServerRenderer"]

#: Room for the ids of one block: bases are spaced this far apart, so a block of fewer tokens never overlaps.
_SPAN = 1 << 24


Renderer = Callable[[Record], Prompt]


class BlockRenderer:
    """The default renderer (see the module docstring): canonical blocks with tiktoken estimates.

    ``counter``: the token counter (default: the process-wide one). Raises InputError for a body the adapters
    cannot read."""

    name = "tiktoken o200k_base estimates over canonical blocks (not the model's tokenizer or chat template)"

    def __init__(self, counter: TokenCounter | None = None) -> None:
        self._counter = counter if counter is not None else default_counter()
        self._caches: dict[str, BlockCache] = {}

    @property
    def exact(self) -> bool:
        """True when counts are tiktoken's, False when they fall back to bytes / 4."""
        return self._counter.exact

    def __call__(self, record: Record) -> Prompt:
        from ..adapters import canonicalize

        cache = self._caches.setdefault(record.session, BlockCache())
        req = canonicalize(record.api, record.body, counter=self._counter, cache=cache)
        runs = tuple((int.from_bytes(b.digest[:8], "big") * _SPAN, b.tokens) for b in req.blocks if b.tokens > 0)
        return Prompt(runs=runs)


class ServerRenderer:
    """Token-exact prompts from the engine model's renderer (:mod:`agentcache.engine`): a llama-server's own chat
    template and tokenizer at ``url`` (:class:`~agentcache.engine.LlamaServerRenderer`), or any
    :class:`~agentcache.engine.TokenRenderer` given as ``renderer`` (a local model directory:
    :class:`~agentcache.engine.LocalRenderer`). The planner is synchronous, so the renderer's calls run on one
    private event loop. ``timeout`` seconds per server call. Raises InputError (naming the record) when the
    server cannot be reached, refuses a request, or the body cannot be converted to OpenAI Chat.
    """

    def __init__(self, url: str = "", timeout: float = 60.0, *, renderer: TokenRenderer | None = None) -> None:
        import asyncio

        from ..engine import LlamaServerRenderer

        self.url = url.rstrip("/")
        self._loop = asyncio.new_event_loop()
        self._renderer = renderer or LlamaServerRenderer(self.url, timeout=timeout)
        where = f"from {self.url} (/apply-template, /tokenize)" if renderer is None else type(renderer).__name__
        self.name = f"the model's chat template and tokenizer, {where}"

    def __call__(self, record: Record) -> Prompt:
        import httpx

        try:
            tokens = self._loop.run_until_complete(self._renderer.render(record.api, record.body))
        except (httpx.HTTPError, KeyError, TypeError, ValueError) as exc:
            raise InputError(
                f"{self.url or 'renderer'}: {type(exc).__name__}: {exc}", source=record.source, record=record.index
            ) from None
        return Prompt(ids=array("q", tokens))

    def close(self) -> None:
        """Close the renderer's HTTP client and the private event loop."""
        aclose = getattr(self._renderer, "aclose", None)
        if aclose is not None:
            self._loop.run_until_complete(aclose())
        self._loop.close()
