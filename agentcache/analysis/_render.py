"""Human-readable rendering of an :class:`~agentcache.AuditReport` with rich (the default output of
``agentcache audit``; ``--json`` prints ``report.to_dict()`` instead).

Sections: a header line (and a line naming any model the price table does not know), the per-arm totals,
the breaks (summarised by cause, then the largest individual breaks), the misses grouped by (arm, cause), the
provider's own miss reasons beside agentcache's causes with their agreement (when the recorded responses carry
them), the simulator's error against the usage the provider reported (when the records carry it), and the
sessions that agentcache saves the most on. Numbers are right-aligned with thousands separators.
"""

from __future__ import annotations

from collections import defaultdict

from rich.console import Console
from rich.table import Table

from ._fmt import _int, _pct, _plural, _table, _usd, make_console
from ._groups import MissGroup, group_misses, group_ttl
from ._report import (
    ARMS,
    ArmMetrics,
    AuditReport,
    BreakRecord,
    MissRecord,
    ModelRecord,
    ProviderMissRecord,
    SessionReport,
    SimErrorRecord,
    TurnRecord,
    provider_summary,
    saving_of,
    unreported,
)
from ._report_logs import fixes_for

__all__ = ["make_console", "render_report"]


def render_report(report: AuditReport, console: Console, max_breaks: int = 20, top_sessions: int = 10) -> None:
    """Print ``report`` to ``console``: header, totals, breaks, misses and top sessions."""
    requests = report.totals["as_sent"].requests if "as_sent" in report.totals else 0
    console.print(
        f"[bold]agentcache audit[/bold]: provider [cyan]{report.provider}[/cyan], model [cyan]{report.model}[/cyan], "
        f"{_plural(len(report.sessions), 'session')}, {_plural(requests, 'request')}"
    )
    _render_unknown_models(report.models, console)
    console.print(_totals_table(report.totals))
    if (missing := unreported(report.totals, sum(s.requests for s in report.sessions))) is not None:
        n, of = missing
        console.print(
            f"[yellow]usage not reported by the upstream for {n:,} of {of:,} requests[/yellow]: "
            + (f"the reported arm's hit rate and USD cover the other {of - n:,}" if n < of else "no reported figures")
        )
    _render_breaks(report.breaks, console, max_breaks)
    _render_misses(report.misses, console, bool(report.breaks))
    _render_fixes(report, console)
    _render_provider(report.provider_misses, console)
    _render_sim_errors(report.simulator_errors, console, max_breaks)
    _render_ttl(report.turns, console)
    if report.sessions:
        console.print(_sessions_table(report.sessions, top_sessions))


def _render_unknown_models(models: list[ModelRecord], console: Console) -> None:
    """One line per model the price table does not know (``known: false``), with the price it got instead."""
    for m in models:
        if not m.known:
            console.print(
                f"[yellow]unknown {m.provider} model[/yellow] {m.model or '(none)'!s} "
                f"({_plural(m.requests, 'request')}): priced as {m.priced_as}"
            )


def _render_provider(misses: list[ProviderMissRecord], console: Console) -> None:
    """The provider's miss reasons against agentcache's causes: one row per (reason, ours) pair, and the
    agreement over the misses the provider could compare."""
    if not misses:
        return
    summary = provider_summary(misses)
    rate = summary["agreement"]
    title = f"Provider-reported misses (agreement {_pct(rate) if rate is not None else 'n/a'}, "
    title += f"{summary['agree']} of {summary['compared']} compared)"
    table = _table(title, ["provider reason", "agentcache cause", ">requests", "agrees"])
    groups: dict[tuple[str, str, str], int] = defaultdict(int)
    for m in misses:
        agrees = "unknown" if m.agrees is None else ("yes" if m.agrees else "no")
        groups[(f"{m.provider}: {m.reason}", m.ours or "(none)", agrees)] += 1
    for (reason, ours, agrees), n in sorted(groups.items(), key=lambda kv: -kv[1]):
        table.add_row(reason, ours, _int(n), agrees)
    console.print(table)


