"""The ``agentcache`` command line (console script ``agentcache = agentcache._cli:main``).

A typer app with one subcommand per tool (``audit``, ``proxy``, ``serve``, ``replay``)
and the global options ``--version``, ``--log-format`` and ``--log-level`` (independent: console lines by default;
level info for the servers ``proxy``/``serve``, warning for the analyses). Typer plumbing (switches shown as
switches, ``--engine`` names, usage errors) is in :mod:`agentcache._cli_base`.

Bad input never produces a traceback: every unreadable file, unknown format, malformed record or invalid
option value is reported as one line on stderr (``agentcache: error: <file> record <n>: <what>``), the
remaining inputs are still audited, and the exit code is 2 at the end (:mod:`agentcache._cli_errors`).
``replay`` exits 1 when any replayed request failed.
"""

from __future__ import annotations

import os
import sys
from importlib.util import find_spec
from pathlib import Path
from typing import Annotated

import typer

from . import __version__
from ._cli_audit import audit_command
from ._cli_base import ConfigFile, Group, engine_metavar, engine_option
from ._cli_errors import fail
from ._cli_replay import plan_command, replay_command
from ._exceptions import ConfigError
from ._log import get_logger
from ._log_output import LEVELS, RENDERERS, configure_logging
from .model._types import Engine

__all__ = ["app", "main"]


#: Commands that run a server: they log at info by default (each request, start and stop), as uvicorn does;
#: the analyses (audit, replay) log at warning so their tables stay readable.
SERVER_COMMANDS = ("proxy", "serve")

_PROXY_ENGINES = ("none",), (Engine.SGLANG, Engine.LLAMA_CPP, Engine.VLLM, Engine.OTHER)
_SERVE_ENGINES = ("auto",), (Engine.SGLANG, Engine.LLAMA_CPP)

log = get_logger("agentcache.cli")

app = typer.Typer(
    cls=Group,
    name="agentcache",
    help="Keep LLM agents' prompt prefixes cache-stable, prove it with numbers, explain every miss.",
    no_args_is_help=True,
    add_completion=False,
    pretty_exceptions_show_locals=False,
)


def _version(value: bool) -> None:
    if value:
        typer.echo(f"agentcache {__version__}")
        raise typer.Exit()


@app.callback()
def _root(
    ctx: typer.Context,
    version: Annotated[
        bool, typer.Option("--version", callback=_version, is_eager=True, help="Print the version and exit.")
    ] = False,
    log_format: Annotated[
        str | None,
        typer.Option(
            "--log-format",
            metavar="[" + "|".join(RENDERERS) + "]",
            envvar="AGENTCACHE_LOG_FORMAT",
            help="Log lines on stderr: console (default; colours on a terminal) or json (one object per line).",
        ),
    ] = None,
    log_level: Annotated[
        str | None,
        typer.Option(
            "--log-level",
            metavar="[" + "|".join(LEVELS) + "]",
            envvar="AGENTCACHE_LOG_LEVEL",
            help=f"Minimum log level. Default: info for {' and '.join(SERVER_COMMANDS)}, warning for the others.",
        ),
    ] = None,
) -> None:
    """agentcache: prompt-cache discipline for LLM agents."""
    # Format and level are independent: each given one is kept, each missing one takes its own default.
    level = log_level or ("info" if ctx.invoked_subcommand in SERVER_COMMANDS else "warning")
    try:
        configure_logging(log_format or "console", level)
    except ConfigError as exc:
        raise fail(str(exc)) from None


def main() -> None:
    """Console-script entry point."""
    try:
        app(prog_name="agentcache")
    except BrokenPipeError:
        # The reader went away (``agentcache audit … | head``): not an error of ours.
        sys.stderr.close()
        os._exit(0)


