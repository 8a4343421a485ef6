"""Proxy configuration: one frozen :class:`ProxyConfig`, from arguments, ``AGENTCACHE_PROXY_*`` environment
variables and the ``[proxy]`` table of the TOML file given with ``--config`` (the same file's ``[agentcache]``
table holds the pipeline :class:`~agentcache._config.Settings`).

Precedence: explicit arguments > environment > file > the ``DEFAULT_*`` constants below.
"""

from __future__ import annotations

import importlib.util
import ipaddress
import os
from collections.abc import Mapping
from pathlib import Path
from typing import Any, Literal
from urllib.parse import urlsplit

from pydantic import Field, ValidationError, ValidationInfo, field_validator
from pydantic_settings import BaseSettings, SettingsConfigDict

from .._config import build, invalid, read_toml
from .._exceptions import ConfigError
from .._install import install_hint
from ..model._types import parse_engine

__all__ = [
    "DEFAULT_MAX_BODY_BYTES",
    "UPSTREAMS",
    "ProxyConfig",
    "cores_available",
    "is_loopback",
    "load_proxy_config",
    "worker_count",
]

#: Named upstreams and their origins.
UPSTREAMS: dict[str, str] = {"anthropic": "https://api.anthropic.com", "openai": "https://api.openai.com"}
DEFAULT_HOST = "127.0.0.1"
DEFAULT_PORT = 8787
#: Largest request body the proxy reads for the three pipeline routes (413 above it).
DEFAULT_MAX_BODY_BYTES = 32 * 1024 * 1024
DEFAULT_CONNECT_TIMEOUT = 10.0
#: Seconds between two bytes from the upstream (a long generation streams; a silent one times out).
DEFAULT_READ_TIMEOUT = 600.0
DEFAULT_WRITE_TIMEOUT = 60.0
DEFAULT_POOL_TIMEOUT = 30.0
DEFAULT_MAX_CONNECTIONS = 1000
DEFAULT_MAX_KEEPALIVE = 200
#: Seconds an idle upstream connection stays pooled: below the 5 s keep-alive timeout of llama.cpp's server
#: (cpp-httplib ``CPPHTTPLIB_KEEPALIVE_TIMEOUT_SECOND``), uvicorn and Node, so the proxy drops it first.
DEFAULT_KEEPALIVE_EXPIRY = 4.0
#: Seconds the proxy's server keeps an idle client connection open: above the idle expiry of common clients' pools
#: (httpx, under the Anthropic and OpenAI Python SDKs: 5 s; Node's undici: 4 s; aiohttp: 15 s; Go's net/http and
#: Rust's hyper/reqwest, under Codex: 90 s), so the client always closes first. Equal to a client's expiry, the
#: server's close can cross a request the client sends on the connection it still thinks open (that request is lost).
DEFAULT_SERVER_KEEPALIVE = 120
#: Seconds a client may take to send a request's line and headers once it began (and a new connection its first
#: byte): a trickling client holds no connection for ever (nginx ``client_header_timeout``: 60 s).
DEFAULT_HEADER_TIMEOUT = 30.0
#: Seconds the proxy waits for the next chunk of a request body (408 after; nginx ``client_body_timeout``: 60 s).
DEFAULT_BODY_TIMEOUT = 60.0
#: Server processes on the one port. One by default: sessions live in the process that serves them unless they are
#: shared through Redis, so more than one needs ``redis_url`` (a session's turns land on any worker).
DEFAULT_WORKERS = 1
#: Connection pools the upstream transport spreads requests over (see ``_transport.py``).
DEFAULT_UPSTREAM_POOLS = 8
#: A session with no request for this long is closed (reason ``idle``).
DEFAULT_IDLE_TIMEOUT = 3600.0
DEFAULT_SWEEP_INTERVAL = 30.0
DEFAULT_MAX_SESSIONS = 10_000
DEFAULT_MAX_TOMBSTONES = 50_000
#: Memory budget of one process (estimated): live sessions, prefix index, tombstones, live report, key planners.
#: Over it, the least recently active sessions are evicted.
DEFAULT_MAX_STATE_MB = 256
#: A request resuming a session with its history rewritten must begin with this many of its messages.
DEFAULT_MIN_INNER_MATCH = 2
#: ``record_dir``: a recording file is rotated before it grows past this many MiB ...
DEFAULT_RECORD_MAX_MB = 64.0
#: ... and the oldest files are deleted while all of them hold more than this many MiB.
DEFAULT_RECORD_MAX_TOTAL_MB = 1024.0


def is_loopback(host: str) -> bool:
    """True for ``localhost`` and loopback addresses (admin endpoints then need no token)."""
    if host in ("localhost", ""):
        return host == "localhost"
    try:
        return ipaddress.ip_address(host.strip("[]")).is_loopback
    except ValueError:
        return False


