"""The live report's ``engine`` arm: what a llama.cpp upstream should read from cache for each forwarded request,
predicted exact to the token (:mod:`agentcache.engine`), beside the ``reported`` arm's real counts.

Off the request path and failing open: the proxy hands each committed request to :meth:`EngineArm.submit`
(a bounded queue; a full queue drops the request from the arm, counted in :attr:`EngineArm.dropped`), and one
background task renders it with the upstream's own ``/apply-template`` and ``/tokenize`` and feeds the
:class:`~agentcache.engine.LlamaCppCache` (slots from ``/props`` ``total_slots``; the server's defaults for the
rest). The proxy does not read the generated text, so a reply is assumed to come back verbatim in the next
request that extends its slot (``LlamaCppCache.end(..., echoed=True)``), as agents send it. Requests are fed in
the order they finish, one at a time: with concurrent requests the arm may pick other slots than the server.
An upstream that cannot render (no ``/apply-template``) turns the arm off.
"""

from __future__ import annotations

import asyncio
import contextlib
from collections.abc import Mapping
from typing import Any

import httpx

from .._log import get_logger
from ..analysis._report import ArmMetrics
from ..engine import LlamaCppCache, LlamaServerRenderer
from ..model._usage import CacheUsage
from ..simulate import SimUsage

__all__ = ["ENGINE_ARM", "EngineArm"]

log = get_logger("agentcache.proxy")

ENGINE_ARM = "engine"
#: Requests waiting to be predicted; beyond, new ones are left out of the arm.
MAX_PENDING = 256
#: Tokens the modelled host-memory prompt cache keeps (~36 B each as Python ints: ~9 MB). The server's own limit
#: is in bytes (``--cache-ram``, 8 GiB by default) and usually holds more, so a long-running arm may predict less
#: than the server restores from it.
RAM_LIMIT_TOKENS = 262_144
#: Bytes per session's arm metrics (one ``ArmMetrics`` and its key): an upper estimate.
SESSION_BYTES = 400


class EngineArm:
    """Predicted cached tokens per session and in total (see the module docstring). ``base_url``: the
    llama.cpp server; ``client``: an ``httpx.AsyncClient`` based there (tests); ``cache``: the model to feed
    (default: built from ``/props`` on first use)."""

    def __init__(
        self,
        base_url: str,
        *,
        client: httpx.AsyncClient | None = None,
        cache: LlamaCppCache | None = None,
        max_sessions: int = 10_000,
    ) -> None:
        self.base_url = base_url
        self._client = client
        self.cache = cache
        self.max_sessions = max_sessions
        self.sessions: dict[str, ArmMetrics] = {}
        self.total = ArmMetrics()
        self.dropped = 0
        self.enabled = True
        self._queue: asyncio.Queue[tuple[str, str, dict[str, Any], CacheUsage | None]] = asyncio.Queue(MAX_PENDING)
        self._worker: asyncio.Task[None] | None = None
        self._renderer: LlamaServerRenderer | None = None

    def submit(self, session: str, api: str, body: Mapping[str, Any], usage: CacheUsage | None) -> None:
        """Queue one committed request (its session key, wire format, the body as sent, the reported usage)."""
        if not self.enabled:
            return
        try:
            self._queue.put_nowait((session, api, dict(body), usage))
        except asyncio.QueueFull:
            self.dropped += 1
            return
        if self._worker is None or self._worker.done():
            try:
                self._worker = asyncio.get_running_loop().create_task(self._run())
            except RuntimeError:  # no event loop (a synchronous caller): nothing to run it on
                self.enabled = False

    async def _setup(self) -> LlamaServerRenderer:
        if self._client is None:
            self._client = httpx.AsyncClient(base_url=self.base_url, timeout=30.0, trust_env=False)
        if self.cache is None:
            slots = 1
            with contextlib.suppress(Exception):  # an old server without /props: one slot
                response = await self._client.get("/props")
                slots = int(response.json().get("total_slots") or 1)
            self.cache = LlamaCppCache(slots=max(1, slots), ram_limit_tokens=RAM_LIMIT_TOKENS)
        return LlamaServerRenderer(client=self._client)

    async def _run(self) -> None:
        while not self._queue.empty():
            session, api, body, usage = self._queue.get_nowait()
            try:
                if self._renderer is None:
                    self._renderer = await self._setup()
                await self._predict(self._renderer, session, api, body, usage)
            except httpx.HTTPStatusError as exc:  # an upstream without /apply-template or /tokenize
                log.info("proxy.engine_arm_off", status=exc.response.status_code, path=exc.request.url.path)
                self.enabled = False
                return
            except Exception:  # fail open: the arm stops, traffic goes on
                log.warning("proxy.engine_arm_off", exc_info=True)
                self.enabled = False
                return

    async def _predict(
        self, renderer: LlamaServerRenderer, session: str, api: str, body: dict[str, Any], usage: CacheUsage | None
    ) -> None:
        assert self.cache is not None
        ids = await renderer.render(api, body)
        slot = body.get("id_slot")
        prediction = self.cache.begin(ids, slot if isinstance(slot, int) and slot >= 0 else None)
        generated = usage.output_tokens if usage is not None and usage.output_tokens else 0
        self.cache.end(prediction.slot, (), generated, echoed=True)
        read = prediction.cached_tokens if prediction.slot is not None else 0
        result = SimUsage(prediction.prompt_tokens, read, 0, prediction.prompt_tokens - read, 0.0)
        self.total.add(result)
        metrics = self.sessions.get(session)
        if metrics is None:
            if len(self.sessions) >= self.max_sessions:  # keep the most recent sessions
                self.sessions.pop(next(iter(self.sessions)))
            metrics = self.sessions[session] = ArmMetrics()
        metrics.add(result)

    def estimated_bytes(self) -> int:
        """Estimated bytes held: per-session metrics and the modelled token ids (36 B each as Python ints)."""
        held = self.cache.tokens_held if self.cache is not None else 0
        return len(self.sessions) * SESSION_BYTES + held * 36

    async def drain(self, timeout: float = 30.0) -> None:
        """Wait until every queued request is predicted (tests, shutdown)."""
        if self._worker is not None:
            with contextlib.suppress(Exception):
                await asyncio.wait_for(asyncio.shield(self._worker), timeout)

    async def aclose(self) -> None:
        """Stop the worker and close the HTTP client."""
        if self._worker is not None:
            self._worker.cancel()
            with contextlib.suppress(BaseException):
                await self._worker
        if self._client is not None:
            await self._client.aclose()
