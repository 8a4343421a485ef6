"""Recognise a local engine by asking it: llama.cpp answers ``GET /props`` (``total_slots``); llama.cpp, SGLang
and vLLM name themselves in ``GET /v1/models`` (``data[0].owned_by``: ``llamacpp``, ``sglang``, ``vllm``).

Provider hosts (Anthropic, OpenAI, Azure OpenAI, Bedrock, Vertex) are never probed. :func:`probe` is the blocking
form (standard library only, for the SDK wrappers; answers are remembered per origin for the process) and
:func:`aprobe` the asynchronous one (for the proxy and ``replay``, with their own HTTP client).
"""

from __future__ import annotations

import json
import threading
import time
import urllib.error
import urllib.request
from collections.abc import Awaitable, Callable
from dataclasses import dataclass
from typing import Any
from urllib.parse import urlsplit

from ..model._types import Engine

__all__ = ["PROVIDER_HOSTS", "EngineInfo", "aprobe", "is_provider_host", "origin", "probe"]

#: Hosts (and their subdomains) of the providers: their cache rules apply, nothing to probe.
PROVIDER_HOSTS = ("anthropic.com", "openai.com", "openai.azure.com", "amazonaws.com", "googleapis.com")
_OWNERS = {"llamacpp": Engine.LLAMA_CPP, "llama.cpp": Engine.LLAMA_CPP, "sglang": Engine.SGLANG, "vllm": Engine.VLLM}
_NO_PROXY = urllib.request.build_opener(urllib.request.ProxyHandler({}))


@dataclass(frozen=True, slots=True)
class EngineInfo:
    """What an endpoint said about itself: the ``engine`` (None: not one agentcache recognises), the served
    ``model`` id and llama.cpp's ``slots`` (``total_slots``), each None when not told."""

    engine: Engine | None = None
    model: str | None = None
    slots: int | None = None


def origin(base_url: str) -> str:
    """``scheme://host[:port]`` of ``base_url`` plus its path without a trailing ``/v1`` (where the engine's own
    endpoints live)."""
    url = str(base_url).rstrip("/")
    return url[:-3] if url.endswith("/v1") else url


def is_provider_host(base_url: str | None) -> bool:
    """True for a provider's own API host (or no URL at all: an SDK's default is the provider)."""
    host = (urlsplit(str(base_url or "")).hostname or "").lower()
    return not host or any(host == h or host.endswith("." + h) for h in PROVIDER_HOSTS)


def _read(models: Any, props: Any) -> EngineInfo:
    engine: Engine | None = None
    model: str | None = None
    slots: int | None = None
    data = models.get("data") if isinstance(models, dict) else None
    if isinstance(data, list) and data and isinstance(data[0], dict):
        model = str(data[0].get("id")) if data[0].get("id") is not None else None
        engine = _OWNERS.get(str(data[0].get("owned_by", "")).lower())
    if isinstance(props, dict) and isinstance(props.get("total_slots"), int):
        engine, slots = Engine.LLAMA_CPP, int(props["total_slots"])
    return EngineInfo(engine, model, slots)


def _get_json(url: str, timeout: float) -> Any:
    loopback = (urlsplit(url).hostname or "") in ("127.0.0.1", "localhost", "::1")
    opener = _NO_PROXY if loopback else urllib.request.build_opener()
    try:
        with opener.open(urllib.request.Request(url, headers={"accept": "application/json"}), timeout=timeout) as r:
            return json.loads(r.read(1 << 20)) if r.status == 200 else None
    except (OSError, ValueError, urllib.error.URLError):
        return None


#: Seconds a "not an engine we recognise" answer is remembered: an engine started after the client is still found,
#: and a port the OS hands to another server is asked again. A recognised engine is remembered for the process.
UNKNOWN_TTL = 30.0
_seen: dict[str, tuple[EngineInfo, float]] = {}
_lock = threading.Lock()


def probe(base_url: str, timeout: float = 1.0) -> EngineInfo:
    """Ask the endpoint at ``base_url`` what it is (blocking; at most two GETs of ``timeout`` seconds each). A
    recognised engine is remembered per origin for the process; an unknown answer for :data:`UNKNOWN_TTL` seconds.
    A provider host, an error or an unknown answer gives ``EngineInfo()``."""
    if is_provider_host(base_url):
        return EngineInfo()
    root = origin(base_url)
    now = time.monotonic()
    with _lock:
        hit = _seen.get(root)
    if hit is not None and (hit[0].engine is not None or now - hit[1] < UNKNOWN_TTL):
        return hit[0]
    info = _read(_get_json(root + "/v1/models", timeout), _get_json(root + "/props", timeout))
    with _lock:
        _seen[root] = (info, now)
    return info


async def aprobe(get: Callable[[str], Awaitable[Any]], base_url: str) -> EngineInfo:
    """:func:`probe` without blocking: ``get(url)`` is the caller's HTTP GET returning a response with
    ``status_code`` and ``json()`` (an ``httpx.AsyncClient.get``), or raising on a transport error."""
    if is_provider_host(base_url):
        return EngineInfo()
    root = origin(base_url)

    async def fetch(path: str) -> Any:
        try:
            response = await get(root + path)
            return response.json() if response.status_code == 200 else None
        except Exception:  # any failure to answer means "not an engine we recognise"
            return None

    return _read(await fetch("/v1/models"), await fetch("/props"))


def forget() -> None:
    """Forget the remembered answers (tests)."""
    with _lock:
        _seen.clear()