class ProxyConfig(BaseSettings):
    """Everything ``agentcache proxy`` needs; every field is also ``AGENTCACHE_PROXY_<NAME>``.

    ``upstream``: ``anthropic``, ``openai`` or a base URL (a trailing ``/v1`` is dropped: paths are forwarded
    as the client sent them). ``engine``: the local engine behind ``upstream`` (``sglang``, ``llama.cpp``,
    ``vllm``; aliases such as ``llama`` accepted; ``none``: resolved per request, a URL upstream is asked what it
    is at start-up): sessions then get the engine target (repairs only). ``sglang`` adds ``session_id`` to
    forwarded bodies and posts ``/close_session`` on close. ``redis_url``: share sessions between replicas
    (default: in memory).
    ``admin_token``: required by ``/metrics`` (always when set; when unset it is served on loopback binds only)
    and by the all-tenant views of ``/agentcache/v1/report`` (a caller always sees its own tenant; without a
    token nobody sees the others). ``tenant_salt``: keys the hash of callers' API keys (tenants).
    ``max_body_bytes``: the largest request body on every path, pipeline or relayed (413 beyond).
    ``simulate``: run the provider simulators on live traffic for the ``as_sent``/``agentcache`` arms.
    ``server_keepalive``/``header_timeout``/``body_timeout``: the server side's own timeouts, in seconds (an idle
    client connection; a request's line and headers; between two chunks of a request body).
    ``max_sessions``/``max_state_mb``: live sessions kept per process, by count and by estimated memory.
    ``upstream_client``: the HTTP client to the upstream: ``aiohttp`` (:mod:`agentcache.proxy._aiotransport`, the
    faster), ``httpx`` (httpcore's pools, :mod:`agentcache.proxy._transport`) or ``auto`` (aiohttp when installed).
    ``workers``: server processes sharing the port (:mod:`agentcache.proxy._workers`; ``"auto"``: one per core
    available); more than one shares ``redis_url``, or a private ``redis-server`` :func:`~agentcache.proxy.serve`
    runs.
    ``record_dir``: write every pipeline request to JSONL files there, for ``agentcache audit``
    (:mod:`agentcache.proxy._record`; the files hold prompts); ``record_max_mb``: rotate a file before it grows past
    this; ``record_max_total_mb``: delete the oldest files while all hold more (at least ``record_max_mb``).
    """

    model_config = SettingsConfigDict(env_prefix="AGENTCACHE_PROXY_", extra="ignore", frozen=True)

    def __init__(self, *args: Any, **values: Any) -> None:
        """Read ``values``, then the environment. Raises ConfigError (a ValueError) naming each bad option, where
        it can come from, its value and what is expected."""
        try:
            super().__init__(*args, **values)
        except ValidationError as exc:
            raise invalid(exc, "AGENTCACHE_PROXY_") from None

    upstream: str = "anthropic"
    engine: str = "none"
    host: str = DEFAULT_HOST
    port: int = Field(default=DEFAULT_PORT, ge=0, le=65535)
    max_body_bytes: int = Field(default=DEFAULT_MAX_BODY_BYTES, gt=0)
    connect_timeout: float = Field(default=DEFAULT_CONNECT_TIMEOUT, gt=0)
    read_timeout: float = Field(default=DEFAULT_READ_TIMEOUT, gt=0)
    write_timeout: float = Field(default=DEFAULT_WRITE_TIMEOUT, gt=0)
    pool_timeout: float = Field(default=DEFAULT_POOL_TIMEOUT, gt=0)
    max_connections: int = Field(default=DEFAULT_MAX_CONNECTIONS, gt=0)
    max_keepalive: int = Field(default=DEFAULT_MAX_KEEPALIVE, ge=0)
    keepalive_expiry: float = Field(default=DEFAULT_KEEPALIVE_EXPIRY, gt=0)
    upstream_pools: int = Field(default=DEFAULT_UPSTREAM_POOLS, ge=1)
    upstream_client: Literal["auto", "aiohttp", "httpx"] = "auto"
    server_keepalive: int = Field(default=DEFAULT_SERVER_KEEPALIVE, gt=0)
    header_timeout: float = Field(default=DEFAULT_HEADER_TIMEOUT, gt=0)
    body_timeout: float = Field(default=DEFAULT_BODY_TIMEOUT, gt=0)
    idle_timeout: float = Field(default=DEFAULT_IDLE_TIMEOUT, gt=0)
    sweep_interval: float = Field(default=DEFAULT_SWEEP_INTERVAL, gt=0)
    max_sessions: int = Field(default=DEFAULT_MAX_SESSIONS, gt=0)
    max_state_mb: int = Field(default=DEFAULT_MAX_STATE_MB, gt=0)
    max_tombstones: int = Field(default=DEFAULT_MAX_TOMBSTONES, gt=0)
    min_inner_match: int = Field(default=DEFAULT_MIN_INNER_MATCH, ge=1)
    admin_token: str | None = None
    redis_url: str | None = None
    workers: int = Field(default=DEFAULT_WORKERS, ge=1)
    redis_prefix: str = "agentcache"
    redis_timeout: float = Field(default=0.5, gt=0)
    tenant_salt: str = "agentcache-tenant-v1"
    simulate: bool = True
    report_max_sessions: int = Field(default=10_000, gt=0)
    report_max_records: int = Field(default=2_000, gt=0)
    record_dir: Path | None = None
    record_max_mb: float = Field(default=DEFAULT_RECORD_MAX_MB, gt=0)
    record_max_total_mb: float = Field(default=DEFAULT_RECORD_MAX_TOTAL_MB, gt=0)

    @field_validator("engine")
    @classmethod
    def _check_engine(cls, value: str) -> str:
        if value.strip().lower() in ("none", ""):
            return "none"
        return parse_engine(value).value  # ConfigError (a ValueError) lists the choices

    @field_validator("upstream")
    @classmethod
    def _check_upstream(cls, value: str) -> str:
        if value in UPSTREAMS:
            return value
        parts = urlsplit(value)
        if parts.scheme not in ("http", "https") or not parts.hostname:
            raise ValueError(f"expected {' or '.join(UPSTREAMS)}, or an http(s) URL such as http://127.0.0.1:30000")
        return value.rstrip("/")

    @field_validator("record_max_total_mb")
    @classmethod
    def _check_record_total(cls, value: float, info: ValidationInfo) -> float:
        per_file = info.data.get("record_max_mb")
        if per_file is not None and value < per_file:
            raise ValueError(f"expected at least record_max_mb ({per_file:g}): the file being written is kept")
        return value

    @field_validator("upstream_client")
    @classmethod
    def _check_upstream_client(cls, value: str) -> str:
        if value == "aiohttp" and importlib.util.find_spec("aiohttp") is None:
            raise ValueError(f"aiohttp is not installed ({install_hint('proxy')}), or choose httpx or auto")
        return value

    @field_validator("workers", mode="before")
    @classmethod
    def _worker_count(cls, value: Any) -> Any:
        return worker_count(value) if isinstance(value, str) else value

    @property
    def upstream_url(self) -> str:
        """The upstream origin (plus any base path), without a trailing ``/`` or ``/v1``."""
        url = UPSTREAMS.get(self.upstream, self.upstream)
        return url[:-3] if url.endswith("/v1") else url

    @property
    def upstream_kind(self) -> str:
        """``anthropic``, ``openai`` or ``url``."""
        return self.upstream if self.upstream in UPSTREAMS else "url"

    @property
    def upstream_is_loopback(self) -> bool:
        """True when the upstream host is a loopback address (then proxy env vars are ignored)."""
        return is_loopback(urlsplit(self.upstream_url).hostname or "")


