"""The terminal form of an audit of agents' own logs (:class:`~agentcache.AuditReport` with ``mode = "reported"``).

Sections: what was read (per agent), the totals of the ``reported`` and ``agentcache`` arms, where the reported
input spend went (reads, writes by kind, uncached), the misses per cause with what agentcache saves on them and
what to do, the chosen breakdowns (``--by``: day, project, model, client, session), and the sessions that lost the
most. Causes read from logs are inferred (no request bodies): the header of that table says so.
"""

from __future__ import annotations

import datetime as dt
from collections.abc import Sequence

from rich.console import Console
from rich.table import Table

from ._fmt import _int, _pct, _plural, _table, _usd
from ._render import _render_unknown_models
from ._report import ArmMetrics, AuditReport, SessionReport
from ._report_logs import FIXES, SPEND, SPEND_LABELS, CauseRow, GroupRow, NotWorthIt, not_worth_it

__all__ = ["DEFAULT_BY", "render_logs_report"]

#: Breakdowns shown when ``--by`` is not given.
DEFAULT_BY = ("day", "session")


def render_logs_report(
    report: AuditReport, console: Console, by: Sequence[str] = DEFAULT_BY, top_sessions: int = 10
) -> None:
    """Print ``report`` (an audit of agents' logs) to ``console`` (see the module docstring)."""
    _header(report, console)
    console.print(_totals(report.totals))
    worse = not_worth_it(report.sessions)
    if worse is not None:
        console.print(worse.text(), highlight=False)
        console.print(
            f"  {', '.join(_short(k) for k in worse.sessions[:5])}" + (", …" if len(worse.sessions) > 5 else "")
        )
    _spend(report, console)
    _causes(report.causes, console, worse)
    for kind in by:
        if kind == "session":
            _sessions(report.sessions, console, top_sessions)
        elif report.groups.get(kind):
            _group(kind, report.groups[kind], console)


def _header(report: AuditReport, console: Console) -> None:
    calls = report.totals["reported"].requests
    console.print(
        f"[bold]agentcache audit[/bold]: {_plural(len(report.sessions), 'session')}, {_plural(calls, 'API call')} "
        "from agents' own logs (usage as the provider reported it)"
    )
    for src in report.sources:
        where = ", ".join(src.roots)
        errors = f", {_plural(src.errors, 'unreadable line')}" if src.errors else ""
        console.print(
            f"  {src.client}: {_plural(src.sessions, 'session')}, {_plural(src.calls, 'call')} in "
            f"{_plural(src.files, 'file')} ({where}){errors}"
        )
        if src.leaves_out:
            console.print(f"    not in these logs: {src.leaves_out}")
        if src.caveat:
            console.print(f"    [yellow]{src.caveat}[/yellow]")
    _render_unknown_models(report.models, console)
    days = [row.key for row in report.groups.get("day", []) if row.key != "unknown"]
    if days:
        console.print(f"  from {days[0]} to {days[-1]} (UTC)")


def _totals(totals: dict[str, ArmMetrics]) -> Table:
    table = _table(
        "Totals (agentcache: its TTL policy and keep-warm on the same pauses)",
        ["arm", ">calls", ">prompt", ">read", ">write", ">uncached", ">hit rate", ">USD", ">saved"],
    )
    base = totals["reported"]
    for arm, m in totals.items():
        saved = "—"
        if arm != "reported":
            diff, share = m.saved_against(base)
            saved = _usd(diff) + (f" ({share * 100:.1f}%)" if share is not None else "")
        row = [arm, _int(m.requests), _int(m.prompt_tokens), _int(m.cache_read_tokens)]
        row += [_int(m.cache_write_tokens), _int(m.uncached_tokens), _pct(m.hit_rate), _usd(m.cost_usd), saved]
        table.add_row(*row)
    return table


