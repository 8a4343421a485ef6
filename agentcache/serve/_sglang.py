"""SGLang 0.5.23 command lines: the engine (``python -m sglang.launch_server``), the cache-aware router and
Mooncake's master, as argv lists. Pure functions; nothing is started here.

Every SGLang flag agentcache can emit is declared once in :data:`SGLANG_FLAGS`, with the file of the sglang
0.5.23 wheel that defines it (``sglang/srt/arg_groups/fields/<group>.py``; a field ``foo_bar`` is the flag
``--foo-bar``, see ``arg_groups/arg_utils.py``) and the choices agentcache may pass. ``tests/test_serve_flags.py``
reads those files from the wheel, as text, and checks every entry. :func:`_flag` refuses anything undeclared.

What the engine gets, and why (docs/design.md, "SGLang (0.5.23)"):

* the unified radix cache is SGLang's default and is kept (``--disable-radix-cache`` only for baselines);
* ``--enable-session-radix-cache``: session-aware eviction for requests carrying a stable ``session_id``
  (the agentcache proxy adds it, and posts ``/close_session`` when a session ends);
* ``--enable-cache-report`` (``cached_tokens`` in ``/v1`` usage) and ``--enable-metrics`` (``/metrics``);
* ``--schedule-policy lpm``: longest-prefix-match first, so queued turns that share a cached prefix go first;
* HiCache (``--l2``): ``--enable-hierarchical-cache`` with ``--hicache-ratio`` or ``--hicache-size``,
  ``--hicache-write-policy write_through`` (every page reaches host memory, so evicted prefixes come back),
  ``--hicache-mem-layout page_first`` with ``--hicache-io-backend kernel`` (a layout both the file and the
  Mooncake backends accept; ``hicache_hook.py`` rewrites ``layer_first`` for Mooncake), and ``--page-size 64``
  (whole pages move between tiers; agentcache's reuse boundary is page-aligned too);
* L3 (``--l3``): ``--hicache-storage-backend file`` with the directory in
  ``SGLANG_HICACHE_FILE_BACKEND_STORAGE_DIR`` (``sglang/srt/environ.py``, read by ``mem_cache/hicache_storage.py``),
  or ``mooncake`` with ``--hicache-storage-backend-extra-config`` JSON (keys read by
  ``MooncakeStoreConfig.load_from_extra_config`` in ``mem_cache/storage/mooncake_store/mooncake_store.py``):
  TCP transport, P2P handshake metadata, so one ``mooncake_master`` is the only extra process;
* LMCache (``--l3 lmcache[:CONFIG]``): ``--enable-lmcache --lmcache-config-file FILE`` (``fields/memory.py``:
  "LMCache as an alternative hierarchical cache solution", so no HiCache flags). SGLang 0.5.23 talks to LMCache
  only in multiprocess mode (``mem_cache/storage/lmcache/README.md``; ``UnifiedLMCacheMPConnector`` in the
  lmcache 0.5.6 wheel's ``integration/sglang/unified_lmcache_mp_connector.py`` reads ``mp_host`` and ``mp_port``
  from the file and refuses a config without ``mp_host``): the KV lives in a standalone ``lmcache server``
  daemon, whose CPU memory (``--l1-size-gb``; agentcache's ``--l2`` size) is the tier. Without CONFIG agentcache
  writes the file (keys from ``lmcache/v1/config.py``'s ``_CONFIG_DEFINITIONS``) and starts the daemon with
  ``--chunk-size 256`` (LMCache's default; the connector requires a multiple of the page size).
"""

from __future__ import annotations

import json
import tempfile
from collections.abc import Sequence
from dataclasses import dataclass
from pathlib import Path

from .._exceptions import ConfigError
from ._plan import LOOPBACK, ServeOptions

