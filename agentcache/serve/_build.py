"""Assemble the :class:`~._plan.ServePlan` for ``agentcache serve``: engines, router, Mooncake master, proxy.

SGLang's command lines come from :mod:`._sglang`; llama.cpp's from :mod:`agentcache.serve.llama`, the same
builder :class:`~agentcache.serve.llama.LlamaServer` uses, fed by :func:`llama_options`.

Stages: 0 ``mooncake-master`` (only for ``--l3 mooncake`` without a master address) or ``lmcache-server`` (``--l3
lmcache`` without a config of the user's; its config file goes in ``ServePlan.files``); 1 the engines
(``engine-0`` … ``engine-N-1``); 2 the ``router`` (``--workers`` > 1); 3 the ``proxy``. A stage starts once every
process of the stages before it is ready.
"""

from __future__ import annotations

import sys
from dataclasses import dataclass

from ._plan import DEFAULT_MOONCAKE_PORT, LOOPBACK, ProcessSpec, ReadyCheck, ServeOptions, ServePlan
from ._sglang import (
    LMCACHE_PORT,
    engine_argv,
    engine_env,
    lmcache_config,
    lmcache_config_path,
    lmcache_server_argv,
    mooncake_master_argv,
    router_argv,
)
from .llama import LlamaOptions, llama_server_argv, llama_server_binary
from .llama._template import choose_template

__all__ = ["Toolchain", "build_plan", "llama_options", "proxy_argv"]


@dataclass(frozen=True, slots=True)
class Toolchain:
    """What was found on this machine (see :func:`._preflight.toolchain`); the defaults describe a
    machine with everything installed, which is what ``--dry-run`` assumes for anything missing.

    ``router``: ``smg`` or ``sglang_router``. ``mooncake_master``: the binary. ``llama_server``: the binary
    (None: found by :func:`agentcache.serve.llama.llama_server_binary`). ``proxy``: ``agentcache.proxy`` is
    importable. ``python``: the interpreter that runs the agentcache proxy (ours).
    """

    router: str = "smg"
    mooncake_master: str = "mooncake_master"
    llama_server: str | None = None
    proxy: bool = True
    python: str = sys.executable


def proxy_argv(python: str, upstream: str, engine: str, host: str, port: int) -> list[str]:
    """``agentcache proxy`` in front of ``upstream``: ``engine`` ``sglang`` makes it add ``session_id`` to every
    forwarded body and post ``/close_session`` when a session closes; ``llama`` tells it the upstream is
    llama.cpp (reuse read from ``timings``)."""
    return [python, "-m", "agentcache", "proxy", "--upstream", upstream, "--engine", engine, "--host", host,
            "--port", str(port)]  # fmt: skip


def llama_options(options: ServeOptions) -> LlamaOptions:
    """llama.cpp's ``llama-server`` set up for ``options``.

    One slot per concurrent session (``--parallel N``, each with ``ctx_per_session`` tokens, so ``--ctx-size``
    is N times that) in separate KV sequences (``--no-kv-unified``), so sessions do not evict each other's KV;
    the client pins a session to a slot with the request field ``id_slot`` (``agentcache replay --via
    agentcache`` does). ``--metrics`` on. ``--l2 SIZE_GB`` sizes the host-memory prompt cache (``--cache-ram``,
    in MiB); ``--no-prefix-cache`` turns both prompt caches off. The chat template renders the tools
    (:func:`agentcache.serve.llama._template.choose_template`: the tools-first template for SmolLM2, the
    model's own otherwise, the user's when ``extra_args`` choose one). ``extra_args`` come last.
    """
    slots = options.sessions
    cache_ram: int | None = None
    if not options.prefix_cache:
        cache_ram = 0
    elif options.l2 is not None and options.l2.size_gb is not None:
        cache_ram = int(options.l2.size_gb * 1024)
    template = choose_template(options.model, options.extra_args)
    return LlamaOptions(
        parallel=slots,
        ctx_size=slots * options.ctx_per_session,
        kv_unified=False,
        metrics=True,
        cache_prompt=options.prefix_cache,
        cache_ram_mib=cache_ram,
        chat_template_file=template.path,
        extra_args=tuple(options.extra_args),
    )