def _spend(report: AuditReport, console: Console) -> None:
    total = sum(report.spend.values())
    if not total:
        return
    table = _table("Where the reported input spend went", ["part", ">USD", ">share"])
    for key in SPEND:
        value = report.spend.get(key, 0.0)
        if value:
            table.add_row(SPEND_LABELS[key], _usd(value), _pct(value / total))
    console.print(table)


def _causes(causes: list[CauseRow], console: Console, worse: NotWorthIt | None = None) -> None:
    """The misses per cause and what to do (``worse``: where the what-if levers cost more; in all, their causes'
    fix is not recommended)."""
    if not causes:
        console.print("No cache misses in the reported usage: every call read what its session had cached.")
        return
    total, inferred = sum(c.misses for c in causes), sum(c.misses - c.diagnosed for c in causes)
    if inferred == total:
        how = "inferred from the logs: they keep no request bodies"
    else:
        how = f"{inferred:,} of {total:,} inferred from the logs, the others from the request bodies or the provider"
    table = _table(f"Misses by cause ({how})", ["cause", ">misses", ">tokens lost", ">USD lost", ">agentcache saves"])
    for c in causes:
        saves = _usd(c.saved_usd) if c.saved_by else "—"
        if c.saved_by:
            saves += " (" + ", ".join(f"{k.replace('_', '-')} {_usd(v)}" for k, v in c.saved_by.items()) + ")"
        table.add_row(c.cause, _int(c.misses), _int(c.tokens_lost), _usd(c.usd_lost), saves)
    console.print(table)
    console.print("[bold]What to do[/bold]")
    for c in causes:
        fix = (worse.fix(c.cause) if worse is not None else None) or FIXES.get(c.cause)
        if fix:
            console.print(f"  {c.cause}: {fix}")
    console.print()


def _group(kind: str, rows: list[GroupRow], console: Console, limit: int = 31) -> None:
    shown = rows[-limit:] if kind == "day" else rows[:limit]
    title = f"By {kind}" + (f" (last {len(shown)} of {len(rows)})" if len(shown) < len(rows) else "")
    table = _table(title, [kind, ">sessions", ">calls", ">hit rate", ">reported USD", ">agentcache USD", ">USD lost"])
    for row in shown:
        rep, ours = row.arms["reported"], row.arms["agentcache"]
        cells = [row.key, _int(row.sessions), _int(rep.requests), _pct(rep.hit_rate), _usd(rep.cost_usd)]
        table.add_row(*cells, _usd(ours.cost_usd), _usd(row.usd_lost))
    console.print(table)


def _sessions(sessions: list[SessionReport], console: Console, limit: int) -> None:
    top = sorted(sessions, key=lambda s: (-s.usd_lost, -s.arms["reported"].cost_usd))[:limit]
    if not top:
        return
    # Without a miss, the sessions that cost most (a user who asked --by session still gets the table).
    ranked = "USD lost to misses" if top[0].usd_lost else "reported USD"
    clients = len({s.client for s in sessions}) > 1  # one agent's logs: no client column
    columns = ["session", *(["client"] if clients else []), "started", ">calls", ">hit rate", ">reported USD"]
    table = _table(f"Top {_plural(len(top), 'session')} by {ranked}", [*columns, ">USD lost", ">agentcache USD"])
    for s in top:
        rep, ours = s.arms["reported"], s.arms["agentcache"]
        started = dt.datetime.fromtimestamp(s.started, dt.UTC).strftime("%m-%d %H:%M") if s.started else "—"
        name = _short(s.session) + (" (subagent)" if s.parent is not None else "")
        cells = [name, *([s.client or "—"] if clients else []), started, _int(s.requests), _pct(rep.hit_rate)]
        table.add_row(*cells, _usd(rep.cost_usd), _usd(s.usd_lost), _usd(ours.cost_usd))
    console.print(table)


def _short(session: str, width: int = 20) -> str:
    """A session id short enough for a table column: its start and end (ids are unique at both ends)."""
    return session if len(session) <= width else f"{session[: width // 2 - 1]}…{session[-(width // 2 - 1) :]}"
