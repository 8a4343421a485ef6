"""``agentcache serve``: one command that brings up a model server whose KV cache is set up for long agent
sessions, with the agentcache proxy in front.

SGLang 0.5.23 on GPUs (unified radix cache, session-aware eviction, HiCache L2/L3, a cache-aware router for
several workers) or llama.cpp's ``llama-server`` elsewhere (one slot per session, ``id_slot`` affinity). SGLang
is never a dependency of agentcache: it runs under its own interpreter (``--engine-python``).

This package launches engines; it does not model their caches (that is :mod:`agentcache.engine`). SGLang's
command lines are :mod:`._sglang`'s; llama.cpp's launcher is :mod:`.llama` (also the ``llama-server`` that tests,
examples and benchmarks start).

Library use::

    from agentcache.serve import ServeOptions, build_plan, serve

    plan = build_plan(ServeOptions("Qwen/Qwen3-8B", workers=2))
    print("\\n".join(p.shell() for p in plan.processes))
    exit_code = serve(ServeOptions("model.gguf"))  # blocks until Ctrl-C / SIGTERM or a child fails
"""

from __future__ import annotations

import tempfile
from pathlib import Path
from typing import TextIO

from rich.console import Console

from ._build import Toolchain, build_plan
from ._plan import DEFAULT_PORT, L2, L3, ProcessSpec, ReadyCheck, ServeOptions, ServePlan, parse_l2, parse_l3
from ._preflight import Machine, Problem, check, port_in_use, probe_machine, toolchain
from ._supervisor import Failure, Supervisor

__all__ = [
    "DEFAULT_PORT",
    "EXIT_PREFLIGHT",
    "L2",
    "L3",
    "Failure",
    "Machine",
    "Problem",
    "ProcessSpec",
    "ReadyCheck",
    "ServeOptions",
    "ServePlan",
    "Supervisor",
    "Toolchain",
    "build_plan",
    "check",
    "describe",
    "format_plan",
    "parse_l2",
    "parse_l3",
    "port_in_use",
    "probe_machine",
    "serve",
    "toolchain",
]

#: Exit code when a pre-flight check fails (nothing was started).
EXIT_PREFLIGHT = 2


def describe(options: ServeOptions) -> str:
    """One line: engine, workers and cache tiers."""
    engine = options.resolved_engine
    parts: list[str] = [engine]
    if engine == "sglang":
        parts.append(f"{options.workers} worker(s)")
        if not options.prefix_cache:
            parts.append("radix cache off")
        else:
            parts.append("session-aware" if options.session_cache else "no session-aware eviction")
            parts.append(f"L2 {options.l2.describe()}" if options.l2 else "no L2")
            parts.append(f"L3 {options.l3.describe()}" if options.l3 else "no L3")
    else:
        parts.append(f"{options.sessions} slot(s)")
        parts.append("prompt cache on" if options.prefix_cache else "prompt cache off")
    return ", ".join(parts)


def format_plan(options: ServeOptions, plan: ServePlan) -> str:
    """The ``--dry-run`` text: a header, then per process a ``#`` line and the exact command with its
    environment (``VAR=value … argv``), one line each, in start order."""
    lines = [f"# agentcache serve: {describe(options)}; clients connect to {plan.endpoint}"]
    lines += [f"# note: {note}" for note in plan.notes]
    for path, text in plan.files:
        lines.append(f"# file {path} (written before start):")
        lines += [f"#   {line}" for line in text.splitlines()]
    for spec in plan.processes:
        ready = f" (ready: {spec.ready.url})" if spec.ready is not None else ""
        lines.append(f"# {spec.name}{ready}")
        lines.append(spec.shell())
    return "\n".join(lines)


def _ready_message(options: ServeOptions, plan: ServePlan, log_dir: Path) -> str:
    url = plan.endpoint
    lines = [
        f"agentcache serve: ready ({describe(options)})",
        f"  OpenAI:    {url}/v1   (OPENAI_BASE_URL={url}/v1)",
        f"  Anthropic: {url}      (ANTHROPIC_BASE_URL={url})",
        f"  engine:    {plan.engine_url}",
        f"  logs:      {log_dir}",
        "  Ctrl-C stops every process.",
    ]
    return "\n".join(lines)


def serve(
    options: ServeOptions,
    *,
    dry_run: bool = False,
    log_dir: Path | None = None,
    console: Console | None = None,
    out: TextIO | None = None,
    machine: Machine | None = None,
    ready_timeout: float = 900.0,
) -> int:
    """Run ``agentcache serve``; returns the exit code.

    ``dry_run``: print the plan on ``out`` (stdout) and return 0 (pre-flight problems become ``# warning``
    lines on the console). Otherwise a failed pre-flight check prints each problem with its fix and returns
    :data:`EXIT_PREFLIGHT`; else the :class:`Supervisor` runs until Ctrl-C / SIGTERM (0) or a child fails (its
    exit code). ``machine``: what the checks assume (default: :func:`probe_machine`). Raises ConfigError for
    impossible options.
    """
    import sys

    console = console or Console(stderr=True)
    options.validate()
    machine = machine or probe_machine(options)
    plan = build_plan(options, toolchain(machine))
    problems = check(options, plan, machine)
    if dry_run:
        for problem in problems:
            console.print(
                f"# warning: {problem.what} (fix: {problem.fix})", markup=False, highlight=False, soft_wrap=True
            )
        print(format_plan(options, plan), file=out or sys.stdout)
        return 0
    if problems:
        for problem in problems:
            console.print(f"agentcache: error: {problem}", markup=False, highlight=False, soft_wrap=True)
        return EXIT_PREFLIGHT
    for note in plan.notes:
        console.print(f"agentcache serve: note: {note}", markup=False, highlight=False, soft_wrap=True)
    logs = log_dir or Path(tempfile.mkdtemp(prefix="agentcache-serve-"))
    for path, text in plan.files:
        Path(path).write_text(text)
    console.print(
        f"agentcache serve: {describe(options)}; logs in {logs}", markup=False, highlight=False, soft_wrap=True
    )
    supervisor = Supervisor(plan, logs, console=console, ready_timeout=ready_timeout)

    def ready(done: ServePlan) -> None:
        console.print(_ready_message(options, done, logs), markup=False, highlight=False, soft_wrap=True)

    return supervisor.run(on_ready=ready)
