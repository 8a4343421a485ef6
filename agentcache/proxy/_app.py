"""The starlette app: one route per wire endpoint, the admin and lifecycle endpoints, and a catch-all that
relays every other path untouched.

=============================================  =================================================================
route                                          served by
=============================================  =================================================================
``POST /v1/messages``                          pipeline (``anthropic.messages``)
``POST /v1/chat/completions``                  pipeline (``openai.chat``)
``POST /v1/responses``                         pipeline (``openai.responses``)
``POST /agentcache/v1/sessions/{id}/close``    close the caller's session ``id`` (namespaced by its API key; an
                                               id holding ``/`` is sent percent-encoded, ``%2F``)
``GET /agentcache/v1/report``                  live report, audit JSON schema: the caller's own tenant; all
                                               tenants or another one with the admin token
``GET /agentcache/``                           the live report as a page that updates itself (same tenant rules;
                                               :mod:`agentcache.proxy._live_page`)
``GET /agentcache/v1/health``                  the proxy's own health, for load balancers (no token)
``GET /metrics``                               Prometheus text format (admin token when one is set; else loopback)
anything else under ``/agentcache/``           404, or 405 for a known path (never relayed); so is any other
                                               spelling of the namespace (``//agentcache``, ``/METRICS``...)
anything else                                  relayed as is: method, headers, body streamed both ways
=============================================  =================================================================

Every path is normalised once, as the upstream reads it, before routing (:mod:`agentcache.proxy._boundary`, which
also bounds the wait for a request body's next chunk). Who may read what: :mod:`agentcache.proxy._admin`. An
exception that escapes a handler before its response started is agentcache's own bug: it is answered with a 500 in
the caller's format, counted and logged; a stream the upstream cut is broken for the client, counted once by its
route (as the status the client got, ``stream_cut``), and is no bug.
"""

from __future__ import annotations

import contextlib
import json
import os
from collections.abc import AsyncIterator, Callable
from functools import partial
from typing import Any

import httpx
from prometheus_client import CONTENT_TYPE_LATEST
from starlette.applications import Starlette
from starlette.requests import Request
from starlette.responses import JSONResponse, RedirectResponse, Response
from starlette.routing import BaseRoute, Route

from .._config import Settings
from ..session import StoreUnavailable
from ._admin import NAMESPACE_ROUTE, PathRoute, close_route, metrics_denied, namespace_answer, report_tenant
from ._boundary import own_path
from ._caller import tenant_of
from ._config import ProxyConfig
from ._core import handle_api, relay
from ._entry import Endpoint, ProxyApp
from ._errors import ROUTES, style_for
from ._forward import UpstreamStreamError
from ._live_page import live_page, worker_label
from ._state import ProxyState

__all__ = ["create_app"]

_ALL_METHODS = ["GET", "HEAD", "POST", "PUT", "PATCH", "DELETE", "OPTIONS"]


def _in_namespace(path: str) -> dict[str, str] | None:
    """Paths that are agentcache's own however they are spelt, whatever the method: never relayed
    (:func:`~agentcache.proxy._boundary.own_path`)."""
    return {} if own_path(path) else None


def _hot_routes(apis: dict[str, Endpoint], passthrough: Endpoint) -> Callable[[str, str], Endpoint | None]:
    """The entry's choice of hot routes (:class:`~agentcache.proxy._entry.ProxyApp`), the same endpoint starlette's
    router would pick: a pipeline route's ``POST``; any other method starlette routes on any path outside the
    namespace is relayed. A path ending in a newline is left to starlette (its patterns' ``$`` matches before one)."""

    def hot(method: str, path: str) -> Endpoint | None:
        if method == "POST" and (api := apis.get(path)) is not None:
            return api
        if method in _ALL_METHODS and not path.endswith("\n") and not own_path(path):
            return passthrough
        return None

    return hot


