"""Pre-flight checks for ``agentcache serve``: every problem that would make a child fail, found before any
child starts, each with a suggested fix.

:func:`probe_machine` looks at this machine once (GPUs, available memory, what the engine's interpreter can
import, which binaries exist); :func:`check` is a pure function of the options, the plan and that
:class:`Machine`, so tests can describe any machine. Checks: the engine is installed (and how to install it),
SGLang has a GPU (enough for ``--workers`` × tensor parallelism), host memory holds the requested L2 (and the
Mooncake segments), the router and Mooncake pieces exist, the L3 directory is writable, every port is free,
and the proxy put in front (``--proxy``, the default) has its ``proxy`` extra installed.
"""

from __future__ import annotations

import importlib.util
import os
import shutil
import socket
import subprocess
from collections.abc import Callable, Iterable
from dataclasses import dataclass
from pathlib import Path

from .._install import install_hint
from ._build import Toolchain
from ._plan import LOOPBACK, ServeOptions, ServePlan
from ._sglang import SGLANG_VERSION, tp_size
from .llama import INSTALL_HINT, find_llama_server

__all__ = [
    "Machine",
    "Problem",
    "check",
    "port_in_use",
    "probe_machine",
    "proxy_available",
    "proxy_missing",
    "toolchain",
]

GIB = 1024**3
#: Share of a GPU that SGLang's static pool takes (weights + KV), for the L2 estimate with a ratio.
_STATIC_FRACTION = 0.85
#: Share of available host memory the L2 (plus Mooncake segments) may take.
_HOST_HEADROOM = 0.9
#: Memory each engine contributes to an agentcache-started Mooncake pool (``_sglang.MOONCAKE_SEGMENT``).
_MOONCAKE_SEGMENT_BYTES = 4 * GIB
#: What ``python -m agentcache proxy`` imports: the command line's library and the ``proxy`` extra
#: (``pyproject.toml``: starlette, uvicorn, httpx, anyio, prometheus-client). ``agentcache.proxy`` itself is always
#: there (it is part of agentcache); without the extra it fails at import, after the engine started.
_PROXY_MODULES = ("typer", "starlette", "uvicorn", "httpx", "anyio", "prometheus_client")

SGLANG_INSTALL = (
    f"install SGLang {SGLANG_VERSION} in its own environment and pass its interpreter: "
    f"python3 -m venv ~/sglang && ~/sglang/bin/pip install 'sglang=={SGLANG_VERSION}', then "
    "--engine-python ~/sglang/bin/python (or set AGENTCACHE_ENGINE_PYTHON; inside the lmsysorg/sglang "
    "container the default python3 already has it). agentcache does not install SGLang into its own "
    "environment: SGLang pins openai, torch and CUDA kernels"
)


@dataclass(frozen=True, slots=True)
class Problem:
    """One reason ``serve`` cannot start: ``what`` is wrong and the suggested ``fix``."""

    what: str
    fix: str

    def __str__(self) -> str:
        return f"{self.what}\n  fix: {self.fix}"


@dataclass(frozen=True, slots=True)
class Machine:
    """What :func:`probe_machine` found. ``gpus_mib``: memory of each GPU in MiB (0 when unknown).
    ``mem_available``: host bytes available (None: unknown). ``sglang``/``sglang_router``/``mooncake``:
    importable by the engine's interpreter (None: that interpreter does not run). ``smg``,
    ``mooncake_master``, ``llama_server``: binaries found, or None. ``proxy``: the agentcache proxy can run
    (``proxy_missing``: the modules of its ``proxy`` extra that are not installed)."""

    gpus_mib: tuple[int, ...] = ()
    mem_available: int | None = None
    sglang: bool | None = None
    sglang_router: bool | None = None
    mooncake: bool | None = None
    smg: str | None = None
    mooncake_master: str | None = None
    llama_server: str | None = None
    proxy: bool = False
    proxy_missing: tuple[str, ...] = ()