@app.command("serve")
def serve_command(
    model: Annotated[str, typer.Argument(help="Hugging Face id or model directory (SGLang), or a .gguf file.")],
    extra_args: Annotated[
        list[str] | None,
        typer.Argument(metavar="[-- EXTRA_ENGINE_ARGS]", help="Passed to every engine process, after '--'."),
    ] = None,
    engine: Annotated[
        str,
        typer.Option(
            metavar=engine_metavar([*_SERVE_ENGINES[0], *_SERVE_ENGINES[1]]),
            callback=engine_option(*_SERVE_ENGINES),
            help="auto: a .gguf file is served by llama.cpp, anything else by SGLang (alias of llama.cpp: llama).",
        ),
    ] = "auto",
    host: Annotated[str, typer.Option(help="Address clients connect to.")] = "127.0.0.1",
    port: Annotated[int, typer.Option(help="Port clients connect to (engines use the next ones).")] = 30000,
    l2: Annotated[
        str | None, typer.Option("--l2", help="Host-memory tier: a ratio of the GPU KV pool (2) or a size (16GB).")
    ] = None,
    l3: Annotated[
        str | None,
        typer.Option("--l3", help="Storage tier: none, file:DIR, mooncake[:HOST:PORT] or lmcache[:CONFIG] (SGLang)."),
    ] = None,
    workers: Annotated[int, typer.Option(help="SGLang engines behind a cache-aware router.")] = 1,
    prefix_cache: Annotated[
        bool, typer.Option("--prefix-cache/--no-prefix-cache", help="The engine's prefix cache (off: baselines).")
    ] = True,
    session_cache: Annotated[
        bool, typer.Option("--session-cache/--no-session-cache", help="SGLang session-aware eviction.")
    ] = True,
    page_size: Annotated[int | None, typer.Option(help="SGLang page size (default: 64 with --l2/--l3).")] = None,
    sessions: Annotated[int, typer.Option(help="Concurrent sessions: llama.cpp slots (--parallel).")] = 4,
    ctx_per_session: Annotated[int, typer.Option(help="llama.cpp context tokens per slot.")] = 8192,
    engine_python: Annotated[
        str,
        typer.Option(envvar="AGENTCACHE_ENGINE_PYTHON", help="Interpreter that has SGLang (its own venv/container)."),
    ] = "python3",
    proxy: Annotated[bool, typer.Option("--proxy/--no-proxy", help="Put the agentcache proxy in front.")] = True,
    dry_run: Annotated[
        bool, typer.Option("--dry-run", help="Print each command and its environment, and exit.")
    ] = False,
    log_dir: Annotated[Path | None, typer.Option(help="Where the processes' logs go (default: a temp dir).")] = None,
    ready_timeout: Annotated[float, typer.Option(help="Seconds each process may take to become ready.")] = 900.0,
) -> None:
    """Serve a model with a KV cache set up for agent sessions (SGLang or llama.cpp), agentcache in front."""
    from .serve import ServeOptions, parse_l2, parse_l3, serve

    try:
        options = ServeOptions(
            model=model,
            engine=engine,
            host=host,
            port=port,
            l2=parse_l2(l2),
            l3=parse_l3(l3),
            workers=workers,
            prefix_cache=prefix_cache,
            session_cache=session_cache,
            page_size=page_size,
            sessions=sessions,
            ctx_per_session=ctx_per_session,
            python=engine_python,
            proxy=proxy,
            extra_args=tuple(extra_args or ()),
        )
        code = serve(options, dry_run=dry_run, log_dir=log_dir, ready_timeout=ready_timeout)
    except ConfigError as exc:
        raise fail(str(exc)) from None
    raise typer.Exit(code)


_RECORD_HELP = (
    "Record each pipeline request (as received and as sent, its session, usage, timings; never API keys) to JSONL "
    "files in DIR for 'agentcache audit DIR'. They hold your prompts: DIR is owner-only (0700, files 0600)."
)