def create_app(
    config: ProxyConfig | None = None,
    *,
    settings: Settings | None = None,
    transport: httpx.AsyncBaseTransport | None = None,
    store: Any = None,
) -> ProxyApp:
    """The proxy as an ASGI app (:class:`~agentcache.proxy._entry.ProxyApp`: starlette behind one plain entry).
    ``app.state.proxy`` is its :class:`ProxyState`; the lifespan starts and stops it (in-process tests without a
    lifespan use ``async with app.state.proxy.running():``). ``transport``: the upstream client's httpx transport
    (tests inject a ``MockTransport``)."""
    state = ProxyState(config or ProxyConfig(), settings=settings, transport=transport, store=store)

    apis: dict[str, Endpoint] = {path: partial(handle_api, state, api=api, route=path) for path, api in ROUTES.items()}

    async def metrics(request: Request) -> Response:
        denied = metrics_denied(state, request)
        if denied is not None:
            return denied
        return Response(state.metrics.render(), media_type=CONTENT_TYPE_LATEST)

    async def report(request: Request) -> Response:
        tenant, denied = report_tenant(state, request)
        if denied is not None:
            return denied
        doc = state.report.to_dict(tenant)
        headers = {"x-agentcache-tenant": tenant or "*"}  # which view this is (tenant ids are hex or "anonymous")
        if (worker := worker_label(state)) is not None:  # each worker's own view: say whose
            doc["worker"] = {"pid": os.getpid(), "workers": state.config.workers, "note": worker}
            headers["x-agentcache-worker"] = str(os.getpid())
        return Response(json.dumps(doc, indent=2).encode(), media_type="application/json", headers=headers)

    async def page(request: Request) -> Response:
        return live_page(state, request)

    async def to_page(request: Request) -> Response:  # the live page's address as people type it
        return RedirectResponse("/agentcache/", status_code=308)

    async def close(request: Request) -> Response:
        sid = request.path_params["session_id"]
        tenant = tenant_of(request.headers, state.config.tenant_salt)
        try:
            sess = await state.close(tenant, sid, "closed")
        except StoreUnavailable as exc:
            state.fail_open("close", exc)
            return JSONResponse({"session_id": sid, "closed": False, "error": "session store unavailable"}, 503)
        body: dict[str, Any] = {"session_id": sid, "closed": sess is not None}
        if sess is not None:
            body["generation"] = sess.generation
        return JSONResponse(body, status_code=200 if sess is not None else 404)

    async def health(request: Request) -> Response:
        # For load balancers: no token needed, nothing about sessions. A store that does not answer leaves
        # the proxy serving (fail open), so it is "degraded", still 200.
        store_ok = await state.store_ok()
        body = {
            "status": "ok" if store_ok else "degraded",
            "store": "redis" if state.config.redis_url else "memory",
            "store_ok": store_ok,
        }
        return JSONResponse(body)

    async def passthrough(request: Request) -> Response:
        return await relay(state, request)

    own: list[BaseRoute] = [
        close_route(close),
        Route("/agentcache/v1/report", report, methods=["GET"]),
        Route("/agentcache/", page, methods=["GET"]),
        Route("/agentcache", to_page, methods=["GET"]),
        Route("/agentcache/v1/health", health, methods=["GET"]),
        Route("/metrics", metrics, methods=["GET"]),
    ]

    async def namespace(request: Request) -> Response:
        return namespace_answer(state, request, own)

    async def unhandled(request: Request, exc: Exception) -> Response:
        # Starlette's outermost middleware calls this before re-raising (so the traceback is still logged).
        if isinstance(exc, UpstreamStreamError):  # raised to break the client's stream: counted once, in the route
            return Response(status_code=502)  # never sent: the response had started
        state.fail_open("unhandled", exc)
        path = request.url.path
        route = path if path in ROUTES else NAMESPACE_ROUTE if path.startswith("/agentcache/") else "passthrough"
        style = style_for(path, state.config.upstream_kind, request.headers)
        return state.own_error(route, state.config.upstream_kind, style, 500, "agentcache failed on this request")

    routes: list[BaseRoute] = [Route(path, apis[path], methods=["POST"], name=api) for path, api in ROUTES.items()]
    routes += own
    routes += [
        PathRoute(_in_namespace, namespace, methods=_ALL_METHODS, name="namespace"),
        PathRoute(lambda path: {}, passthrough, methods=_ALL_METHODS, name="passthrough"),
    ]
    hot = _hot_routes(apis, passthrough)

    @contextlib.asynccontextmanager
    async def lifespan(app: Starlette) -> AsyncIterator[None]:
        async with state.running():
            yield

    app = ProxyApp(hot=hot, unhandled=unhandled, body_timeout=state.config.body_timeout, routes=routes,
                   lifespan=lifespan)  # fmt: skip
    app.state.proxy = state
    return app