__all__ = [
    "DUMMY_WEIGHTS_ARGS",
    "FILE_DIR_ENV",
    "HICACHE_PAGE_SIZE",
    "LMCACHE_CHUNK",
    "LMCACHE_CONFIG_KEYS",
    "LMCACHE_PORT",
    "MOONCAKE_CONFIG_KEYS",
    "ROUTER_POLICY",
    "SGLANG_FLAGS",
    "SGLANG_VERSION",
    "Flag",
    "engine_argv",
    "engine_env",
    "lmcache_config",
    "lmcache_config_path",
    "lmcache_server_argv",
    "mooncake_extra_config",
    "mooncake_master_argv",
    "router_argv",
    "tp_size",
]

SGLANG_VERSION = "0.5.23"
_FIELDS = "sglang/srt/arg_groups/fields/"


@dataclass(frozen=True, slots=True)
class Flag:
    """One SGLang flag agentcache emits: the wheel file declaring it, whether it takes a value, and the
    values agentcache may give it when the flag has a fixed set of choices."""

    name: str
    source: str
    takes_value: bool
    choices: tuple[str, ...] = ()


SGLANG_FLAGS: dict[str, Flag] = {
    f.name: f
    for f in (
        Flag("--model-path", _FIELDS + "model.py", True),
        Flag("--host", _FIELDS + "serving.py", True),
        Flag("--port", _FIELDS + "serving.py", True),
        Flag("--base-gpu-id", _FIELDS + "device.py", True),
        Flag("--enable-cache-report", _FIELDS + "serving.py", False),
        Flag("--enable-metrics", _FIELDS + "observability.py", False),
        Flag("--schedule-policy", _FIELDS + "schedule.py", True, ("lpm",)),
        Flag("--page-size", _FIELDS + "schedule.py", True),
        Flag("--disable-radix-cache", _FIELDS + "memory.py", False),
        Flag("--enable-session-radix-cache", _FIELDS + "memory.py", False),
        Flag("--enable-hierarchical-cache", _FIELDS + "memory.py", False),
        Flag("--hicache-ratio", _FIELDS + "memory.py", True),
        Flag("--hicache-size", _FIELDS + "memory.py", True),
        Flag("--hicache-write-policy", _FIELDS + "memory.py", True, ("write_through",)),
        Flag("--hicache-mem-layout", _FIELDS + "memory.py", True, ("page_first",)),
        Flag("--hicache-io-backend", _FIELDS + "memory.py", True, ("kernel",)),
        Flag("--hicache-storage-backend", _FIELDS + "memory.py", True, ("file", "mooncake")),
        Flag("--hicache-storage-backend-extra-config", _FIELDS + "memory.py", True),
        Flag("--enable-lmcache", _FIELDS + "memory.py", False),
        Flag("--lmcache-config-file", _FIELDS + "memory.py", True),
        # Used by benchmarks/multiturn.py on a box with only a model's config.json (random weights, token ids in).
        Flag("--load-format", _FIELDS + "model.py", True, ("dummy",)),
        Flag("--skip-tokenizer-init", _FIELDS + "serving.py", False),
    )
}

#: The environment variable naming the file backend's directory (``sglang/srt/environ.py``).
FILE_DIR_ENV = "SGLANG_HICACHE_FILE_BACKEND_STORAGE_DIR"
#: Mooncake keys agentcache writes into ``--hicache-storage-backend-extra-config``.
MOONCAKE_CONFIG_KEYS: tuple[str, ...] = (
    "master_server_address",
    "metadata_server",
    "protocol",
    "device_name",
    "global_segment_size",
    "local_hostname",
)
#: Memory each engine contributes to the Mooncake pool (Mooncake's own default, ``MOONCAKE_GLOBAL_SEGMENT_SIZE``).
MOONCAKE_SEGMENT = "4gb"
#: LMCache config keys agentcache writes (``lmcache/v1/config.py``: ``mp_host`` default None, ``mp_port`` 5555).
LMCACHE_CONFIG_KEYS: tuple[str, ...] = ("mp_host", "mp_port")
#: The ``lmcache server`` port agentcache starts (LMCache's ``mp_port`` default).
LMCACHE_PORT = 5555
#: LMCache's chunk size in tokens (``lmcache server --chunk-size``, default 256 in ``v1/multiprocess/config.py``).
LMCACHE_CHUNK = 256
#: CPU memory of the LMCache server when ``--l2`` gives none, GB (the SGLang README's example).
LMCACHE_DEFAULT_GB = 4.0
#: Page size with HiCache: whole pages move between tiers, and small pages make transfers inefficient.
HICACHE_PAGE_SIZE = 64
#: The router policy that keeps a prefix on the worker that holds it (smg / sglang_router ``--policy``).
ROUTER_POLICY = "cache_aware"
#: Extra engine arguments for a model directory with only ``config.json``: random weights, token ids in.
DUMMY_WEIGHTS_ARGS: tuple[str, ...] = ("--load-format", "dummy", "--skip-tokenizer-init")


