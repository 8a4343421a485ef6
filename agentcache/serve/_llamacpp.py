"""llama.cpp ``llama-server`` command line for ``agentcache serve --engine llama.cpp``. Pure; nothing is started.

One slot per concurrent session (``--parallel N``, each with ``--ctx-size / N`` tokens of context, in separate
KV sequences: ``--no-kv-unified``), so sessions do not evict each other's KV; the client pins a session to a slot
with the request field ``id_slot`` (``agentcache replay --via agentcache`` does). Flags are those of the
``llama-server --help`` of the llama.cpp that ``scripts/build-llama-server`` builds (llama-cpp-python 0.3.36's
vendored copy): ``--cache-prompt``/``--no-cache-prompt`` (per-slot prompt cache, on by default),
``--cache-ram`` (the host-memory prompt cache in MiB; agentcache maps ``--l2 SIZE_GB`` onto it, and turns it
off with the prefix cache), ``--metrics`` (``/metrics``), ``--parallel``, ``--ctx-size``, ``--kv-unified``.
"""

from __future__ import annotations

from pathlib import Path

from .._engines.llama import find_llama_server
from ._plan import LOOPBACK, ServeOptions

__all__ = ["INSTALL_HINT", "llama_server_argv", "llama_server_binary"]

#: How to get a ``llama-server`` binary (printed by the pre-flight check).
INSTALL_HINT = (
    "run scripts/build-llama-server (builds it into ~/.cache/agentcache), put llama-server on PATH "
    "(e.g. brew install llama.cpp), or set AGENTCACHE_LLAMA_SERVER=/path/to/llama-server"
)


def llama_server_binary() -> str:
    """The ``llama-server`` to run: :func:`agentcache._engines.llama.find_llama_server`, else the bare name
    (so ``--dry-run`` still prints a command; the pre-flight check reports it missing)."""
    found = find_llama_server()
    return str(found) if found is not None else "llama-server"


def llama_server_argv(options: ServeOptions, port: int, binary: str | Path | None = None) -> list[str]:
    """The ``llama-server`` command line on 127.0.0.1:``port`` for ``options``."""
    slots = options.sessions
    argv = [str(binary) if binary is not None else llama_server_binary()]
    argv += ["--model", options.model, "--host", LOOPBACK, "--port", str(port)]
    argv += ["--parallel", str(slots), "--ctx-size", str(slots * options.ctx_per_session), "--no-kv-unified"]
    argv += ["--metrics"]
    if not options.prefix_cache:
        argv += ["--no-cache-prompt", "--cache-ram", "0"]
    elif options.l2 is not None and options.l2.size_gb is not None:
        argv += ["--cache-ram", str(int(options.l2.size_gb * 1024))]
    return argv + list(options.extra_args)