def _python_has(python: str, module: str) -> bool | None:
    """Whether ``python`` can import ``module`` (found, not imported); None when ``python`` does not run."""
    code = "import importlib.util, sys; sys.exit(0 if importlib.util.find_spec(sys.argv[1]) else 3)"
    try:
        done = subprocess.run([python, "-c", code, module], capture_output=True, timeout=60, check=False)
    except (OSError, subprocess.TimeoutExpired):
        return None
    return True if done.returncode == 0 else False if done.returncode == 3 else None


def _gpus() -> tuple[int, ...]:
    """Memory (MiB) of each NVIDIA GPU per ``nvidia-smi``; ``(0, …)`` per ``/dev/nvidiaN`` or AMD ``/dev/kfd``
    when no ``nvidia-smi`` answers; ``()`` when there is no GPU."""
    smi = shutil.which("nvidia-smi")
    if smi:
        try:
            out = subprocess.run(
                [smi, "--query-gpu=memory.total", "--format=csv,noheader,nounits"],
                capture_output=True, text=True, timeout=30, check=False,
            )  # fmt: skip
            sizes = [int(float(x)) for x in out.stdout.split() if x.strip().replace(".", "", 1).isdigit()]
            if out.returncode == 0 and sizes:
                return tuple(sizes)
        except (OSError, subprocess.TimeoutExpired):
            pass
    nodes = [p for p in Path("/dev").glob("nvidia[0-9]*")]
    if nodes:
        return tuple(0 for _ in nodes)
    return (0,) if Path("/dev/kfd").exists() else ()


def _mem_available() -> int | None:
    """``MemAvailable`` from ``/proc/meminfo`` in bytes (None elsewhere)."""
    try:
        for line in Path("/proc/meminfo").read_text().splitlines():
            if line.startswith("MemAvailable:"):
                return int(line.split()[1]) * 1024
    except (OSError, ValueError, IndexError):
        return None
    return None


def _binary(name: str, python: str) -> str | None:
    """``name`` on PATH, else beside the engine's interpreter (a venv's ``bin/``)."""
    found = shutil.which(name)
    if found:
        return found
    exe = shutil.which(python)
    beside = Path(exe).parent / name if exe else None
    return str(beside) if beside is not None and beside.is_file() and os.access(beside, os.X_OK) else None


def proxy_missing() -> tuple[str, ...]:
    """The modules the agentcache proxy (:func:`._build.proxy_argv`'s ``python -m agentcache proxy``) needs that
    are not installed here; ``()`` when it can run. Found, not imported: serve never imports the command line,
    which imports serve."""
    missing = []
    for name in _PROXY_MODULES:
        try:
            found = importlib.util.find_spec(name) is not None
        except (ImportError, ValueError):
            found = False
        if not found:
            missing.append(name)
    return tuple(missing)


def proxy_available() -> bool:
    """True when the agentcache proxy can run here (:func:`proxy_missing` finds nothing missing)."""
    return not proxy_missing()


def probe_machine(options: ServeOptions) -> Machine:
    """Look at this machine for ``options`` (runs the engine's interpreter a few times for SGLang)."""
    missing = proxy_missing()
    proxy = not missing
    if options.resolved_engine == "llama.cpp":
        found = find_llama_server()
        llama = str(found) if found else None
        return Machine(mem_available=_mem_available(), llama_server=llama, proxy=proxy, proxy_missing=missing)
    python = options.python
    needs_router = options.workers > 1
    mooncake = options.l3 is not None and options.l3.kind == "mooncake"
    return Machine(
        gpus_mib=_gpus(),
        mem_available=_mem_available(),
        sglang=_python_has(python, "sglang"),
        sglang_router=_python_has(python, "sglang_router") if needs_router else None,
        mooncake=_python_has(python, "mooncake") if mooncake else None,
        smg=_binary("smg", python) if needs_router else None,
        mooncake_master=_binary("mooncake_master", python) if mooncake else None,
        proxy=proxy,
        proxy_missing=missing,
    )