def _render_sim_errors(errors: list[SimErrorRecord], console: Console, limit: int) -> None:
    """The simulated arm against the reported usage, per request (the ``limit`` largest read errors), and in all:
    the simulator's error, simulated − reported."""
    if not errors:
        return
    arm = errors[0].arm
    shown = sorted(errors, key=lambda e: -abs(e.simulated.cache_read_tokens - e.reported.cache_read_tokens))[:limit]
    cols = ["session", ">request", ">reported read", f">{arm} read", ">read error", ">write error", ">prompt error"]
    cols.append(">USD error")
    table = _table(f"Simulator error ({arm} − reported; largest {len(shown)} of {len(errors)})", cols)
    for e in shown:
        err = e.error()
        table.add_row(
            e.session,
            _int(e.request),
            _int(e.reported.cache_read_tokens),
            _int(e.simulated.cache_read_tokens),
            f"{err['cache_read_tokens']:+,}",
            f"{err['cache_write_tokens']:+,}",
            f"{err['prompt_tokens']:+,}",
            f"{err['cost_usd']:+,.4f}",
        )
    console.print(table)


def _totals_table(totals: dict[str, ArmMetrics]) -> Table:
    """One row per arm with token counts, hit rate, cost and the saving against ``as_sent``."""
    table = _table(
        "Totals",
        ["arm", ">prompt", ">read", ">write", ">uncached", ">hit rate", ">USD", ">saved"],
    )
    base = totals.get("as_sent")
    for arm, m in totals.items():
        saved = "—"
        if (saving := saving_of(arm, m, base)) is not None:
            diff, share = saving
            saved = _usd(diff) + (f" ({share * 100:.1f}%)" if share is not None else "")
        table.add_row(
            arm,
            _int(m.prompt_tokens),
            _int(m.cache_read_tokens),
            _int(m.cache_write_tokens),
            _int(m.uncached_tokens),
            _pct(m.hit_rate) if m.requests else "—",
            _usd(m.cost_usd) if m.requests else "—",
            saved,
        )
    return table


def _render_breaks(breaks: list[BreakRecord], console: Console, limit: int) -> None:
    """Breaks by cause (count, tokens lost, repaired), then the ``limit`` largest breaks."""
    if not breaks:
        console.print("No prefix breaks.")
        return
    by_cause: dict[str, list[BreakRecord]] = defaultdict(list)
    for b in breaks:
        by_cause[b.cause].append(b)
    summary = _table("Breaks by cause", ["cause", ">breaks", ">tokens lost", ">repaired"])
    for cause, items in sorted(by_cause.items(), key=lambda kv: -sum(b.tokens_lost for b in kv[1])):
        summary.add_row(
            cause, _int(len(items)), _int(sum(b.tokens_lost for b in items)), _int(sum(b.repaired for b in items))
        )
    console.print(summary)
    shown = sorted(breaks, key=lambda b: -b.tokens_lost)[:limit]
    detail = _table(
        f"Breaks (largest {len(shown)} of {len(breaks)})",
        ["session", ">request", "first_divergent", "cause", ">tokens lost", ">repaired"],
    )
    for b in shown:
        session = b.session if b.against is None else f"{b.session} (vs {b.against})"
        repaired = "yes" if b.repaired else "no"
        detail.add_row(session, _int(b.request), b.first_divergent or "—", b.cause, _int(b.tokens_lost), repaired)
    console.print(detail)
    if len(breaks) > len(shown):
        console.print(f"… {_int(len(breaks) - len(shown))} more breaks not shown (--json lists all).")


