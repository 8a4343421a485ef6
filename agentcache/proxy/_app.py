"""The starlette app: one route per wire endpoint, the admin and lifecycle endpoints, and a catch-all that
relays every other path untouched.

=============================================  =================================================================
route                                          served by
=============================================  =================================================================
``POST /v1/messages``                          pipeline (``anthropic.messages``)
``POST /v1/chat/completions``                  pipeline (``openai.chat``)
``POST /v1/responses``                         pipeline (``openai.responses``)
``POST /agentcache/v1/sessions/{id}/close``    close the caller's session ``id`` (namespaced by its API key)
``GET /agentcache/v1/report``                  live report, audit JSON schema (admin)
``GET /agentcache/v1/health``                  the proxy's own health, for load balancers (no token)
``GET /metrics``                               Prometheus text format (admin)
anything else                                  relayed as is: method, headers, body streamed both ways
=============================================  =================================================================

Admin endpoints need ``Authorization: Bearer <admin token>`` (or ``x-agentcache-admin-token``) whenever an
admin token is configured; without one they are served only when the proxy is bound to loopback.
"""

from __future__ import annotations

import contextlib
import hmac
import json
from collections.abc import AsyncIterator
from typing import Any

import httpx
from prometheus_client import CONTENT_TYPE_LATEST
from starlette.applications import Starlette
from starlette.requests import Request
from starlette.responses import JSONResponse, Response
from starlette.routing import Route

from .._config import Settings
from ..session import StoreUnavailable
from ._config import ProxyConfig, is_loopback
from ._core import handle_api, relay
from ._errors import ROUTES
from ._sessions import tenant_of
from ._state import ProxyState

__all__ = ["create_app"]

_ALL_METHODS = ["GET", "HEAD", "POST", "PUT", "PATCH", "DELETE", "OPTIONS"]


def _admin_denied(state: ProxyState, request: Request) -> Response | None:
    """None when ``request`` may use an admin endpoint, else the 401/403 response."""
    token = state.config.admin_token
    if token:
        got = request.headers.get("x-agentcache-admin-token")
        if got is None:
            scheme, _, value = request.headers.get("authorization", "").partition(" ")
            got = value.strip() if scheme.lower() == "bearer" else None
        if got is None or not hmac.compare_digest(got.encode(), token.encode()):
            return JSONResponse({"error": "admin token required"}, status_code=401)
        return None
    if not is_loopback(state.config.host):
        message = "admin endpoints are disabled: the proxy is bound beyond loopback and no admin token is set"
        return JSONResponse({"error": message}, status_code=403)
    return None


def create_app(
    config: ProxyConfig | None = None,
    *,
    settings: Settings | None = None,
    transport: httpx.AsyncBaseTransport | None = None,
    store: Any = None,
) -> Starlette:
    """The proxy as an ASGI app. ``app.state.proxy`` is its :class:`ProxyState`; the lifespan starts and
    stops it (in-process tests without a lifespan use ``async with app.state.proxy.running():``).
    ``transport``: the upstream client's httpx transport (tests inject a ``MockTransport``)."""
    state = ProxyState(config or ProxyConfig(), settings=settings, transport=transport, store=store)

    def api_endpoint(path: str, api: str) -> Route:
        async def endpoint(request: Request) -> Response:
            return await handle_api(state, request, api, path)

        return Route(path, endpoint, methods=["POST"], name=api)

    async def metrics(request: Request) -> Response:
        denied = _admin_denied(state, request)
        if denied is not None:
            return denied
        return Response(state.metrics.render(), media_type=CONTENT_TYPE_LATEST)

    async def report(request: Request) -> Response:
        denied = _admin_denied(state, request)
        if denied is not None:
            return denied
        tenant = request.query_params.get("tenant")
        doc = state.report.to_dict(tenant)
        return Response(json.dumps(doc, indent=2).encode(), media_type="application/json")

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

    routes = [api_endpoint(path, api) for path, api in ROUTES.items()]
    routes += [
        Route("/agentcache/v1/sessions/{session_id}/close", close, methods=["POST"]),
        Route("/agentcache/v1/report", report, methods=["GET"]),
        Route("/agentcache/v1/health", health, methods=["GET"]),
        Route("/metrics", metrics, methods=["GET"]),
        Route("/{path:path}", passthrough, methods=_ALL_METHODS),
    ]

    @contextlib.asynccontextmanager
    async def lifespan(app: Starlette) -> AsyncIterator[None]:
        async with state.running():
            yield

    app = Starlette(routes=routes, lifespan=lifespan)
    app.state.proxy = state
    return app
