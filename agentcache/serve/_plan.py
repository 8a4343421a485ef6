"""What ``agentcache serve`` runs, as data: the options, one :class:`ProcessSpec` per child process, and the
:class:`ServePlan` that orders them.

Decide, then execute: the builders in :mod:`._sglang` and :mod:`agentcache.serve.llama` and :func:`build_plan`
only produce frozen records; :mod:`._supervisor` starts them, and ``--dry-run`` prints them. Nothing here
touches a process, a port or the network.

Ports: the public ``--port`` belongs to the front process (the agentcache proxy, else the router, else the only
engine); engines listen on ``port + 1 + i`` and the router (``--workers`` > 1) on ``port + 1 + workers``, all on
127.0.0.1.
"""

from __future__ import annotations

import re
import shlex
from collections.abc import Mapping
from dataclasses import dataclass, field
from pathlib import Path
from typing import Literal

from .._exceptions import ConfigError
from ..model._types import engine_aliases, parse_engine

__all__ = [
    "DEFAULT_MOONCAKE_PORT",
    "DEFAULT_PORT",
    "L2",
    "L3",
    "LOOPBACK",
    "ProcessSpec",
    "ReadyCheck",
    "ServeOptions",
    "ServePlan",
    "parse_l2",
    "parse_l3",
]

Engine = Literal["sglang", "llama.cpp"]
ENGINES: tuple[str, ...] = ("auto", "sglang", "llama.cpp")
LOOPBACK = "127.0.0.1"
#: SGLang's own default port (``fields/serving.py``: ``port = 30000``), kept as the public port.
DEFAULT_PORT = 30000
#: ``mooncake_master``'s default RPC port (Mooncake ``master.cpp``: ``rpc_port`` 50051).
DEFAULT_MOONCAKE_PORT = 50051

_SIZE = re.compile(r"^\s*(\d+(?:\.\d+)?)\s*(?:g|gb|gib)\s*$", re.IGNORECASE)
_RATIO = re.compile(r"^\s*(\d+(?:\.\d+)?)\s*x?\s*$", re.IGNORECASE)


@dataclass(frozen=True, slots=True)
class L2:
    """The host-memory tier (SGLang HiCache L2): a ``ratio`` of the device KV pool, or ``size_gb`` per worker."""

    ratio: float | None = None
    size_gb: float | None = None

    def describe(self) -> str:
        """``ratio 2`` or ``16 GB``."""
        return f"ratio {self.ratio:g}" if self.ratio is not None else f"{self.size_gb:g} GB"


def parse_l2(text: str | None) -> L2 | None:
    """``--l2``: a bare number (or ``2x``) is a ratio of the device KV pool; a number with ``G``/``GB`` is a
    size in GB per worker; ``none``/``0``/empty is no L2. Raises ConfigError otherwise."""
    if text is None or text.strip().lower() in ("", "none", "off", "0"):
        return None
    m = _SIZE.match(text)
    if m:
        size = float(m.group(1))
        if size <= 0:
            raise ConfigError(f"--l2 {text!r}: the size must be positive")
        return L2(size_gb=size)
    m = _RATIO.match(text)
    if m:
        ratio = float(m.group(1))
        if ratio <= 0:
            raise ConfigError(f"--l2 {text!r}: the ratio must be positive")
        return L2(ratio=ratio)
    raise ConfigError(f"--l2 {text!r}: expected a ratio (e.g. 2) or a size in GB (e.g. 16GB)")


@dataclass(frozen=True, slots=True)
class L3:
    """The storage tier: SGLang HiCache L3 ``file`` under ``path``, or ``mooncake`` with ``master``
    (``host:port``; None: agentcache starts ``mooncake_master`` itself); or ``lmcache`` (SGLang
    ``--enable-lmcache`` in place of HiCache) with ``path`` the user's own LMCache config file (None: agentcache
    writes one and starts the ``lmcache server`` daemon itself)."""

    kind: Literal["file", "mooncake", "lmcache"]
    path: Path | None = None
    master: str | None = None

    def describe(self) -> str:
        """``file:/dir``, ``mooncake (own master)``, ``mooncake:host:port``, ``lmcache (own server)`` or
        ``lmcache:CONFIG``."""
        if self.kind == "file":
            return f"file:{self.path}"
        if self.kind == "lmcache":
            return f"lmcache:{self.path}" if self.path else "lmcache (own server)"
        return f"mooncake:{self.master}" if self.master else "mooncake (own master)"