def toolchain(machine: Machine) -> Toolchain:
    """The binaries the plan uses on ``machine`` (defaults where something is missing, so the plan can still
    be printed)."""
    router = "sglang_router" if machine.smg is None and machine.sglang_router else "smg"
    return Toolchain(
        router=router,
        mooncake_master=machine.mooncake_master or "mooncake_master",
        llama_server=machine.llama_server,
        proxy=machine.proxy,
    )


def port_in_use(host: str, port: int) -> bool:
    """True when ``host:port`` cannot be bound now (something listens there, or it is reserved). False when
    ``host`` does not resolve (the server's own bind then says why)."""
    try:
        family = socket.getaddrinfo(host.strip("[]"), port, type=socket.SOCK_STREAM)[0][0]
    except (OSError, UnicodeError):
        return False
    with socket.socket(family, socket.SOCK_STREAM) as sock:
        # As servers do: connections of a process that just stopped (TIME_WAIT) must not count as "in use".
        sock.setsockopt(socket.SOL_SOCKET, socket.SO_REUSEADDR, 1)
        try:
            sock.bind((host.strip("[]"), port))
        except OSError:
            return True
    return False


def _model_bytes(model: str) -> int | None:
    """Size of the weights in a local model directory (None for a hub id or an empty directory)."""
    path = Path(model).expanduser()
    if not path.is_dir():
        return None
    total = sum(f.stat().st_size for f in path.iterdir() if f.suffix in (".safetensors", ".bin", ".pt"))
    return total or None


def _l2_bytes(options: ServeOptions, machine: Machine) -> tuple[int, str] | None:
    """Host bytes the requested L2 takes on this machine, and how that was reckoned (None: no L2)."""
    l2 = options.l2
    if l2 is None:
        return None
    ranks = options.workers * (tp_size(options.extra_args) if options.resolved_engine == "sglang" else 1)
    if l2.size_gb is not None:
        return int(l2.size_gb * GIB) * ranks, f"{l2.size_gb:g} GB x {ranks} GPU rank(s)"
    ratio = l2.ratio or 0.0
    gpu = max(machine.gpus_mib, default=0) * 1024**2
    if not gpu:
        return None
    weights = _model_bytes(options.model)
    tp = tp_size(options.extra_args)
    device = gpu * _STATIC_FRACTION - weights / tp if weights else gpu * 0.5
    return int(ratio * max(device, 0) * ranks), f"ratio {ratio:g} x ~{device / GIB:.0f} GiB device KV pool x {ranks}"


def check(
    options: ServeOptions,
    plan: ServePlan,
    machine: Machine,
    busy: Callable[[str, int], bool] = port_in_use,
) -> list[Problem]:
    """Every problem that would stop ``plan`` from starting on ``machine``."""
    problems = list(_engine_problems(options, machine))
    problems += _memory_problems(options, machine)
    problems += _port_problems(plan, busy)
    problems += _proxy_problems(options, machine)
    return problems


def _proxy_problems(options: ServeOptions, machine: Machine) -> Iterable[Problem]:
    if options.proxy and not machine.proxy:
        missing = ", ".join(machine.proxy_missing) or "its dependencies"
        yield Problem(
            f"the agentcache proxy in front (--proxy, the default) needs the 'proxy' extra: {missing} not installed",
            f"{install_hint('proxy')}, or pass --no-proxy to let clients connect to the engine directly",
        )


