"""Who is calling, the proxy's side of session identity: tenants from API keys, and the
:class:`~agentcache.session.Identity` of a request from its headers and body (the precedence and the prefix index
are the session core's: :mod:`agentcache.session._identity`).

**Tenants.** Every session lives in the namespace of the caller's API key (``x-api-key``, ``api-key``, or an
``Authorization: Bearer`` token), hashed with a salt: one tenant can never see, match or close another's session.
The key itself is never stored or logged.
"""

from __future__ import annotations

from collections.abc import Mapping
from hashlib import blake2b
from typing import Any
from urllib.parse import quote

from ..adapters import wire_for
from ..model._bounded import bounded
from ..model._types import Api
from ..session import LOCAL_TENANT, Identity, declared_by

__all__ = ["ANONYMOUS", "client_of", "header_value", "identity_of", "tenant_of"]

ANONYMOUS = LOCAL_TENANT
_KEY_HEADERS = ("x-api-key", "api-key")


def tenant_of(headers: Mapping[str, str], salt: str) -> str:
    """The tenant of a request: a salted 16-hex-digit hash of its API key, or ``anonymous`` without one."""
    key = next((headers[h] for h in _KEY_HEADERS if headers.get(h)), None)
    if key is None:
        auth = headers.get("authorization", "")
        scheme, _, token = auth.partition(" ")
        key = token.strip() if scheme.lower() == "bearer" and token.strip() else None
    if key is None:
        return ANONYMOUS
    return blake2b(key.encode(), digest_size=8, key=salt.encode()[:64]).hexdigest()


def client_of(headers: Mapping[str, str]) -> str | None:
    """Which client sent a request, for the live page: the agent its headers declare (``claude-code``, ``codex``,
    ``opencode``...), else the product of its ``user-agent`` (``anthropic-python``, cut to 40 characters), else None."""
    declared = declared_by(headers)
    if declared is not None:
        return declared.client
    agent = headers.get("user-agent", "").split("/")[0].split(" ")[0].strip()
    return agent[:40] or None


def identity_of(api: Api, headers: Mapping[str, str], body: Mapping[str, Any], tenant: str) -> Identity:
    """Who a proxied request belongs to: ``x-agentcache-session`` / ``x-agentcache-parent``, else what the client
    declares (:func:`agentcache.session.declared_by`: Claude Code, Codex, opencode headers), else the OpenAI
    ``prompt_cache_key``, else the prefix index."""
    sid = bounded((headers.get("x-agentcache-session") or "").strip()) or None
    parent = bounded((headers.get("x-agentcache-parent") or "").strip()) or None
    key = wire_for(api).routing_key(body)
    declared = declared_by(headers)
    return Identity(
        tenant,
        sid,
        parent,
        bounded(key) if isinstance(key, str) and key else None,
        infer=True,
        declared=declared.session if declared is not None else None,
        declared_parent=declared.parent if declared is not None else None,
        declared_lineage=declared is not None and declared.lineage,
    )


#: Characters a header value keeps as they are: visible ASCII (RFC 9110 §5.5 ``VCHAR``) except ``%``.
_HEADER_SAFE = "".join(chr(c) for c in range(0x21, 0x7F) if c != 0x25)


def header_value(text: str) -> bytes:
    """``text`` as a valid HTTP field value (RFC 9110 §5.5; uvicorn refuses control characters).

    Encoding: every character other than visible ASCII (``!``..``~``), and ``%`` itself, is percent-encoded as
    its UTF-8 bytes (RFC 3986 §2.1), spaces and tabs included; a lone surrogate (valid in a JSON string, no
    Unicode character) as its ``surrogatepass`` bytes. ``urllib.parse.unquote(value, errors="surrogatepass")``
    gives ``text`` back; a session id from a client's ``prompt_cache_key`` may hold anything. Never raises."""
    return quote(text, safe=_HEADER_SAFE, errors="surrogatepass").encode("ascii")