def parse_l3(text: str | None) -> L3 | None:
    """``--l3``: ``none``, ``file:DIR``, ``mooncake[:HOST:PORT]`` or ``lmcache[:CONFIG]``. Raises ConfigError
    otherwise."""
    if text is None or text.strip().lower() in ("", "none", "off"):
        return None
    kind, _, rest = text.strip().partition(":")
    if kind == "file":
        if not rest:
            raise ConfigError("--l3 file needs a directory: --l3 file:/path/to/dir")
        return L3("file", path=Path(rest).expanduser())
    if kind == "mooncake":
        if rest and not re.match(r"^[\w.\-\[\]:]+:\d+$", rest):
            raise ConfigError(f"--l3 {text!r}: the master is HOST:PORT, e.g. mooncake:10.0.0.5:50051")
        return L3("mooncake", master=rest or None)
    if kind == "lmcache":
        return L3("lmcache", path=Path(rest).expanduser() if rest else None)
    raise ConfigError(f"--l3 {text!r}: expected none, file:DIR, mooncake[:HOST:PORT] or lmcache[:CONFIG]")


@dataclass(frozen=True, slots=True)
class ServeOptions:
    """Everything ``agentcache serve`` was asked for.

    ``model``: a Hugging Face id or local directory (SGLang) or a GGUF file (llama.cpp). ``engine``: resolved
    by :meth:`resolved_engine` when ``auto`` (a ``.gguf`` file means llama.cpp, anything else SGLang).
    ``host``/``port``: where clients connect. ``prefix_cache``: False turns the engine's prefix cache off
    (SGLang ``--disable-radix-cache``, llama.cpp ``--no-cache-prompt``), for baselines. ``session_cache``:
    SGLang session-aware eviction. ``page_size``: SGLang page size (default: 64 with HiCache, else SGLang's).
    ``sessions``: concurrent sessions (llama.cpp slots). ``ctx_per_session``: llama.cpp context per slot.
    ``python``: the engine's interpreter (SGLang and ``sglang_router`` run under it, never under ours).
    ``proxy``: put the agentcache proxy in front. ``extra_args``: appended to every engine command line.
    """

    model: str
    engine: str = "auto"
    host: str = LOOPBACK
    port: int = DEFAULT_PORT
    l2: L2 | None = None
    l3: L3 | None = None
    workers: int = 1
    prefix_cache: bool = True
    session_cache: bool = True
    page_size: int | None = None
    sessions: int = 4
    ctx_per_session: int = 8192
    python: str = "python3"
    proxy: bool = True
    extra_args: tuple[str, ...] = ()

    @property
    def resolved_engine(self) -> Engine:
        """``sglang`` or ``llama.cpp`` (``auto``: a ``.gguf`` model file means llama.cpp)."""
        if self.engine.strip().lower() == "auto":
            return "llama.cpp" if self.model.lower().endswith(".gguf") else "sglang"
        try:
            name = parse_engine(self.engine).value  # the one normalisation of engine names (aliases: llama, ...)
        except ConfigError:
            name = ""
        if name == "sglang":
            return "sglang"
        if name == "llama.cpp":
            return "llama.cpp"
        aliases = engine_aliases()
        raise ConfigError(f"--engine {self.engine!r}: expected one of {', '.join(ENGINES)} (aliases: {aliases})")

    def validate(self) -> None:
        """Raise ConfigError for combinations that cannot work, whatever the machine."""
        engine = self.resolved_engine
        if self.workers < 1:
            raise ConfigError(f"--workers must be at least 1, got {self.workers}")
        if not 0 < self.port < 65536 - self.workers - 2:
            raise ConfigError(f"--port {self.port} is out of range")
        if self.sessions < 1:
            raise ConfigError(f"--sessions must be at least 1, got {self.sessions}")
        if not self.prefix_cache and (self.l2 is not None or self.l3 is not None):
            raise ConfigError("--no-prefix-cache cannot be combined with --l2/--l3 (the tiers cache prefixes)")
        if engine == "llama.cpp":
            if self.workers > 1:
                raise ConfigError("--workers > 1 needs SGLang; llama.cpp serves sessions from slots (--sessions)")
            if self.l3 is not None:
                raise ConfigError("--l3 needs SGLang HiCache; llama.cpp has no storage tier")
            if self.l2 is not None and self.l2.size_gb is None:
                raise ConfigError("llama.cpp's host prompt cache (--cache-ram) takes a size: --l2 4GB, not a ratio")
        if self.l3 is not None and self.l3.kind == "lmcache":
            if self.l2 is not None and self.l2.size_gb is None:
                raise ConfigError("with --l3 lmcache, --l2 is the LMCache server's CPU memory: a size (16GB)")
            if self.l2 is not None and self.l3.path is not None:
                raise ConfigError("--l2 sizes the LMCache server agentcache starts; with lmcache:CONFIG, size your own")
            if self.page_size is not None and 256 % self.page_size:
                raise ConfigError(f"--page-size {self.page_size}: LMCache's 256-token chunks need a divisor of 256")