def _flag(name: str, value: object = None) -> list[str]:
    """``[name]`` or ``[name, str(value)]``, refusing flags and choices not declared in SGLANG_FLAGS."""
    spec = SGLANG_FLAGS.get(name)
    if spec is None:
        raise AssertionError(f"{name} is not declared in SGLANG_FLAGS")
    if not spec.takes_value:
        return [name]
    text = str(value)
    if spec.choices and text not in spec.choices:
        raise AssertionError(f"{name} {text}: not one of the declared choices {spec.choices}")
    return [name, text]


def tp_size(extra: Sequence[str]) -> int:
    """The tensor-parallel size given in the extra arguments (1 when absent): GPUs per engine."""
    for i, arg in enumerate(extra):
        for name in ("--tp-size", "--tensor-parallel-size"):
            if arg == name and i + 1 < len(extra):
                return max(1, int(extra[i + 1]))
            if arg.startswith(name + "="):
                return max(1, int(arg.split("=", 1)[1]))
    return 1


def mooncake_extra_config(master: str) -> str:
    """The ``--hicache-storage-backend-extra-config`` JSON for a Mooncake master at ``master`` (host:port):
    TCP transport (works without RDMA NICs), P2P handshake (no metadata server), this host's loopback."""
    config = {
        "master_server_address": master,
        "metadata_server": "P2PHANDSHAKE",
        "protocol": "tcp",
        "device_name": "",
        "global_segment_size": MOONCAKE_SEGMENT,
        "local_hostname": LOOPBACK,
    }
    assert tuple(config) == MOONCAKE_CONFIG_KEYS
    return json.dumps(config, separators=(",", ":"))


def engine_argv(options: ServeOptions, index: int, port: int, mooncake_master: str | None) -> list[str]:
    """The command line of SGLang worker ``index`` listening on 127.0.0.1:``port``.

    ``mooncake_master``: the master address when the L3 tier is Mooncake (else ignored).
    Raises ConfigError for an ``--l2`` size that SGLang cannot take (``--hicache-size`` is whole GB).
    """
    argv = [options.python, "-m", "sglang.launch_server"]
    argv += _flag("--model-path", options.model)
    argv += _flag("--host", LOOPBACK) + _flag("--port", port)
    if options.workers > 1:
        argv += _flag("--base-gpu-id", index * tp_size(options.extra_args))
    argv += _flag("--enable-cache-report") + _flag("--enable-metrics")
    if not options.prefix_cache:
        argv += _flag("--disable-radix-cache")
        return argv + list(options.extra_args)
    argv += _flag("--schedule-policy", "lpm")
    if options.session_cache:
        argv += _flag("--enable-session-radix-cache")
    lmcache = options.l3 is not None and options.l3.kind == "lmcache"
    tiered = options.l2 is not None or options.l3 is not None
    page_size = options.page_size if options.page_size is not None else (HICACHE_PAGE_SIZE if tiered else None)
    if page_size is not None:
        argv += _flag("--page-size", page_size)
    if lmcache:
        argv += _flag("--enable-lmcache") + _flag("--lmcache-config-file", lmcache_config_path(options))
    elif tiered:
        argv += _flag("--enable-hierarchical-cache")
        l2 = options.l2
        if l2 is not None and l2.ratio is not None:
            argv += _flag("--hicache-ratio", f"{l2.ratio:g}")
        elif l2 is not None and l2.size_gb is not None:
            if not float(l2.size_gb).is_integer():
                raise ConfigError(f"--l2 {l2.size_gb:g}GB: SGLang's --hicache-size takes whole GB")
            argv += _flag("--hicache-size", int(l2.size_gb))
        argv += _flag("--hicache-write-policy", "write_through")
        argv += _flag("--hicache-mem-layout", "page_first") + _flag("--hicache-io-backend", "kernel")
    l3 = options.l3
    if l3 is not None and l3.kind == "file":
        argv += _flag("--hicache-storage-backend", "file")
    elif l3 is not None and l3.kind == "mooncake":
        if mooncake_master is None:
            raise AssertionError("a Mooncake L3 needs a master address")
        argv += _flag("--hicache-storage-backend", "mooncake")
        argv += _flag("--hicache-storage-backend-extra-config", mooncake_extra_config(mooncake_master))
    return argv + list(options.extra_args)


