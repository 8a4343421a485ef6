"""Keep-warm sending: refresh a session's cached prefix across a pause the TTL would not survive (opt-in).

With ``keep_warm`` on (settings; off by default), after each committed Anthropic Messages turn the proxy asks
the session's pipeline whether prefill-only requests are cheaper than letting the entry expire
(:meth:`~agentcache.session._pipeline.SessionPipeline.keep_warm`: a read refreshes the entry's TTL at 0.1× the input
price, a rewrite costs 1.25×/2×). When they are, it schedules :meth:`~agentcache.session._pipeline.SessionPipeline.
keep_warm_body` (the last request as sent, ``max_tokens: 0``: Anthropic's prompt cache pre-warming, which reads
and writes the cache without generating) at ``first_at`` seconds after the turn and every ``interval`` seconds,
``count`` times at most. Any new request of the session, its close, or the proxy's shutdown cancels what is
pending; each send first checks the session is still at the same turn of the same generation.

The client's auth headers are needed to send on its behalf: they stay in this process's memory, inside the
scheduled task only (never in the shared store, never logged), and are dropped when the task ends.
"""

from __future__ import annotations

import asyncio
import contextlib
import time
from collections.abc import Awaitable, Callable
from typing import Any

import httpx

from .._log import get_logger
from ..model._canonical import dumps
from ..model._usage import CacheUsage, normalize_usage
from ..policies import KeepWarmDecision
from ._errors import failure_reason
from ._transport import UpstreamClient

__all__ = ["KeepWarmer"]

log = get_logger("agentcache.proxy")


class KeepWarmer:
    """Pending keep-warm schedules, one per session key (``tenant/session``).

    ``client()``: the upstream client; ``on_sent(outcome, usage, model)``: accounting for each attempt (``sent``,
    ``failed`` or ``dropped``; usage for a 2xx answer); ``sleep``: injectable for tests.
    """

    def __init__(
        self,
        client: Callable[[], UpstreamClient],
        on_sent: Callable[[str, CacheUsage | None, str], None],
        sleep: Callable[[float], Awaitable[Any]] = asyncio.sleep,
    ) -> None:
        self._client = client
        self._on_sent = on_sent
        self._sleep = sleep
        self._tasks: dict[str, asyncio.Task[None]] = {}

    def __len__(self) -> int:
        return len(self._tasks)

    def cancel(self, key: str) -> None:
        """Drop ``key``'s pending schedule (a new request, or the session closed)."""
        task = self._tasks.pop(key, None)
        if task is not None:
            task.cancel()

    def schedule(
        self,
        key: str,
        decision: KeepWarmDecision,
        url: str,
        headers: list[tuple[bytes, bytes]],
        body: dict[str, Any],
        current: Callable[[], bool],
    ) -> bool:
        """Replace ``key``'s schedule with ``decision`` (returns False when it says not to send). ``current()``
        is checked before each send: False once the session moved on or closed."""
        self.cancel(key)
        if not decision.send or decision.count <= 0:
            return False
        content = dumps(body)
        model = str(body.get("model") or "")
        task = asyncio.create_task(self._run(key, decision, url, headers, content, current, model))
        self._tasks[key] = task
        task.add_done_callback(lambda t: self._tasks.pop(key, None) if self._tasks.get(key) is t else None)
        return True

    async def _run(
        self,
        key: str,
        decision: KeepWarmDecision,
        url: str,
        headers: list[tuple[bytes, bytes]],
        content: bytes,
        current: Callable[[], bool],
        model: str,
    ) -> None:
        start = time.monotonic()
        for k in range(decision.count):
            due = decision.first_at + k * decision.interval
            await self._sleep(max(0.0, due - (time.monotonic() - start)))
            if not current():
                self._on_sent("dropped", None, model)
                return
            outcome, usage, status = "failed", None, None
            try:
                response = await self._client().post(url, headers=headers, content=content)
                status = response.status_code
                if 200 <= status < 300:
                    outcome = "sent"
                    with contextlib.suppress(ValueError):
                        doc = response.json()
                        usage = normalize_usage(doc, "anthropic.messages") if isinstance(doc, dict) else None
            except httpx.HTTPError as exc:
                log.warning("proxy.keep_warm_failed", session_id=key.split("/", 1)[-1], reason=failure_reason(exc))
            self._on_sent(outcome, usage, model)
            log.info(
                "proxy.keep_warm",
                session_id=key.split("/", 1)[-1],
                attempt=k + 1,
                of=decision.count,
                status=status,
                outcome=outcome,
                cache_read_tokens=usage.cache_read_tokens if usage is not None else None,
            )
            if outcome != "sent":
                return  # an upstream that refuses one keep-warm refuses the next: stop, the turn will rewrite

    async def aclose(self) -> None:
        """Cancel every pending schedule and wait for the tasks to end."""
        tasks = list(self._tasks.values())
        self._tasks.clear()
        for task in tasks:
            task.cancel()
        for task in tasks:
            with contextlib.suppress(asyncio.CancelledError):
                await task
