"""The proxy's entry (issue 26, the HTTP floor): the hot routes it serves itself are exactly those starlette's router
would give the same endpoints, and a plain path's namespace check agrees with the full lenient reading."""

from __future__ import annotations

import itertools
from typing import Any

from starlette.routing import Match

from agentcache.proxy._app import create_app
from agentcache.proxy._boundary import own_path
from agentcache.proxy._config import ProxyConfig

_PATHS = [
    *["/v1/messages", "/v1/chat/completions", "/v1/responses", "/v1/messages/count_tokens", "/v1/models", "/"],
    *["/v1/messages\n", "/agentcache/", "/agentcache/v1/report", "/AGENTCACHE/v1/health", "/metrics", "/Metrics/"],
    *["//agentcache/x", "/v1/../agentcache/v1/report", "/agentcache%00/x", "/x/agentcache", "/v1/metrics"],
]
_METHODS = ["GET", "HEAD", "POST", "PUT", "PATCH", "DELETE", "OPTIONS", "TRACE", "PROPFIND"]


def _router_endpoint(app: Any, method: str, path: str) -> Any:
    """The endpoint starlette's router serves ``method path`` with (None: a partial match, its 405)."""
    scope = {"type": "http", "method": method, "path": path, "root_path": "", "headers": []}
    for route in app.router.routes:
        match, _ = route.matches(scope)
        if match == Match.FULL:
            return route.endpoint
    return None


def test_hot_routes_are_the_routers_own_choice() -> None:
    app = create_app(ProxyConfig(upstream_url="http://127.0.0.1:9"))
    hot = 0
    for method, path in itertools.product(_METHODS, _PATHS):
        endpoint = app._hot(method, path)
        if endpoint is not None:  # served by the entry: the very endpoint the router picks
            assert endpoint is _router_endpoint(app, method, path), (method, path)
            hot += 1
    assert hot >= 40  # the pipeline POSTs and every relayed method on the relayed paths


def test_a_plain_path_is_in_the_namespace_as_the_lenient_reading_says() -> None:
    assert own_path("/AgentCache/v1/report") and own_path("/METRICS") and own_path("/agentcache")
    assert own_path("/%61gentcache/") and own_path("/v1/../agentcache/") and own_path("//agentcache")
    assert not own_path("/v1/agentcache") and not own_path("/agentcachex") and not own_path("/v1/messages")
    assert not own_path("/metrics2") and not own_path("/%2561gentcachex")