def _render_misses(misses: list[MissRecord], console: Console, breaks: bool = False) -> None:
    """Misses grouped by arm (the report's arms first, in :data:`ARMS` order, then the --compare arms by name),
    within an arm by cause, most misses first (ties: most tokens lost), with tokens lost and rejected requests.
    ``breaks``: the report has prefix breaks (then "no misses" says what they are not)."""
    if not misses:
        console.print("No cache misses beyond the prefix breaks above." if breaks else "No cache misses.")
        return
    order = {arm: i for i, arm in enumerate(ARMS)}
    title = "Misses by arm and cause (" + (
        "simulated arms; reported: the upstream's usage)" if any(m.arm == "reported" for m in misses) else "simulated)"
    )
    table = _table(title, ["arm", "cause", ">misses", ">tokens lost", ">rejected"])

    def rank(g: MissGroup) -> tuple[int, str, int, int]:
        return order.get(g.arm, len(order)), g.arm, -g.count, -g.tokens_lost

    for g in sorted(group_misses(misses), key=rank):
        table.add_row(g.arm, g.cause, _int(g.count), _int(g.tokens_lost), _int(g.rejected))
    console.print(table)
    _render_upstream_losses([m for m in misses if m.arm == "reported"], console)


def _render_upstream_losses(misses: list[MissRecord], console: Console) -> None:
    """Each ``reported`` miss: tokens the upstream's reported usage did not read although the requests as sent
    could, with what they cost (USD beyond reading them) and the evidence."""
    if not misses:
        return
    usd = sum(m.usd_lost or 0.0 for m in misses)
    title = f"Reuse lost by the upstream (reported usage; {_usd(usd)} USD lost)"
    table = _table(title, ["session", ">request", "cause", ">tokens lost", ">USD lost", "detail"])
    for m in sorted(misses, key=lambda m: -m.tokens_lost):
        table.add_row(m.session, _int(m.request), m.cause, _int(m.tokens_lost), _usd(m.usd_lost or 0.0), m.detail)
    console.print(table)


def _render_fixes(report: AuditReport, console: Console) -> None:
    """What to do about each cause of the client's own traffic: its breaks and the ``as_sent`` arm's misses, most
    tokens lost first (the table the log audit uses, :data:`~._report_logs.FIXES`, its "agentcache does" claims
    checked against the ``agentcache`` arm: :func:`~._report_logs.fixes_for`)."""
    lost: dict[str, int] = defaultdict(int)
    for b in report.breaks:
        lost[b.cause] += b.tokens_lost
    for m in report.misses:
        if m.arm == "as_sent":
            lost[m.cause] += m.tokens_lost
    fixes = fixes_for(report)
    causes = [c for c in sorted(lost, key=lambda c: (-lost[c], c)) if c in fixes]
    if not causes:
        return
    console.print("[bold]What to do[/bold]")
    for cause in causes:
        console.print(f"  {cause}: {fixes[cause]}")
    console.print()


def _render_ttl(turns: list[TurnRecord], console: Console) -> None:
    """How the TTL policy chose (Anthropic only): requests per TTL with the latest reason for each."""
    groups = group_ttl(turns)
    if not groups:
        return
    table = _table("TTL choices (agentcache arm)", ["ttl", ">requests", "latest reason"])
    for g in groups:
        table.add_row(g.ttl, _int(g.requests), g.reason)
    console.print(table)


def _sessions_table(sessions: list[SessionReport], limit: int) -> Table:
    """The ``limit`` sessions with the largest as_sent − agentcache cost saving."""

    def saving(s: SessionReport) -> float:
        return s.arms["agentcache"].saved_against(s.arms["as_sent"])[0]

    top = sorted(sessions, key=saving, reverse=True)[:limit]
    table = _table(
        f"Top {_plural(len(top), 'session')} by saving (as_sent − agentcache)",
        [
            "session",
            ">requests",
            ">as_sent hit rate",
            ">agentcache hit rate",
            ">as_sent (USD)",
            ">agentcache (USD)",
            ">saved (USD)",
        ],
    )
    for s in top:
        sent, ours = s.arms["as_sent"], s.arms["agentcache"]
        table.add_row(
            s.session,
            _int(s.requests),
            _pct(sent.hit_rate),
            _pct(ours.hit_rate),
            _usd(sent.cost_usd),
            _usd(ours.cost_usd),
            _usd(saving(s)),
        )
    return table