def lmcache_config_path(options: ServeOptions) -> str:
    """The LMCache config file the engines read: the user's (``--l3 lmcache:CONFIG``), else the one agentcache
    writes (in the temp directory, named by the public port so two serves do not share it)."""
    l3 = options.l3
    if l3 is not None and l3.path is not None:
        return str(l3.path)
    return str(Path(tempfile.gettempdir()) / f"agentcache-lmcache-{options.port}.yaml")


def lmcache_config(port: int = LMCACHE_PORT) -> str:
    """The LMCache YAML agentcache writes: the daemon's address (the only keys SGLang's MP connector reads)."""
    config = {"mp_host": LOOPBACK, "mp_port": port}
    assert tuple(config) == LMCACHE_CONFIG_KEYS
    return "".join(f"{k}: {v}\n" for k, v in config.items())


def lmcache_server_argv(python: str, options: ServeOptions, port: int = LMCACHE_PORT) -> list[str]:
    """The ``lmcache server`` daemon on 127.0.0.1:``port`` (``lmcache/cli/commands/server.py``; flags from
    ``v1/multiprocess/config.py`` and ``v1/distributed/config.py``), run with the engine's interpreter: CPU
    memory from ``--l2`` (GB), LRU eviction, 256-token chunks."""
    size = options.l2.size_gb if options.l2 is not None and options.l2.size_gb is not None else LMCACHE_DEFAULT_GB
    return [python, "-m", "lmcache.cli.main", "server", "--host", LOOPBACK, "--port", str(port),
            "--l1-size-gb", f"{size:g}", "--eviction-policy", "LRU", "--chunk-size", str(LMCACHE_CHUNK)]  # fmt: skip


def engine_env(options: ServeOptions) -> dict[str, str]:
    """Environment for every SGLang worker: the file backend's directory (shared by all workers)."""
    l3 = options.l3
    if options.prefix_cache and l3 is not None and l3.kind == "file" and l3.path is not None:
        return {FILE_DIR_ENV: str(l3.path)}
    return {}


def router_argv(kind: str, python: str, worker_urls: Sequence[str], port: int) -> list[str]:
    """The cache-aware router on 127.0.0.1:``port`` in front of ``worker_urls``.

    ``kind`` ``smg``: the Shepherd Model Gateway binary (``smg --worker-urls … --policy cache_aware``, SMG
    docs ``reference/configuration.md``); ``sglang_router``: the older Python router, run with the engine's
    interpreter (``python -m sglang_router.launch_router``, same flags, ``router_args.py``).
    """
    tail = ["--worker-urls", *worker_urls, "--policy", ROUTER_POLICY, "--host", LOOPBACK, "--port", str(port)]
    if kind == "smg":
        return ["smg", *tail]
    if kind == "sglang_router":
        return [python, "-m", "sglang_router.launch_router", *tail]
    raise ValueError(f"unknown router {kind!r}")


def mooncake_master_argv(port: int, binary: str = "mooncake_master") -> list[str]:
    """Mooncake's master service on ``port`` (gflags ``--rpc_port``, Mooncake ``mooncake-store/src/master.cpp``;
    the eviction watermark as in sglang's ``mooncake_store/README.md``)."""
    return [binary, f"--rpc_port={port}", "--eviction_high_watermark_ratio=0.95"]
