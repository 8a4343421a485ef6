"""The ``agentcache replay`` and ``agentcache plan`` commands: recorded traffic against a real engine, and a
self-hosted KV cache planned on it (registered on the app in :mod:`agentcache._cli`). Both show progress on a
terminal (:mod:`agentcache._cli_progress`) and import their machinery when they run."""

from __future__ import annotations

import itertools
import json
from enum import StrEnum
from pathlib import Path
from typing import Annotated

import typer

from ._cli_base import ConfigFile, FormatChoice, engine_metavar, engine_option
from ._cli_errors import EXIT_BAD_INPUT, Errors, fail
from ._cli_inputs import load_all
from ._cli_progress import progress_bar
from ._exceptions import ConfigError
from .model._types import Engine

__all__ = ["plan_command", "replay_command"]

_REPLAY_ENGINES = ("auto",), (Engine.SGLANG, Engine.LLAMA_CPP, Engine.OTHER)


class ReplayApi(StrEnum):
    """Values of ``replay --api``."""

    openai = "openai"
    anthropic = "anthropic"
    sglang = "sglang"


class ReplayVia(StrEnum):
    """Values of ``replay --via``."""

    agentcache = "agentcache"
    direct = "direct"


def replay_command(
    paths: Annotated[list[Path], typer.Argument(metavar="PATH", help="Recorded traffic files (any audit format).")],
    endpoint: Annotated[str, typer.Option(help="Base URL of the server, e.g. http://127.0.0.1:30000")],
    api: Annotated[
        ReplayApi, typer.Option(help="Wire format sent: openai (chat), anthropic (messages), sglang (/generate ids).")
    ] = ReplayApi.openai,
    concurrency: Annotated[int, typer.Option(help="Sessions replayed at once.")] = 4,
    via: Annotated[
        ReplayVia, typer.Option(help="agentcache: session pipeline + session affinity; direct: as recorded.")
    ] = ReplayVia.direct,
    affinity: Annotated[
        bool | None,
        typer.Option("--affinity/--no-affinity", help="Pin sessions (llama.cpp id_slot, SGLang session_id)."),
    ] = None,
    max_tokens: Annotated[int, typer.Option(help="Tokens generated per request.")] = 16,
    max_turns: Annotated[int | None, typer.Option(help="Replay only the first N requests of each session.")] = None,
    sessions: Annotated[int | None, typer.Option(help="Replay only the first N sessions.")] = None,
    model: Annotated[str | None, typer.Option(help="Model name to send (default: the server's, or recorded).")] = None,
    engine: Annotated[
        str,
        typer.Option(
            metavar=engine_metavar([*_REPLAY_ENGINES[0], *_REPLAY_ENGINES[1]]),
            callback=engine_option(*_REPLAY_ENGINES),
            help="The server's engine (auto: asked from its info endpoints; alias of llama.cpp: llama).",
        ),
    ] = "auto",
    api_key: Annotated[
        str | None, typer.Option(envvar="AGENTCACHE_REPLAY_API_KEY", help="Sent as Bearer / x-api-key.")
    ] = None,
    vocab_size: Annotated[int | None, typer.Option(help="Vocabulary size for --api sglang token ids.")] = None,
    label: Annotated[str, typer.Option(help="Name of this config in the table.")] = "",
    json_output: Annotated[bool, typer.Option("--json", help="Print the JSON result on stdout.")] = False,
    fmt: Annotated[FormatChoice | None, typer.Option("--format", help="Input format, skipping detection.")] = None,
    tools: Annotated[Path | None, typer.Option(help="Tool schemas for tau-bench files.")] = None,
    timeout: Annotated[float, typer.Option(help="Seconds per request.")] = 600.0,
    config_file: ConfigFile = None,
) -> None:
    """Replay recorded sessions against a real endpoint: cached tokens, TTFT p50/p95/p99, errors."""
    from ._config import configure
    from .analysis._fmt import make_console

    try:
        from .replay import ReplayConfig, group_sessions, render_table, replay
    except ImportError as exc:  # httpx is the replay's own dependency
        from ._install import install_hint

        raise fail(f"agentcache replay needs {exc.name or 'httpx'}: {install_hint('serve')}") from None
    try:
        configure(config_file)  # the session pipeline's settings (--via agentcache)
    except ConfigError as exc:
        raise fail(str(exc)) from None

    errors = Errors()
    records = load_all(paths, fmt.value if fmt is not None else None, None if tools is None else str(tools), errors)
    errors.flush()
    if not records:
        if not errors.count:
            errors.add("no records to replay in " + ", ".join(str(p) for p in paths))
        raise typer.Exit(EXIT_BAD_INPUT)
    if concurrency < 1 or max_tokens < 0:
        raise fail("--concurrency must be >= 1 and --max-tokens >= 0")
    config = ReplayConfig(
        endpoint=endpoint,
        api=api.value,
        concurrency=concurrency,
        via=via.value,
        affinity=affinity,
        max_tokens=max_tokens,
        max_turns=max_turns,
        max_sessions=sessions,
        engine=engine,
        model=model,
        api_key=api_key,
        timeout=timeout,
        vocab_size=vocab_size,
        label=label,
    )
    total = sum(len(group) for group in group_sessions(records, sessions, max_turns))
    with progress_bar(total, "replaying", threshold=0) as advance:
        counted = itertools.count(1)

        def turn_done(_: object) -> None:
            if advance is not None:
                advance(next(counted))

        result = replay(records, config, on_turn=turn_done if advance is not None else None)
    if json_output:
        typer.echo(json.dumps(result.to_dict(), indent=2))
    else:
        render_table([result], make_console())
    if errors.count:
        raise typer.Exit(EXIT_BAD_INPUT)
    if result.errors or not result.turns:  # a failed request fails the run (what CI and scripts check)
        raise typer.Exit(1)


