"""``agentcache audit``: what prompt caching cost on recorded traffic, and why each miss happened.

Two kinds of input, one command:

* **agents' own logs** (Claude Code transcripts, Codex rollouts, opencode and Qwen Code sessions): each API call
  by the usage the provider reported, audited by :func:`agentcache._audit_logs.audit_logs` (causes inferred, the
  ``agentcache`` arm a what-if on the recorded pauses). With no PATH, the logs of every agent installed here are
  found where the agent keeps them (:func:`agentcache.loaders._paths.default_roots`);
* **recorded requests with their bodies** (JSONL logs such as ``agentcache proxy --record``'s, tau-bench,
  SWE-agent, OpenHands, cases), replayed through simulated caches by :func:`agentcache._audit.audit`.

Both kinds in one run give both reports (JSON: the logs' report, with the other under ``"simulated"``). Heavy
modules are imported when the command runs, so ``--help`` stays fast.
"""

from __future__ import annotations

import contextlib
import datetime as dt
import json
import re
from enum import StrEnum
from pathlib import Path
from typing import TYPE_CHECKING, Annotated, Any

import typer

from ._cli_base import ConfigFile, FormatChoice
from ._cli_errors import EXIT_BAD_INPUT, Errors, fail
from .model._types import Breakdown

if TYPE_CHECKING:
    from .analysis._inferred import ExactCauses
    from .analysis._report import AuditReport
    from .loaders import Record
    from .loaders._paths import Inputs

__all__ = ["audit_command", "parse_when"]


class ProviderChoice(StrEnum):
    """Values of ``audit --provider``: whose cache rules to simulate."""

    anthropic = "anthropic"
    openai = "openai"
    engine = "engine"


_RELATIVE = re.compile(r"^(\d+(?:\.\d+)?)\s*([smhdw])$")
_UNIT = {"s": 1, "m": 60, "h": 3600, "d": 86400, "w": 604800}


def parse_when(value: str, now: float | None = None) -> float:
    """Unix seconds of ``value``: an ISO date or date-time (``2026-11-30``, ``2026-11-30T14:00``; UTC unless it
    names an offset) or a span back from ``now`` (``7d``, ``12h``, ``30m``, ``2w``). Raises ValueError otherwise."""
    match = _RELATIVE.match(value.strip().lower())
    if match:
        base = dt.datetime.now(dt.UTC).timestamp() if now is None else now
        return base - float(match.group(1)) * _UNIT[match.group(2)]
    when = dt.datetime.fromisoformat(value.strip())
    if when.tzinfo is None:
        when = when.replace(tzinfo=dt.UTC)
    return when.timestamp()


def _when(value: str | None) -> float | None:
    """``--since``/``--until`` as unix seconds (a usage error, with its help hint, when unreadable)."""
    if value is None:
        return None
    try:
        return parse_when(value)
    except ValueError:
        raise typer.BadParameter(
            f"{value!r}: expected a date (2026-11-30), a date-time (2026-11-30T14:00) or a span back (7d, 12h)"
        ) from None


