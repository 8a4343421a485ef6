"""``agentcache proxy``: a drop-in HTTP proxy in front of provider APIs and engines.

Clients change only their base URL (``ANTHROPIC_BASE_URL=http://127.0.0.1:8787``,
``OPENAI_BASE_URL=http://127.0.0.1:8787/v1``). ``/v1/messages``, ``/v1/chat/completions`` and ``/v1/responses``
go through the session pipeline (repairs, breakpoints, routing keys); every other path is relayed untouched.
Needs the ``proxy`` extra (starlette, uvicorn, httpx, prometheus-client; ``redis`` for shared state).
"""

from __future__ import annotations

from ._app import create_app
from ._config import ProxyConfig, load_proxy_config
from ._serve import serve
from ._state import ProxyState

__all__ = ["ProxyConfig", "ProxyState", "create_app", "load_proxy_config", "serve"]