def cores_available() -> int:
    """The cores this process may run on (its CPU affinity where the OS has one, else the machine's)."""
    return len(os.sched_getaffinity(0)) if hasattr(os, "sched_getaffinity") else os.cpu_count() or 1


def worker_count(value: str) -> int:
    """A ``workers`` value given as text: ``N`` (at least 1) or ``auto`` (:func:`cores_available`).
    Raises ValueError for anything else."""
    if value.strip().lower() == "auto":
        return cores_available()
    try:
        n = int(value)
    except ValueError:
        n = 0
    if n < 1:
        raise ValueError(f"a number of processes (1 or more) or auto, not {value!r}")
    return n


def load_proxy_config(path: str | Path | None = None, **overrides: Any) -> ProxyConfig:
    """Config from ``path``'s ``[proxy]`` table, the environment and ``overrides`` (None values are ignored).
    Raises ConfigError for an unreadable file or an invalid value."""
    data: dict[str, Any] = {}
    if path is not None:
        raw = read_toml(path)
        table = raw.get("proxy", {})
        if not isinstance(table, dict):
            raise ConfigError(f"{path}: [proxy] must be a table")
        data = dict(table)
        unknown = sorted(set(data) - set(ProxyConfig.model_fields))
        if unknown:
            from .._config import Settings

            hint = [k for k in unknown if k in Settings.model_fields]
            where = f" ({', '.join(hint)}: a pipeline setting, it goes under [agentcache])" if hint else ""
            raise ConfigError(f"{path}: unknown [proxy] option(s) {', '.join(unknown)}{where}")
    given = {k: v for k, v in overrides.items() if v is not None}
    return build(ProxyConfig, data, path=path, table="proxy", overrides=given, flags=True)


def unknown_env(environ: Mapping[str, str]) -> list[str]:
    """``AGENTCACHE_PROXY_*`` variables in ``environ`` that name no proxy option (pydantic ignores them)."""
    known = {f"AGENTCACHE_PROXY_{name.upper()}" for name in ProxyConfig.model_fields}
    return sorted(k for k in environ if k.upper().startswith("AGENTCACHE_PROXY_") and k.upper() not in known)