@dataclass(frozen=True, slots=True)
class ReadyCheck:
    """How the supervisor knows a child is ready: ``http`` (GET ``url`` answers 200) or ``tcp`` (a connection
    to ``host:port`` is accepted)."""

    kind: Literal["http", "tcp"]
    host: str
    port: int
    path: str = "/health"

    @property
    def url(self) -> str:
        """The URL polled (``http``), or ``tcp://host:port``."""
        if self.kind == "tcp":
            return f"tcp://{self.host}:{self.port}"
        return f"http://{self.host}:{self.port}{self.path}"


@dataclass(frozen=True, slots=True)
class ProcessSpec:
    """One child process: ``name`` (``engine-0``, ``router``, ``mooncake-master``, ``proxy``), ``role``,
    ``argv``, ``env`` (only what is set on top of the inherited environment), ``ready`` check, and the
    ``stage`` it starts in (a stage starts once every process of the earlier stages is ready)."""

    name: str
    role: Literal["engine", "router", "store", "proxy"]
    argv: tuple[str, ...]
    env: Mapping[str, str] = field(default_factory=dict)
    ready: ReadyCheck | None = None
    stage: int = 0

    def shell(self) -> str:
        """The exact command line with its environment, ready to paste into a POSIX shell."""
        assigns = [f"{k}={shlex.quote(v)}" for k, v in self.env.items()]
        return " ".join([*assigns, *(shlex.quote(a) for a in self.argv)])


@dataclass(frozen=True, slots=True)
class ServePlan:
    """The processes to run, in start order, and where clients connect.

    ``endpoint``: the base URL clients use (OpenAI SDKs take ``endpoint + "/v1"``). ``engine_url``: what the
    front forwards to (the router or the single engine). ``notes``: one-line remarks shown with the plan
    (e.g. the proxy is not installed). ``files``: ``(path, text)`` of config files written before any process
    starts (the LMCache config).
    """

    engine: Engine
    processes: tuple[ProcessSpec, ...]
    endpoint: str
    engine_url: str
    notes: tuple[str, ...] = ()
    files: tuple[tuple[str, str], ...] = ()

    @property
    def stages(self) -> list[list[ProcessSpec]]:
        """Processes grouped by stage, in order."""
        out: dict[int, list[ProcessSpec]] = {}
        for spec in self.processes:
            out.setdefault(spec.stage, []).append(spec)
        return [out[k] for k in sorted(out)]

    def ports(self) -> list[tuple[str, str, int]]:
        """``(process name, host, port)`` of every port the plan's processes will listen on."""
        return [(p.name, p.ready.host, p.ready.port) for p in self.processes if p.ready is not None]