def build_plan(options: ServeOptions, tools: Toolchain | None = None) -> ServePlan:
    """The processes for ``options`` on a machine described by ``tools``. Raises ConfigError for impossible
    options (see :meth:`ServeOptions.validate`)."""
    options.validate()
    tools = tools or Toolchain()
    engine = options.resolved_engine
    processes: list[ProcessSpec] = []
    notes: list[str] = []
    engine_ports = [options.port + 1 + i for i in range(options.workers)]

    master: str | None = None
    if engine == "sglang" and options.prefix_cache and options.l3 is not None and options.l3.kind == "mooncake":
        master = options.l3.master
        if master is None:
            master = f"{LOOPBACK}:{DEFAULT_MOONCAKE_PORT}"
            processes.append(
                ProcessSpec(
                    "mooncake-master",
                    "store",
                    tuple(mooncake_master_argv(DEFAULT_MOONCAKE_PORT, tools.mooncake_master)),
                    ready=ReadyCheck("tcp", LOOPBACK, DEFAULT_MOONCAKE_PORT),
                    stage=0,
                )
            )

    files: list[tuple[str, str]] = []
    l3 = options.l3
    if engine == "sglang" and options.prefix_cache and l3 is not None and l3.kind == "lmcache" and l3.path is None:
        files.append((lmcache_config_path(options), lmcache_config(LMCACHE_PORT)))
        processes.append(
            ProcessSpec(
                "lmcache-server",
                "store",
                tuple(lmcache_server_argv(options.python, options, LMCACHE_PORT)),
                ready=ReadyCheck("tcp", LOOPBACK, LMCACHE_PORT),
                stage=0,
            )
        )

    for i, port in enumerate(engine_ports):
        if engine == "sglang":
            argv = engine_argv(options, i, port, master)
            env = engine_env(options)
        else:
            binary = tools.llama_server if tools.llama_server is not None else llama_server_binary()
            argv = llama_server_argv(binary, options.model, port, llama_options(options), host=LOOPBACK)
            env = {}
            if i == 0:
                notes.append(choose_template(options.model, options.extra_args).note)
        processes.append(
            ProcessSpec(f"engine-{i}", "engine", tuple(argv), env, ReadyCheck("http", LOOPBACK, port), stage=1)
        )

    upstream_port = engine_ports[0]
    if options.workers > 1:
        upstream_port = options.port + 1 + options.workers
        urls = [f"http://{LOOPBACK}:{p}" for p in engine_ports]
        processes.append(
            ProcessSpec(
                "router",
                "router",
                tuple(router_argv(tools.router, options.python, urls, upstream_port)),
                ready=ReadyCheck("http", LOOPBACK, upstream_port),
                stage=2,
            )
        )
    engine_url = f"http://{LOOPBACK}:{upstream_port}"

    if options.proxy and tools.proxy:
        kind = (
            "llama.cpp"
            if engine == "llama.cpp"
            else "sglang"
            if options.session_cache and options.prefix_cache
            else "none"
        )
        argv = proxy_argv(tools.python, engine_url, kind, options.host, options.port)
        processes.append(
            ProcessSpec(
                "proxy", "proxy", tuple(argv), ready=ReadyCheck("tcp", _dial(options.host), options.port), stage=3
            )
        )
        endpoint = f"http://{_dial(options.host)}:{options.port}"
    else:
        if options.proxy:
            notes.append("agentcache.proxy is not installed: clients connect to the engine directly")
        processes, engine_url = _front_without_proxy(processes, options, engine_url)
        endpoint = engine_url
    return ServePlan(engine, tuple(processes), endpoint, engine_url, tuple(notes), tuple(files))


def _dial(host: str) -> str:
    """The address a local client dials for a server bound to ``host``."""
    return LOOPBACK if host in ("0.0.0.0", "", "::") else host


def _front_without_proxy(
    processes: list[ProcessSpec], options: ServeOptions, engine_url: str
) -> tuple[list[ProcessSpec], str]:
    """Without a proxy the front process (the router, else the only engine) takes the public host and port."""
    front = next((p for p in processes if p.role == "router"), None)
    if front is None and options.workers == 1:
        front = next(p for p in processes if p.role == "engine")
    if front is None:
        return processes, engine_url
    argv = list(front.argv)
    argv[argv.index("--port") + 1] = str(options.port)
    argv[argv.index("--host") + 1] = options.host
    ready = ReadyCheck("http", _dial(options.host), options.port)
    moved = ProcessSpec(front.name, front.role, tuple(argv), front.env, ready, front.stage)
    return [moved if p is front else p for p in processes], f"http://{_dial(options.host)}:{options.port}"