def audit_command(
    paths: Annotated[
        list[Path] | None,
        typer.Argument(
            metavar="PATH",
            help="Files, directories or globs of recorded traffic or agents' logs (formats are detected). "
            "Default: the logs of the agents installed here (Claude Code, Codex, opencode, Qwen Code).",
        ),
    ] = None,
    since: Annotated[
        float | None,
        typer.Option(
            parser=_when,
            metavar="WHEN",
            help="Only calls from this time on: 2026-11-30, 2026-11-30T14:00 (UTC), or a span back: 7d, 12h.",
        ),
    ] = None,
    until: Annotated[
        float | None,
        typer.Option(parser=_when, metavar="WHEN", help="Only calls before this time (same forms as --since)."),
    ] = None,
    project: Annotated[
        str | None, typer.Option(help="Only calls whose project (working directory) contains this text.")
    ] = None,
    by: Annotated[
        list[Breakdown] | None,
        typer.Option(help="Breakdown tables of an agents' log audit, repeatable (default: day and session)."),
    ] = None,
    provider: Annotated[
        ProviderChoice | None,
        typer.Option(
            help="Recorded requests: the cache rules to simulate, a provider or a local engine's prefix cache "
            "(default: the provider the recorded usage names, else the first record's API)."
        ),
    ] = None,
    model: Annotated[str | None, typer.Option(help="Recorded requests: price every request as this model.")] = None,
    json_output: Annotated[bool, typer.Option("--json", help="Print the JSON report on stdout.")] = False,
    fmt: Annotated[FormatChoice | None, typer.Option("--format", help="Input format, skipping detection.")] = None,
    tools: Annotated[
        Path | None, typer.Option(help="Tool schemas for tau-bench files (default: <domain>_tools.json beside them).")
    ] = None,
    compare: Annotated[
        bool,
        typer.Option(
            "--compare",
            help="Recorded requests: add one arm per baseline strategy: on Anthropic rules the marker strategies "
            "(anthropic_auto, langchain, litellm, no_markers); on OpenAI rules the prompt_cache_key strategies "
            "(no_key, conversation_key, random_key, lineage_keys, and breakpoints where the model takes them).",
        ),
    ] = False,
    ttft: Annotated[
        float | None,
        typer.Option(
            help="Recorded requests: model concurrency, seconds from a request's start to its first byte (an entry "
            "is readable only then), and add the agentcache_coalesced arm (Anthropic rules).",
        ),
    ] = None,
    html: Annotated[
        Path | None, typer.Option("--html", help="Also write a self-contained HTML report (charts work offline).")
    ] = None,
    verbose: Annotated[
        bool, typer.Option("--verbose", "-v", help="List the first records of each file that could not be read.")
    ] = False,
    exact: Annotated[
        bool | None,
        typer.Option(
            "--exact/--no-exact",
            help="Rebuild the exact request bodies agents' logs hold (Claude Code 2.1.332) for byte-level causes "
            "(default: when the input is at most 256 MB).",
        ),
    ] = None,
    sample: Annotated[
        bool,
        typer.Option(
            "--sample", help="Audit the sample bundled with agentcache (synthetic Claude Code logs of a few days)."
        ),
    ] = False,
    config: ConfigFile = None,
) -> None:
    """Audit agents' logs or recorded traffic: what prompt caching cost, could cost, and why each miss happened."""
    from ._config import configure
    from ._exceptions import ConfigError

    errors = Errors(verbose)
    try:
        configure(config)  # [models.<provider>."<id>"] prices, [agentcache] settings
    except ConfigError as exc:
        raise fail(str(exc)) from None
    window = {"since": since, "until": until}
    named = list(paths or [])
    if sample:
        named.append(sample_path())
    searched = not named  # the agents' default log folders, not paths the user gave
    if searched:
        named = _found_logs(json_output)
        if not named:
            raise typer.Exit(EXIT_BAD_INPUT)
    from ._cli_inputs import load_inputs

    fmt_name = fmt.value if fmt is not None else None
    tools_name = None if tools is None else str(tools)
    inputs = load_inputs(named, fmt_name, tools_name, errors, **window, project=project, bodies=exact)
    if not inputs.records and not inputs.usage_records:
        errors.flush()
        _nothing(inputs, named, errors, searched)
        raise typer.Exit(EXIT_BAD_INPUT)
    options = (provider.value if provider else None, model, compare, ttft)
    if not inputs.records and (provider or model or compare or ttft is not None):
        errors.warn(
            "--provider, --model, --compare and --ttft apply to recorded requests with bodies, not to agents' logs"
        )
    logs, simulated = _run(inputs, named, options, errors, json_output)
    _emit(logs, simulated, [b.value for b in by] if by else None, json_output, html, named, errors)
    if errors.count or (logs is None and simulated is None):
        raise typer.Exit(EXIT_BAD_INPUT)


def sample_path() -> Path:
    """The sample bundled with the package: synthetic Claude Code transcripts (``benchmarks/_claude_corpus.py``
    wrote them: generated text, usage a provider cache would report, every inferred cause in it)."""
    from importlib import resources

    return Path(str(resources.files("agentcache") / "data" / "sample"))


def _found_logs(quiet: bool) -> list[Path]:
    """The agents' log folders on this machine, each named on stderr; none found is one error line."""
    from .loaders import LOG_FORMATS
    from .loaders._paths import default_roots

    found = default_roots()
    for fmt, root in found:
        if not quiet:
            typer.echo(f"found {fmt.client} logs in {root}", err=True)
    if not found:
        env = _environ()
        looked = "; ".join(
            f"{f.client}: {', '.join(str(p) for p in roots)}" for f in LOG_FORMATS if (roots := f.default_roots(env))
        )
        Errors().add(
            f"no agent logs found (looked in {looked}); pass a PATH, or try `agentcache audit --sample` for a look"
        )
    return [root for _, root in found]


def _environ() -> dict[str, str]:
    import os

    return dict(os.environ)


def _nothing(inputs: Inputs, named: list[Path], errors: Errors, searched: bool) -> None:
    """Say why nothing was audited (once; other errors already named their inputs). ``searched``: ``named`` are the
    agents' default log folders (found, but they may hold no session yet)."""
    if inputs.filtered:
        errors.add(f"none of the {inputs.filtered:,} calls read is in the --since/--until/--project window")
    elif not errors.count:
        where = ", ".join(str(p) for p in named)
        extra = f" ({inputs.unrecognised:,} files of no known format)" if inputs.unrecognised else ""
        if searched:
            errors.add(
                f"the agents' log folders hold no calls yet ({where}{extra}): run your agent first, pass a PATH, "
                "or try `agentcache audit --sample` for a look"
            )
        else:
            errors.add(f"no records to audit in {where}{extra}")


