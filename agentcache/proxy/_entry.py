"""The proxy's ASGI entry: one plain callable in front of starlette's stack (issue 26, the HTTP floor).

Every HTTP request goes through :class:`ProxyApp.__call__` once: its path normalised
(:func:`~agentcache.proxy._boundary.normalised`), its trace context set (:func:`~agentcache.proxy._trace.
trace_headers`), and one :class:`~agentcache.proxy._boundary.Cycle` (the body read deadline, the ``date`` header).
Then:

* the **hot routes** (a pipeline route's ``POST``, and every relayed request: the proxy's traffic) are served
  here, directly: the endpoint's response is sent, and an exception that escapes before the response started is
  answered with the app's 500 in the caller's format and re-raised (for the server's log), as starlette's
  outermost middleware does;
* everything else (agentcache's own endpoints, its namespace's 404/405, a method no route takes, websocket and
  lifespan events) goes through starlette as before: router, exception middleware and the same 500.

What the hot routes skip is starlette's per-request machinery (its error and exception middleware, the router's
match over every route, the endpoint wrapper), which added ~0.1–0.2 ms of CPU to each relayed request.
"""

from __future__ import annotations

from collections.abc import Awaitable, Callable
from typing import Any

from starlette.applications import Starlette
from starlette.requests import Request
from starlette.responses import Response
from starlette.types import Receive, Scope, Send

from ..session._lifecycle import TRACE_HEADERS
from ._boundary import Cycle, normalised
from ._trace import trace_headers

__all__ = ["Endpoint", "ProxyApp", "Unhandled"]

#: A route's endpoint: the request in, the response to send out.
Endpoint = Callable[[Request], Awaitable[Response]]
#: The answer to an exception that escaped an endpoint (the request, the exception).
Unhandled = Callable[[Request, Exception], Awaitable[Response]]


class ProxyApp(Starlette):
    """The starlette app with the entry of the module docstring in front. ``hot(method, path)``: the endpoint that
    serves a hot route (the path normalised), or None for starlette's routing; ``unhandled``: the answer to an
    exception that escaped an endpoint (also starlette's handler for ``Exception``); ``body_timeout``: seconds a
    request body's next chunk may take (None: no bound). ``starlette``: the app's other arguments (routes,
    lifespan)."""

    def __init__(
        self,
        *,
        hot: Callable[[str, str], Endpoint | None],
        unhandled: Unhandled,
        body_timeout: float | None,
        **starlette: Any,
    ) -> None:
        super().__init__(exception_handlers={Exception: unhandled}, **starlette)
        self._hot = hot
        self._unhandled = unhandled
        self._body_timeout = body_timeout

    async def __call__(self, scope: Scope, receive: Receive, send: Send) -> None:
        """Serve one ASGI event (see the module docstring)."""
        if scope["type"] != "http":
            await super().__call__(scope, receive, send)
            return
        scope = normalised(scope)
        trace = trace_headers(scope)
        token = TRACE_HEADERS.set(trace) if trace is not None else None
        try:
            cycle = Cycle(receive, send, self._body_timeout)
            endpoint = self._hot(scope["method"], scope["path"])
            if endpoint is None:
                await super().__call__(scope, cycle.receive, cycle.send)
            else:
                await self._serve(endpoint, scope, cycle)
        finally:
            if token is not None:
                TRACE_HEADERS.reset(token)

    async def _serve(self, endpoint: Endpoint, scope: Scope, cycle: Cycle) -> None:
        """Serve a hot route: ``endpoint``'s response, or the 500 of an escaped exception (re-raised)."""
        scope["app"] = self
        request = Request(scope, cycle.receive)
        try:
            response = await endpoint(request)
            await response(scope, cycle.receive, cycle.send)
        except Exception as exc:
            answer = await self._unhandled(request, exc)  # counted and logged even when too late to send
            if not cycle.started:
                await answer(scope, cycle.receive, cycle.send)
            raise
