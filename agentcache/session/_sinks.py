"""Lifecycle sinks that ship with agentcache: :class:`SGLangSink` (session-aware caching on SGLang) and
:class:`PrometheusSink` (the turn-level metrics, defined once in :mod:`agentcache.session._metrics` and
re-exported here). A sink is any callable taking a :class:`~agentcache.LifecycleEvent`; see
:mod:`agentcache.session._lifecycle`.
"""

from __future__ import annotations

import asyncio
import importlib
import threading
from collections import OrderedDict
from collections.abc import Awaitable, Callable
from concurrent.futures import Future, ThreadPoolExecutor, wait
from typing import Any
from urllib.parse import urlsplit

from .._exceptions import ConfigError
from .._install import install_hint
from .._log import get_logger
from ..model._fields import LifecycleEvent, SessionSignal
from ._metrics import PrometheusSink

__all__ = ["PrometheusSink", "SGLangSink", "otel_sink"]

log = get_logger("agentcache.session")


def _optional(module: str, user: str) -> Any:
    """Import an optional dependency of a sink; ConfigError with the install hint when it is missing."""
    try:
        return importlib.import_module(module)
    except ImportError:
        raise ConfigError(f"{user} needs {module}: {install_hint('sinks')}") from None


def _origin(url: str | None) -> str | None:
    """``scheme://host:port`` of ``url`` (default ports filled in), or None."""
    if not url:
        return None
    parts = urlsplit(str(url))
    if not parts.hostname:
        return None
    port = parts.port or (443 if parts.scheme == "https" else 80)
    return f"{parts.scheme}://{parts.hostname.lower()}:{port}"


class SGLangSink:
    """Session-aware caching on SGLang (0.5.23, ``--enable-session-radix-cache``): the one SGLang lifecycle path,
    used by the SDK wrappers, the proxy and ``replay`` alike.

    ``annotate`` adds a stable top-level ``session_id`` to every request bound for this server (its
    ``scheme://host:port`` equals ``base_url``'s); one id per generation (``<session_id>`` for
    generation 0, ``<session_id>:g<n>`` after), since SGLang tombstones a closed id. On ``close`` it
    sends ``POST {base_url}/close_session {"session_id"}`` for every id it annotated, so SGLang
    releases the session's references. Errors are logged and dropped (fail open).

    Posting: by default on one background thread with an httpx client (``timeout`` seconds each; ``transport``:
    an httpx transport, for tests); ``flush()`` waits for pending posts, ``shutdown()`` flushes and stops the
    thread. Async code passes ``post``, a coroutine function ``post(path, json) -> status code`` (the proxy's
    upstream client), and posts become tasks on the running loop; ``aflush()`` awaits them.
    ``max_tracked``: ids remembered for closing (oldest dropped first).
    """

    def __init__(
        self,
        base_url: str,
        *,
        timeout: float = 2.0,
        transport: Any = None,
        max_tracked: int = 65_536,
        post: Callable[[str, dict[str, Any]], Awaitable[int]] | None = None,
    ) -> None:
        root = str(base_url).rstrip("/")
        if root.endswith("/v1"):
            root = root[:-3]
        self.base_url = root
        self._origin = _origin(root)
        self._post = post
        self._client: Any = None
        self._pool: ThreadPoolExecutor | None = None
        if post is None:
            httpx = _optional("httpx", "SGLangSink")
            self._client = httpx.Client(base_url=root, timeout=timeout, transport=transport, trust_env=False)
            self._pool = ThreadPoolExecutor(max_workers=1, thread_name_prefix="agentcache-sglang")
        self._lock = threading.Lock()
        self._tracked: OrderedDict[str, None] = OrderedDict()
        self._pending: set[Future[None]] = set()
        self._tasks: set[asyncio.Task[None]] = set()
        self.max_tracked = max_tracked

    @staticmethod
    def sglang_id(signal: SessionSignal) -> str:
        """The ``session_id`` sent to SGLang for this generation of the session."""
        return signal.session_id if signal.generation == 0 else f"{signal.session_id}:g{signal.generation}"

    def annotate(self, body: dict[str, Any], signal: SessionSignal, base_url: str | None) -> dict[str, Any]:
        """``body`` with ``session_id`` when it is bound for this server (a new dict), else ``body``."""
        if base_url is None or _origin(base_url) != self._origin:
            return body
        sid = self.sglang_id(signal)
        with self._lock:
            self._tracked[sid] = None
            self._tracked.move_to_end(sid)
            while len(self._tracked) > self.max_tracked:
                self._tracked.popitem(last=False)
        return {**body, "session_id": sid}

    def __call__(self, event: LifecycleEvent) -> None:
        """On ``close``: post ``/close_session`` for the generation, if it was annotated."""
        if event.event != "close":
            return
        sid = self.sglang_id(event.session_signal)
        with self._lock:
            if self._tracked.pop(sid, False) is False:
                return
            if self._post is not None:
                task = asyncio.get_running_loop().create_task(self._apost_close(sid))
                self._tasks.add(task)
                task.add_done_callback(self._tasks.discard)
                return
            assert self._pool is not None
            future = self._pool.submit(self._post_close, sid)
            self._pending.add(future)
        future.add_done_callback(self._done)

    def _done(self, future: Future[None]) -> None:
        with self._lock:
            self._pending.discard(future)

    def _post_close(self, sid: str) -> None:
        try:
            response = self._client.post("/close_session", json={"session_id": sid})
            if response.status_code >= 400:
                log.warning("sglang.close_session_failed", session_id=sid, status=response.status_code)
        except Exception as exc:  # fail open: the engine just keeps the references until eviction
            log.warning("sglang.close_session_failed", session_id=sid, error=type(exc).__name__, detail=str(exc))

    async def _apost_close(self, sid: str) -> None:
        assert self._post is not None
        try:
            status = await self._post("/close_session", {"session_id": sid})
            if status >= 400:
                log.warning("sglang.close_session_failed", session_id=sid, status=status)
        except Exception as exc:  # fail open: the engine just keeps the references until eviction
            log.warning("sglang.close_session_failed", session_id=sid, error=type(exc).__name__, detail=str(exc))

    def flush(self, timeout: float | None = None) -> None:
        """Wait up to ``timeout`` seconds for pending ``/close_session`` posts (thread mode)."""
        with self._lock:
            pending = set(self._pending)
        wait(pending, timeout=timeout)

    async def aflush(self, timeout: float | None = None) -> None:
        """Wait up to ``timeout`` seconds for pending ``/close_session`` posts (both modes)."""
        if self._tasks:
            await asyncio.wait(set(self._tasks), timeout=timeout)
        if self._pending:
            await asyncio.get_running_loop().run_in_executor(None, self.flush, timeout)

    def shutdown(self) -> None:
        """Flush, stop the worker thread and close the HTTP client (thread mode)."""
        if self._pool is not None:
            self._pool.shutdown(wait=True)
        if self._client is not None:
            self._client.close()


def otel_sink() -> Callable[[LifecycleEvent], None]:
    """The OpenTelemetry sink (setting ``otel``; imported only then); ConfigError with the install hint when the
    ``otel`` extra is missing."""
    try:
        from ._otel import OtelSink
    except ImportError as exc:
        raise ConfigError(f"the otel setting needs OpenTelemetry ({exc.name}): {install_hint('otel')}") from None
    return OtelSink()
