"""The planner's terminal output: one table row per configuration, the checklist, the recommended ``serve``
flags and the assumptions behind the figures."""

from __future__ import annotations

from rich.console import Console
from rich.table import Table

from ._plan import PlanReport
from ._run import percentile

__all__ = ["render_plan"]


def _tokens(n: int) -> str:
    return "-" if not n else f"{n:,}"


def render_plan(report: PlanReport, console: Console) -> None:
    """Print ``report`` on ``console``."""
    console.print(
        f"agentcache plan: {report.requests:,} requests in {report.sessions:,} sessions; working set "
        f"{report.working_set_tokens:,} tokens; unbounded hit rate {report.unbounded_hit_rate:.1%}"
    )
    timed = any(c.prefill_s is not None for c in report.configs)
    table = Table(show_edge=False, pad_edge=False)
    for name in ("L1", "L2", "L3", "eviction", "hit rate", "L1 hit", "L2 hit", "L3 hit", "prefill", "evicted"):
        table.add_column(name, justify="left" if name == "eviction" else "right")
    if timed:
        for name in ("TTFT p50/p95/p99 s", "done"):
            table.add_column(name, justify="right")
    for c in report.configs:
        cfg = c.config
        row = [
            f"{cfg.l1_tokens:,}",
            _tokens(cfg.l2_tokens),
            _tokens(cfg.l3_tokens),
            cfg.eviction,
            f"{c.hit_rate:.1%}",
            _tokens(c.l1_hit_tokens),
            _tokens(c.l2_hit_tokens),
            _tokens(c.l3_hit_tokens),
            f"{c.prefill_tokens:,}",
            _tokens(c.evicted_tokens),
        ]
        if timed:
            row += [
                "/".join(f"{percentile(c.ttft_s, q):.2f}" for q in (50, 95, 99)),
                f"{c.completed}/{c.requests}",
            ]
        table.add_row(*row)
    console.print(table)
    console.print("\nPre-launch checklist")
    for item in report.checklist():
        console.print(f"  - {item['item']}: {item['answer']}")
    console.print("\nRecommended")
    for rec in report.recommendations:
        console.print(f"  L1 {rec['l1_tokens']:,} tokens: {rec['command']}  ({rec['why']})")
    console.print("\nAssumptions")
    for line in report.assumptions:
        console.print(f"  - {line}")
