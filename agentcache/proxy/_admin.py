"""Who may see what on the proxy's own endpoints, and agentcache's own URL namespace.

**The live report** (``GET /agentcache/v1/report``, and the live page) is per tenant: a caller sees its own
tenant's sessions, breaks, misses and totals, its tenant being the same salted hash of its API key that namespaces
its sessions (:func:`~agentcache.proxy._caller.tenant_of`; ``anonymous`` without a key, the namespace every
keyless caller shares). All tenants at once, or ``?tenant=`` naming another tenant, need the admin token. Without
a configured token, a caller with no key (a browser) of a proxy bound to loopback sees every tenant, as
``/metrics`` serves them there: the person at the machine, whose agents send keys; beyond loopback, nobody gets
them. Otherwise the caller is judged by the key it sends, so a reverse proxy in front changes nothing (set a token).

**/metrics** carries no tenant, session id or client-chosen string (``model`` labels are price-table names, see
:func:`~agentcache.session._metrics.model_label`), but its totals add up every tenant's traffic. So it is
treated as an all-tenant view: with an admin token configured it needs the token; without one it is served only
while the proxy is bound to loopback (set a token whenever anything, a local reverse proxy included, can forward
other people's requests to it).

The admin token goes in ``x-agentcache-admin-token`` or ``Authorization: Bearer`` (a bearer that is not the
token is the caller's API key, i.e. its tenant).

**The namespace.** Nothing under ``/agentcache/`` (nor a non-GET ``/metrics``) is ever relayed upstream with the
caller's credentials: a known path with another method is a 405, anything else a 404, in the caller's error
format.
"""

from __future__ import annotations

import hmac
from collections.abc import Callable
from typing import Any

from starlette.requests import Request
from starlette.responses import Response
from starlette.routing import BaseRoute, Match, Route
from starlette.types import Scope

from ._caller import ANONYMOUS, tenant_of
from ._config import is_loopback
from ._errors import style_for
from ._state import ProxyState

__all__ = [
    "NAMESPACE_ROUTE",
    "PathRoute",
    "admin_status",
    "close_route",
    "metrics_denied",
    "namespace_answer",
    "report_tenant",
]

#: The metric ``route`` label of agentcache's own endpoints' refusals.
NAMESPACE_ROUTE = "agentcache"


def admin_status(state: ProxyState, request: Request) -> bool | None:
    """True when ``request`` carries the configured admin token, None when ``x-agentcache-admin-token`` is
    present but wrong, else False (always False when no token is configured)."""
    token = state.config.admin_token
    if not token:
        return False
    got = request.headers.get("x-agentcache-admin-token")
    if got is not None:
        return True if hmac.compare_digest(got.encode(), token.encode()) else None
    scheme, _, value = request.headers.get("authorization", "").partition(" ")
    bearer = value.strip() if scheme.lower() == "bearer" else ""
    return bool(bearer) and hmac.compare_digest(bearer.encode(), token.encode())


def _refuse(state: ProxyState, request: Request, status: int, message: str) -> Response:
    style = style_for(request.url.path, state.config.upstream_kind, request.headers)
    return state.own_error(NAMESPACE_ROUTE, state.config.upstream_kind, style, status, message)


def metrics_denied(state: ProxyState, request: Request) -> Response | None:
    """None when ``request`` may read ``/metrics`` (module docstring), else the 401/403 response."""
    if state.config.admin_token:
        return None if admin_status(state, request) else _refuse(state, request, 401, "admin token required")
    if not _open_on_loopback(state):
        message = "/metrics is disabled: the proxy is bound beyond loopback and no admin token is set"
        return _refuse(state, request, 403, message)
    return None


def report_tenant(state: ProxyState, request: Request) -> tuple[str | None, Response | None]:
    """``(tenant, None)``: the tenant whose report ``request`` may read (None: all tenants); or ``(None,
    refusal)``. See the module docstring."""
    admin = admin_status(state, request)
    if admin is None:
        return None, _refuse(state, request, 401, "admin token invalid")
    wanted = request.query_params.get("tenant")
    own = tenant_of(request.headers, state.config.tenant_salt)
    if admin or (own == ANONYMOUS and _open_on_loopback(state)):
        # A keyless caller (a browser) of a loopback proxy without a token is the person at this machine: every
        # tenant, as /metrics serves them (their agents send keys, so their sessions are never anonymous).
        return wanted, None
    if wanted is not None and wanted != own:
        return None, _refuse(state, request, 403, "another tenant's report needs the admin token")
    return own, None


def _open_on_loopback(state: ProxyState) -> bool:
    """No admin token configured and bound to loopback: the all-tenant views are the local user's."""
    return not state.config.admin_token and is_loopback(state.config.host)


def namespace_answer(state: ProxyState, request: Request, known: list[BaseRoute]) -> Response:
    """The answer for a request in agentcache's namespace that no endpoint serves: 405 (with ``Allow``) when
    one of ``known`` serves its path with other methods, else 404."""
    allowed: set[str] = set()
    for route in known:
        match, _ = route.matches(request.scope)
        if match == Match.PARTIAL:
            allowed.update(getattr(route, "methods", None) or ())
    if allowed:
        response = _refuse(state, request, 405, f"method {request.method} not allowed here")
        response.headers["allow"] = ", ".join(sorted(allowed))
        return response
    return _refuse(state, request, 404, f"no agentcache endpoint at {request.url.path}")


class PathRoute(Route):
    """A route matched by a plain function of the path, not by starlette's pattern (whose ``.`` stops at a
    newline: a session id, or any relayed path, may hold one). ``params(path)`` returns the path parameters
    when the route serves ``path``, else None; a method not in ``methods`` is a partial match (405)."""

    def __init__(
        self,
        params: Callable[[str], dict[str, str] | None],
        endpoint: Callable[..., Any],
        *,
        methods: list[str],
        name: str,
    ) -> None:
        super().__init__("/" + name, endpoint, methods=methods, name=name)
        self._params = params

    def matches(self, scope: Scope) -> tuple[Match, Scope]:
        """See the class docstring."""
        if scope["type"] != "http":
            return Match.NONE, {}
        params = self._params(scope["path"])  # the app is never mounted under a root_path
        if params is None:
            return Match.NONE, {}
        child = {"endpoint": self.endpoint, "path_params": {**scope.get("path_params", {}), **params}}
        return (Match.FULL if scope["method"] in (self.methods or ()) else Match.PARTIAL), child


_SESSIONS, _CLOSE = "/agentcache/v1/sessions/", "/close"


def _close_params(path: str) -> dict[str, str] | None:
    if path.startswith(_SESSIONS) and path.endswith(_CLOSE) and len(path) > len(_SESSIONS) + len(_CLOSE):
        return {"session_id": path[len(_SESSIONS) : -len(_CLOSE)]}
    return None


def close_route(endpoint: Callable[..., Any]) -> PathRoute:
    """``POST /agentcache/v1/sessions/{id}/close``: ``id`` is everything between (percent-decoded by the server,
    so ``a%2Fb`` is the id ``a/b``)."""
    return PathRoute(_close_params, endpoint, methods=["POST"], name="close")