def _engine_problems(options: ServeOptions, machine: Machine) -> Iterable[Problem]:
    if options.resolved_engine == "llama.cpp":
        if machine.llama_server is None:
            yield Problem("llama-server (llama.cpp) not found", INSTALL_HINT)
        if not Path(options.model).expanduser().is_file():
            yield Problem(f"model file not found: {options.model}", "llama.cpp serves a GGUF file: pass its path")
        return
    python = options.python
    if machine.sglang is None:
        yield Problem(f"the engine interpreter {python!r} does not run", SGLANG_INSTALL)
    elif not machine.sglang:
        yield Problem(f"SGLang is not installed for {python!r}", SGLANG_INSTALL)
    needed = options.workers * tp_size(options.extra_args)
    if not machine.gpus_mib:
        yield Problem(
            "no GPU found (nvidia-smi lists none, no /dev/nvidia* or /dev/kfd): SGLang needs an NVIDIA or AMD GPU",
            "on this machine serve a GGUF model with llama.cpp: agentcache serve model.gguf --engine llama.cpp",
        )
    elif len(machine.gpus_mib) < needed:
        yield Problem(
            f"--workers {options.workers} x tensor parallel {needed // options.workers} needs {needed} GPUs, "
            f"found {len(machine.gpus_mib)}",
            f"use --workers {max(1, len(machine.gpus_mib) // max(1, needed // options.workers))}",
        )
    if options.workers > 1 and machine.smg is None and not machine.sglang_router:
        yield Problem(
            "--workers > 1 needs a cache-aware router: neither smg nor sglang_router was found",
            f"pip install smg (Shepherd Model Gateway), or pip install sglang-router into {python}'s environment",
        )
    l3 = options.l3
    if l3 is not None and l3.kind == "mooncake":
        if not machine.mooncake:
            yield Problem(
                f"--l3 mooncake: the mooncake package is not importable by {python!r}",
                f"{python} -m pip install mooncake-transfer-engine",
            )
        if l3.master is None and machine.mooncake_master is None:
            yield Problem(
                "--l3 mooncake without a master address: mooncake_master not found to start one",
                "pip install mooncake-transfer-engine (it provides mooncake_master), or give a running master: "
                "--l3 mooncake:HOST:50051",
            )
    if l3 is not None and l3.kind == "file" and l3.path is not None:
        target = l3.path
        while not target.exists() and target != target.parent:
            target = target.parent
        if not os.access(target, os.W_OK):
            yield Problem(f"--l3 file: {l3.path} is not writable", "choose a directory you can write to")


def _memory_problems(options: ServeOptions, machine: Machine) -> Iterable[Problem]:
    need = _l2_bytes(options, machine)
    own_master = options.l3 is not None and options.l3.kind == "mooncake" and options.l3.master is None
    extra = _MOONCAKE_SEGMENT_BYTES * options.workers if own_master else 0
    if (need is None and not extra) or machine.mem_available is None:
        return
    total = (need[0] if need else 0) + extra
    room = int(machine.mem_available * _HOST_HEADROOM)
    if total <= room:
        return
    how = need[1] if need else "no L2"
    if extra:
        how += f" + {extra / GIB:.0f} GiB Mooncake segments"
    per_worker = max(0, room - extra) / GIB / max(1, options.workers)
    yield Problem(
        f"host memory too small for the requested L2: needs ~{total / GIB:.1f} GiB ({how}), "
        f"{machine.mem_available / GIB:.1f} GiB available",
        f"use a smaller --l2 (about {int(per_worker)}GB per worker fits), or spill to disk with --l3 file:DIR",
    )


def _port_problems(plan: ServePlan, busy: Callable[[str, int], bool]) -> Iterable[Problem]:
    ports = plan.ports()
    taken = [(name, host, port) for name, host, port in ports if busy(host, port)]
    if not taken:
        return
    movable = sorted(port for name, _, port in ports if name != "mooncake-master")
    suggestion = "choose another --port"
    if movable:
        base, width = movable[0], movable[-1] - movable[0] + 1
        for candidate in range(base + width, min(base + width * 50, 65000), width):
            if not any(busy(LOOPBACK, candidate + (p - base)) for p in movable):
                suggestion = f"choose another --port (e.g. --port {candidate})"
                break
    for name, host, port in taken:
        if name == "mooncake-master":
            fix = f"stop the mooncake_master already there, or use it: --l3 mooncake:{LOOPBACK}:{port}"
        else:
            fix = f"stop what listens there, or {suggestion}"
        yield Problem(f"port {port} on {host} ({name}) is already in use", fix)
