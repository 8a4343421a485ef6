"""Replay results: per-config totals (requests completed, errors, prompt and cached tokens as the server
reported them, TTFT p50/p95/p99, total time), as a rich table, a Markdown table and JSON."""

from __future__ import annotations

from collections.abc import Sequence
from dataclasses import dataclass, field
from typing import Any

from rich.console import Console
from rich.table import Table

from ._client import TurnResult

__all__ = ["COLUMNS", "ReplayResult", "markdown_table", "percentile", "render_table"]


def percentile(values: Sequence[float], q: float) -> float | None:
    """The ``q``-th percentile (0–100) with linear interpolation between closest ranks; None when empty."""
    if not values:
        return None
    ordered = sorted(values)
    pos = (len(ordered) - 1) * q / 100
    lo = int(pos)
    hi = min(lo + 1, len(ordered) - 1)
    return ordered[lo] + (ordered[hi] - ordered[lo]) * (pos - lo)


@dataclass(slots=True)
class ReplayResult:
    """One config's replay: its ``label``, the ``config`` it ran with, every request's :class:`TurnResult`
    (sessions in order, turns in order) and the wall-clock ``total_s``."""

    label: str
    config: dict[str, Any]
    turns: list[TurnResult] = field(default_factory=list)
    total_s: float = 0.0

    @property
    def completed(self) -> int:
        return sum(1 for t in self.turns if t.ok)

    @property
    def errors(self) -> int:
        return sum(1 for t in self.turns if not t.ok)

    @property
    def prompt_tokens(self) -> int:
        return sum(t.prompt_tokens or 0 for t in self.turns if t.ok)

    @property
    def cached_tokens(self) -> int:
        return sum(t.cached_tokens or 0 for t in self.turns if t.ok)

    @property
    def hit_rate(self) -> float:
        return self.cached_tokens / self.prompt_tokens if self.prompt_tokens else 0.0

    def prediction(self) -> dict[str, Any] | None:
        """How the engine model's ``predicted_cached_tokens`` compare with the ``cached_tokens`` the engine
        reported, over completed turns that have both: ``turns``, ``equal`` (turns predicted exactly),
        ``equal_rate``, ``predicted_cached_tokens``, ``reported_cached_tokens`` and ``total_error`` (predicted /
        reported - 1; None when nothing was reported); ``unpredicted``: completed turns without a prediction
        (every slot busy when sent: the server queued them). None when no turn was predicted."""
        pairs = [
            (t.predicted_cached_tokens, t.cached_tokens or 0)
            for t in self.turns
            if t.ok and t.predicted_cached_tokens is not None
        ]
        if not pairs:
            return None
        predicted = sum(p for p, _ in pairs)
        reported = sum(r for _, r in pairs)
        equal = sum(1 for p, r in pairs if p == r)
        return {
            "turns": len(pairs),
            "unpredicted": sum(1 for t in self.turns if t.ok and t.predicted_cached_tokens is None),
            "equal": equal,
            "equal_rate": round(equal / len(pairs), 6),
            "predicted_cached_tokens": predicted,
            "reported_cached_tokens": reported,
            "total_error": round(predicted / reported - 1, 6) if reported else None,
        }

    def ttft(self, q: float, *, later_only: bool = False) -> float | None:
        """TTFT percentile in seconds over completed requests (``later_only``: turns after each session's first)."""
        return percentile(
            [t.ttft_s for t in self.turns if t.ok and t.ttft_s is not None and (t.turn or not later_only)], q
        )

    def to_dict(self) -> dict[str, Any]:
        """JSON-ready summary plus every request."""
        return {
            "label": self.label,
            "config": self.config,
            "requests": len(self.turns),
            "completed": self.completed,
            "errors": self.errors,
            "prompt_tokens": self.prompt_tokens,
            "cached_tokens": self.cached_tokens,
            "hit_rate": round(self.hit_rate, 6),
            "prediction": self.prediction(),
            "ttft_s": {f"p{q}": _round(self.ttft(q)) for q in (50, 95, 99)},
            "ttft_later_turns_s": {f"p{q}": _round(self.ttft(q, later_only=True)) for q in (50, 95, 99)},
            "total_s": round(self.total_s, 3),
            "turns": [t.to_dict() for t in self.turns],
        }


def _round(value: float | None) -> float | None:
    return None if value is None else round(value, 4)


#: Table columns: header and how each cell is drawn.
COLUMNS: tuple[str, ...] = (
    "config", "completed", "errors", "prompt tok", "cached tok", "cached %",
    "TTFT p50", "TTFT p95", "TTFT p99", "total",
)  # fmt: skip


def _secs(value: float | None) -> str:
    return "—" if value is None else f"{value:.2f}s"


def _row(result: ReplayResult) -> list[str]:
    return [
        result.label,
        f"{result.completed}/{len(result.turns)}",
        str(result.errors),
        f"{result.prompt_tokens:,}",
        f"{result.cached_tokens:,}",
        f"{result.hit_rate * 100:.1f}%",
        _secs(result.ttft(50)),
        _secs(result.ttft(95)),
        _secs(result.ttft(99)),
        f"{result.total_s:.1f}s",
    ]


def render_table(results: Sequence[ReplayResult], console: Console, title: str = "agentcache replay") -> None:
    """Print one row per config."""
    table = Table(title=title, title_justify="left")
    for i, name in enumerate(COLUMNS):
        table.add_column(name, justify="left" if i == 0 else "right", no_wrap=i == 0)
    for result in results:
        table.add_row(*_row(result))
    console.print(table)
    for result in results:
        for turn in result.turns:
            if turn.error:
                console.print(
                    f"[dim]{result.label}: {turn.session} turn {turn.turn}: {turn.error}[/dim]", highlight=False
                )
                break


def markdown_table(results: Sequence[ReplayResult]) -> str:
    """The same rows as a Markdown table."""
    lines = ["| " + " | ".join(COLUMNS) + " |", "|" + "|".join(["---"] + ["---:"] * (len(COLUMNS) - 1)) + "|"]
    lines += ["| " + " | ".join(_row(r)) + " |" for r in results]
    return "\n".join(lines)