def plan_command(
    paths: Annotated[list[Path], typer.Argument(metavar="PATH", help="Recorded traffic files (any audit format).")],
    l1_tokens: Annotated[
        str | None,
        typer.Option(
            "--l1-tokens",
            help="GPU KV pool sizes to sweep: 65536,131072 / 64k / 16GB (default: 1-8x the largest prompt).",
        ),
    ] = None,
    l2_tokens: Annotated[
        str, typer.Option("--l2-tokens", help="Host-memory tier sizes to sweep (0: none; 2x: twice L1).")
    ] = "0,2x",
    l3_tokens: Annotated[str, typer.Option("--l3-tokens", help="Storage tier sizes to sweep (0: none).")] = "0",
    eviction: Annotated[str, typer.Option(help="Evictions to sweep: lru, session, slot (llama.cpp's one slot).")] = (
        "lru,session"
    ),
    page_size: Annotated[int, typer.Option(help="SGLang page size in tokens (serve uses 64 with tiers).")] = 64,
    kv_bytes_per_token: Annotated[int | None, typer.Option(help="KV cache bytes per token (for GB sizes).")] = None,
    model_config: Annotated[
        Path | None, typer.Option(help="The model's Hugging Face config.json (gives KV bytes per token).")
    ] = None,
    rate: Annotated[float, typer.Option(help="Requests/s when records carry no timestamps.")] = 1.0,
    concurrency: Annotated[int, typer.Option(help="Sessions in flight when records carry no timestamps.")] = 4,
    idle_timeout: Annotated[float, typer.Option(help="Seconds after which an idle session closes (0: never).")] = (
        3600.0
    ),
    close_at_end: Annotated[
        bool, typer.Option("--close-at-end/--no-close-at-end", help="Close a session after its last request.")
    ] = True,
    prefill_tps: Annotated[
        float | None, typer.Option(help="Prefill tokens/s of one engine: turns on the TTFT estimate.")
    ] = None,
    l2_gbps: Annotated[float, typer.Option(help="L2 -> GPU fetch bandwidth, GB/s (assumed).")] = 20.0,
    l3_gbps: Annotated[float, typer.Option(help="L3 -> GPU fetch bandwidth, GB/s (assumed).")] = 2.0,
    server: Annotated[
        str | None, typer.Option(help="A llama-server URL: token-exact ids from its /apply-template + /tokenize.")
    ] = None,
    model: Annotated[str, typer.Option(help="Model named in the recommended serve command.")] = "MODEL",
    json_output: Annotated[bool, typer.Option("--json", help="Print the JSON result on stdout.")] = False,
    fmt: Annotated[FormatChoice | None, typer.Option("--format", help="Input format, skipping detection.")] = None,
    tools: Annotated[Path | None, typer.Option(help="Tool schemas for tau-bench files.")] = None,
) -> None:
    """Plan a self-hosted KV cache: hit rate, prefill and evictions per L1/L2/L3 size and eviction, on recorded
    traffic."""
    from .analysis._fmt import make_console
    from .plan import BlockRenderer, ServerRenderer, plan, render_plan
    from .plan._flags import options_from_flags

    errors = Errors()
    try:
        options = options_from_flags(
            l1=l1_tokens, l2=l2_tokens, l3=l3_tokens, eviction=eviction, page_size=page_size,
            kv_bytes_per_token=kv_bytes_per_token, model_config=model_config, rate=rate, concurrency=concurrency,
            idle_timeout=idle_timeout, close_at_end=close_at_end, prefill_tps=prefill_tps, l2_gbps=l2_gbps,
            l3_gbps=l3_gbps, model=model,
        )  # fmt: skip
    except ConfigError as exc:
        raise fail(str(exc)) from None
    records = load_all(
        paths, fmt.value if fmt is not None else None, None if tools is None else str(tools), errors, command="plan"
    )
    if not records:
        errors.flush()
        if not errors.count:
            errors.add("no records to plan in " + ", ".join(str(p) for p in paths))
        raise typer.Exit(EXIT_BAD_INPUT)
    try:
        renderer = ServerRenderer(server) if server else BlockRenderer()
    except ImportError as exc:  # httpx is the serve extra's
        raise fail(f"agentcache plan --server needs {exc.name or 'httpx'}: pip install 'agentcache[serve]'") from None
    with progress_bar(len(records), "planning", threshold=0) as advance:
        report = plan(records, options, renderer, progress=advance)
    for err in report.errors:
        errors.record(err)
    errors.flush()
    if report.requests:
        if json_output:
            typer.echo(json.dumps(report.to_dict(), indent=2))
        else:
            render_plan(report, make_console())
    if errors.count or not report.requests:
        raise typer.Exit(EXIT_BAD_INPUT)