@app.command("proxy")
def proxy_command(
    upstream: Annotated[
        str | None,
        typer.Option(
            help="anthropic, openai, or the base URL of an engine (SGLang, llama.cpp...). Default: anthropic."
        ),
    ] = None,
    host: Annotated[
        str | None, typer.Option(help="Address to bind (default 127.0.0.1; admin endpoints need a token off loopback).")
    ] = None,
    port: Annotated[int | None, typer.Option(help="Port to bind (default 8787).")] = None,
    config: ConfigFile = None,
    engine: Annotated[
        str | None,
        typer.Option(
            metavar=engine_metavar([*_PROXY_ENGINES[0], *_PROXY_ENGINES[1]]),
            callback=engine_option(*_PROXY_ENGINES),
            help="The local engine behind --upstream: sglang (session_id, /close_session), llama.cpp (id_slot; "
            "alias llama), vllm or other. Default (none): detected from a URL upstream's info endpoints, else a "
            "provider.",
        ),
    ] = None,
    admin_token: Annotated[
        str | None,
        typer.Option(envvar="AGENTCACHE_ADMIN_TOKEN", help="Token for /metrics and /agentcache/v1/report."),
    ] = None,
    redis_url: Annotated[
        str | None, typer.Option(envvar="AGENTCACHE_REDIS_URL", help="Share sessions between replicas (redis://...).")
    ] = None,
    workers: Annotated[
        str | None,
        typer.Option(
            metavar="N|auto",
            help="Server processes on the one port (default 1; auto: the cores available). More than one shares "
            "sessions through --redis-url, else a private redis-server (on PATH) the proxy runs; /metrics counts "
            "every worker's, the live report is per worker.",
        ),
    ] = None,
    max_body_bytes: Annotated[
        int | None, typer.Option(help="Largest request body read, bytes (413 above; default 32 MiB).")
    ] = None,
    idle_timeout: Annotated[
        float | None, typer.Option(help="Seconds after which an idle session closes (default 3600).")
    ] = None,
    coalesce: Annotated[
        bool | None,
        typer.Option(
            "--coalesce/--no-coalesce",
            help="Hold a request whose new shared prefix a sibling is writing until the sibling's first byte "
            "(default on; AGENTCACHE_COALESCE).",
        ),
    ] = None,
    coalesce_timeout: Annotated[
        float | None, typer.Option(help="Most seconds one such hold lasts (default 3; AGENTCACHE_COALESCE_TIMEOUT).")
    ] = None,
    record: Annotated[Path | None, typer.Option("--record", metavar="DIR", help=_RECORD_HELP)] = None,
    record_max_mb: Annotated[
        float | None, typer.Option(help="--record: new file past this many MB (default 64).")
    ] = None,
    record_max_total_mb: Annotated[
        float | None, typer.Option(help="--record: delete the oldest files past this many MB in all (default 1024).")
    ] = None,
) -> None:
    """Run the drop-in proxy: point ANTHROPIC_BASE_URL / OPENAI_BASE_URL (…/v1) at it."""
    try:
        from ._config import configure
        from .proxy import load_proxy_config, serve
    except ImportError as exc:
        from ._install import install_hint

        raise fail(f"the proxy needs the 'proxy' extra ({exc}): {install_hint('proxy')}") from None
    try:
        overrides = {"coalesce": coalesce, "coalesce_timeout": coalesce_timeout}
        settings = configure(config, **{k: v for k, v in overrides.items() if v is not None})
        proxy_config = load_proxy_config(
            config,
            upstream=upstream,
            host=host,
            port=port,
            engine=engine,
            admin_token=admin_token,
            redis_url=redis_url,
            workers=workers,
            max_body_bytes=max_body_bytes,
            idle_timeout=idle_timeout,
            record_dir=record,
            record_max_mb=record_max_mb,
            record_max_total_mb=record_max_total_mb,
        )
        if proxy_config.record_dir is not None:  # a directory it cannot write: said now, not on every request
            from .proxy._record_files import prepare_dir

            prepare_dir(proxy_config.record_dir)
    except ConfigError as exc:
        raise fail(str(exc)) from None
    except Exception as exc:  # a config file no reader anticipated: still one line, never a traceback
        log.debug("proxy.config_failed", exc_info=True)
        raise fail(f"cannot read config {config}: {type(exc).__name__}: {exc}") from None
    from .serve._preflight import port_in_use

    where = (proxy_config.host, proxy_config.port)
    if proxy_config.port and port_in_use(*where):  # before proxy.start, not a uvicorn traceback after it
        raise fail(
            f"port {where[1]} on {where[0]} is already in use: stop what listens there, or choose another --port"
        )
    if (proxy_config.redis_url or proxy_config.workers > 1) and find_spec("redis") is None:  # not one per worker
        from ._install import install_hint

        what = "--redis-url" if proxy_config.redis_url else "more than one worker"
        raise fail(f"{what} needs the redis client: {install_hint('redis')}")
    from .proxy._workers import WorkersFailed

    try:
        serve(proxy_config, settings)
    except (WorkersFailed, ConfigError) as exc:
        raise fail(str(exc)) from None


app.command("audit")(audit_command)
app.command("replay")(replay_command)
app.command("plan")(plan_command)
