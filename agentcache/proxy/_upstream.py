"""Which HTTP client carries requests to the upstream: :func:`make_transport` builds aiohttp's
(:class:`~agentcache.proxy._aiotransport.AiohttpTransport`) or httpcore's
(:class:`~agentcache.proxy._transport.ShardedTransport`) transport from the proxy's settings (``upstream_client``).
Both sit behind ``httpx.AsyncBaseTransport``, so the rest of the proxy and the tests' mock transports see one
interface. ``auto`` picks aiohttp when it is installed (the ``proxy`` extra has it) and httpx otherwise (and for an
environment proxy that is not HTTP(S), which aiohttp cannot use)."""

from __future__ import annotations

import importlib.util
from collections.abc import Callable

import httpx

from ._config import ProxyConfig
from ._transport import ShardedTransport, env_proxy

__all__ = ["client_name", "make_transport"]


def client_name(config: ProxyConfig) -> str:
    """``aiohttp`` or ``httpx``: the client ``config.upstream_client`` selects (``aiohttp`` asked for and not
    installed is refused when the config is made: ``ProxyConfig``'s check)."""
    if config.upstream_client == "auto":
        return "aiohttp" if importlib.util.find_spec("aiohttp") is not None else "httpx"
    return config.upstream_client


def make_transport(config: ProxyConfig, on_stale: Callable[[str], None] | None = None) -> httpx.AsyncBaseTransport:
    """The transport to ``config``'s upstream with its limits; no environment proxy or TLS settings for a local
    engine (a loopback upstream). ``on_stale(action)`` counts stale-connection actions."""
    limits = httpx.Limits(
        max_connections=config.max_connections,
        max_keepalive_connections=config.max_keepalive,
        keepalive_expiry=config.keepalive_expiry,
    )
    trust_env = not config.upstream_is_loopback
    proxy = env_proxy(config.upstream_url) if trust_env else None
    # aiohttp speaks to HTTP(S) proxies only; a SOCKS one (ALL_PROXY=socks5://...) stays with httpx
    if client_name(config) == "aiohttp" and (proxy is None or proxy.startswith(("http://", "https://"))):
        from ._aiotransport import AiohttpTransport  # imports aiohttp: only when it is the one used

        return AiohttpTransport(limits, proxy=proxy, trust_env=trust_env, on_stale=on_stale)
    return ShardedTransport(config.upstream_pools, limits, on_stale=on_stale, proxy=proxy, trust_env=trust_env)