def _run(
    inputs: Inputs,
    named: list[Path],
    options: tuple[str | None, str | None, bool, float | None],
    errors: Errors,
    quiet_json: bool,
) -> tuple[AuditReport | None, AuditReport | None]:
    """The logs' report (None without usage records) and the recorded requests' report (None without records)."""
    from ._log_output import without_events
    from .analysis._inferred import exact_causes

    simulated = None
    if inputs.records:
        # The table names unknown models in its header; the JSON document only in its "models" list, so there the
        # model.unknown warning on stderr stays (a script's log shows it).
        quiet = without_events("model.unknown") if not quiet_json else contextlib.nullcontext()
        try:
            with quiet:
                simulated = _audit_records(inputs.records, options, errors)
        finally:
            errors.flush()
    else:
        errors.flush()
    exact = exact_causes(simulated) if simulated is not None else None  # byte-level causes replace inferred ones
    logs = None
    if inputs.usage_records:
        with without_events("model.unknown") if not quiet_json else contextlib.nullcontext():
            logs = _audit_logs(inputs, named, exact)
    return logs, simulated


def _audit_logs(inputs: Inputs, named: list[Path], exact: ExactCauses | None) -> AuditReport:
    from ._audit_logs import audit_logs
    from ._config import get_settings
    from .analysis._report_logs import SourceRow, write_caveat
    from .loaders import LOG_FORMATS

    rows: list[SourceRow] = []
    for fmt in LOG_FORMATS:
        files = [r for r in inputs.files if r.format == fmt.name]
        if not files:
            continue
        # What the audit kept (after --since/--until/--project): a log's calls, else a body dump's requests (a log
        # that also holds its requests, as Claude Code 2.1.332's, counts each call once).
        kept = [u.session for u in inputs.usage_records if u.client == fmt.name]
        kept = kept or [r.session for r in inputs.records if r.meta.get("format") == fmt.name]
        calls, sessions = len(kept), set(kept)
        roots = tuple(sorted({_root_of(r.path, named) for r in files}))
        shown = roots if len(roots) <= 3 else (*roots[:2], f"… {len(roots) - 2} more")
        errors = sum(len(r.errors) for r in files)
        caveat = write_caveat([u for u in inputs.usage_records if u.client == fmt.name])
        rows.append(SourceRow(fmt.client, shown, len(files), calls, len(sessions), errors, fmt.leaves_out, caveat))
    return audit_logs(inputs.usage_records, get_settings(), rows, exact)


def _root_of(path: Path, named: list[Path]) -> str:
    """The input the user named (or agentcache found) that holds ``path``: a folder given, else the file."""
    for root in named:
        if root == path or root in path.parents:
            return str(root)
    return str(path.parent)


def _audit_records(
    records: list[Record], options: tuple[str | None, str | None, bool, float | None], errors: Errors
) -> AuditReport | None:
    """The simulated audit of recorded requests; records it could not read go to ``errors``. None (after saying
    why) when the options are invalid or no record was auditable."""
    from ._audit import audit
    from ._cli_progress import progress_bar
    from ._exceptions import ConfigError
    from ._log import get_logger

    provider, model, compare, ttft = options
    try:
        with progress_bar(len(records), "auditing") as progress:
            report = audit(records, provider=provider, model=model, progress=progress, compare=compare, ttft=ttft)
    except ConfigError as exc:
        errors.add(str(exc))
        return None
    for err in report.errors:
        errors.record(err)
    get_logger("agentcache.cli").info("audit.done", provider=report.provider, model=report.model, requests=len(records))
    return report if report.turns else None


def _emit(
    logs: AuditReport | None,
    simulated: AuditReport | None,
    by: list[str] | None,
    json_output: bool,
    html: Path | None,
    named: list[Path],
    errors: Errors,
) -> None:
    """Print the report(s): JSON on stdout, or tables; and the HTML page when asked."""
    if json_output:
        doc: dict[str, Any] = logs.to_dict() if logs is not None else {}
        if simulated is not None:
            if logs is None:
                doc = simulated.to_dict()
            else:
                doc["simulated"] = simulated.to_dict()
        if doc:
            typer.echo(json.dumps(doc, indent=2))
    else:
        from .analysis._fmt import make_console

        console = make_console()
        if logs is not None:
            from .analysis._render_logs import DEFAULT_BY, render_logs_report

            render_logs_report(logs, console, by or DEFAULT_BY)
        if simulated is not None:
            from .analysis._render import render_report

            if logs is not None:  # the same calls' request bodies (exact mode), or other recorded traffic
                console.rule(
                    "[bold]The requests with their bodies, replayed: what agentcache's repairs and markers change"
                )
            render_report(simulated, console)
    report = logs if logs is not None else simulated  # agents' logs are the main job: their page first
    if html is not None and report is not None:
        from .analysis._html import render_html

        try:
            size = html.write_text(render_html(report, [str(p) for p in named], replayed=simulated if logs else None))
            if not json_output:  # stdout stays one JSON document with --json
                typer.echo(f"HTML report: {html} ({size / 1024:.0f} KB of text)")
        except OSError as exc:
            errors.add(f"{html}: cannot write the HTML report: {exc.strerror or exc}")
