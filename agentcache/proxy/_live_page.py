"""``GET /agentcache/``: the live report as a page (:mod:`agentcache.analysis._html_live` draws it with the HTML
audit report's templates and charts). The same tenant rules as ``/agentcache/v1/report``
(:func:`~._admin.report_tenant`): a caller sees its own tenant (the API key its browser sends; ``anonymous``
without one), the admin token every tenant or ``?tenant=`` one. A browser cannot send a header when it opens a
page, so the page's script reads the admin token from the address's fragment (``#token=...``: never sent to the
server, so never in an access log) and sends it on each poll (``?fragment=1``: the page's content alone, swapped in
every two seconds). The page loads nothing else: a Content-Security-Policy allows only its own inline style, its
script (by nonce) and requests to the proxy itself.
"""

from __future__ import annotations

import os
import secrets

from starlette.requests import Request
from starlette.responses import HTMLResponse, Response

from ..analysis._html_live import render_live
from ._admin import report_tenant
from ._state import ProxyState

__all__ = ["POLL_MS", "live_page", "worker_label"]

#: How often the page asks for fresh content, milliseconds.
POLL_MS = 2000


def live_page(state: ProxyState, request: Request) -> Response:
    """The page, or with ``?fragment=1`` its content alone; a refusal as ``/agentcache/v1/report`` gives it."""
    tenant, denied = report_tenant(state, request)
    if denied is not None:
        return denied
    nonce = secrets.token_urlsafe(16)
    fragment = request.query_params.get("fragment") == "1"
    worker = worker_label(state)
    html = render_live(
        state.report.report(tenant), tenant, fragment=fragment, poll_ms=POLL_MS, nonce=nonce, worker=worker
    )
    csp = (
        f"default-src 'none'; script-src 'nonce-{nonce}'; style-src 'unsafe-inline'; connect-src 'self'; "
        "img-src data:; base-uri 'none'; form-action 'none'; frame-ancestors 'none'"
    )
    headers = {"x-agentcache-tenant": tenant or "*", "cache-control": "no-store", "content-security-policy": csp}
    if worker is not None:
        headers["x-agentcache-worker"] = str(os.getpid())
    return HTMLResponse(html, headers=headers)


def worker_label(state: ProxyState) -> str | None:
    """With several worker processes (``--workers N``), which one answers, for the live page and report: each
    keeps its own live report (docs/proxy.md, "Several workers"), so two polls may show two views. None with one."""
    workers = state.config.workers
    if workers <= 1:
        return None
    return (
        f"pid {os.getpid()}, one of {workers}: this page shows the sessions this worker served "
        "(/metrics counts every worker)"
    )
