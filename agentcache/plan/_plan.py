"""``agentcache plan``: recorded traffic → hit rate, prefill, evictions and estimated TTFT for every swept
configuration of L1/L2/L3 capacity and eviction, the pre-launch checklist items the traffic answers, and the
``agentcache serve`` flags it calls for."""

from __future__ import annotations

from collections.abc import Callable, Sequence
from dataclasses import dataclass, field
from typing import Any

from .._exceptions import InputError
from ..engine import Prompt
from ..loaders import Record
from ._capacity import Size, resolve
from ._run import ConfigResult, CostModel, PlanConfig, percentile, schedule, simulate, turn_sharing
from ._tokens import BlockRenderer, Renderer

__all__ = ["PlanOptions", "PlanReport", "plan"]

#: A tier is worth adding when it raises the hit rate by more than this (absolute).
WORTH = 0.01


@dataclass(frozen=True, slots=True)
class PlanOptions:
    """What to sweep and how to time it.

    ``l1``/``l2``/``l3``: capacities in tokens to sweep (every combination; ``l2``/``l3`` may be a
    :class:`~._capacity.Ratio` of L1; an empty ``l1`` sweeps 1, 2, 4 and 8 x the largest prompt, capped at the
    working set).
    ``evictions``: ``lru``/``session``/``slot``. ``page_size``: tokens per page (SGLang ``--page-size``).
    ``rate``/``concurrency``: timing when records carry no ``at``. ``idle_timeout``: seconds before an idle session
    is closed (the proxy's default is 3600); ``close_at_end``: close a session after its last recorded request.
    ``cost``: the TTFT cost model, or None. ``kv_bytes``: KV bytes per token (for GB figures and the ``--l2``
    recommendation in GB). ``model``: the model name put in the recommended ``serve`` command.
    """

    l1: tuple[int, ...] = ()
    l2: tuple[Size, ...] = (0,)
    l3: tuple[Size, ...] = (0,)
    evictions: tuple[str, ...] = ("lru", "session")
    page_size: int = 64
    rate: float = 1.0
    concurrency: int = 4
    idle_timeout: float | None = 3600.0
    close_at_end: bool = True
    cost: CostModel | None = None
    kv_bytes: int | None = None
    model: str = "MODEL"


@dataclass(slots=True)
class PlanReport:
    """The planner's answer: one :class:`ConfigResult` per configuration plus what frames them."""

    configs: list[ConfigResult]
    tokens: str
    timing: str
    working_set_tokens: int
    unbounded_hit_rate: float
    sessions: int
    requests: int
    turn_share: tuple[int, int, int]
    assumptions: list[str]
    recommendations: list[dict[str, Any]]
    page_size: int
    kv_bytes: int | None
    errors: list[InputError] = field(default_factory=list)

    def checklist(self) -> list[dict[str, str]]:
        """The pre-launch checklist items (issue 13 / LMCache's guide) with what this traffic says of each."""
        turns, shared, total = self.turn_share
        items = [
            {
                "item": "tokens each turn shares with the previous one",
                "answer": f"{shared / total:.1%} ({shared:,} of {total:,} tokens over {turns:,} follow-up turns)"
                if total
                else "no session has two requests",
            },
            {
                "item": "prefix-cache hit rate and hit tokens",
                "answer": f"{self.unbounded_hit_rate:.1%} with unbounded cache; per config in the table",
            },
        ]
        timed = [c for c in self.configs if c.prefill_s is not None]
        if timed:
            worst = min(timed, key=lambda c: c.hit_rate)
            best = max(timed, key=lambda c: c.hit_rate)
            items.append(
                {
                    "item": "p50/p95/p99 TTFT (estimated)",
                    "answer": f"{_ttft(best)} at best ({_label(best.config)}), {_ttft(worst)} at worst "
                    f"({_label(worst.config)})",
                }
            )
            items.append({"item": "fetch KV from the cache vs prefill from scratch", "answer": _fetch_vs_prefill(best)})
        else:
            for item in ("p50/p95/p99 TTFT (estimated)", "fetch KV from the cache vs prefill from scratch"):
                items.append({"item": item, "answer": "give --prefill-tps (and --kv-bytes-per-token) to estimate"})
        tight = [c for c in self.configs if c.evicted_tokens]
        items.append(
            {
                "item": "is the working set evicted from HBM (L1)",
                "answer": f"working set {self.working_set_tokens:,} tokens"
                + (f" = {self.working_set_tokens * self.kv_bytes / 1e9:.1f} GB" if self.kv_bytes else "")
                + (
                    f"; evicted in {len(tight)} of {len(self.configs)} configs (L1 <= "
                    f"{max(c.config.l1_tokens for c in tight):,} tokens)"
                    if tight
                    else "; no config evicts"
                ),
            }
        )
        items.append(
            {
                "item": "does a cache-service timeout fall back to plain prefill",
                "answer": "not answerable from traffic: stop the L3 service under load and watch TTFT",
            }
        )
        return items

    def to_dict(self) -> dict[str, Any]:
        """The ``--json`` document: ``{"configs": [...], "checklist": [...], "recommendations": [...], ...}``."""
        return {
            "configs": [c.to_dict() for c in self.configs],
            "tokens": self.tokens,
            "timing": self.timing,
            "page_size": self.page_size,
            "kv_bytes_per_token": self.kv_bytes,
            "sessions": self.sessions,
            "requests": self.requests,
            "working_set_tokens": self.working_set_tokens,
            "unbounded_hit_rate": round(self.unbounded_hit_rate, 6),
            "checklist": self.checklist(),
            "recommendations": self.recommendations,
            "assumptions": self.assumptions,
        }


def _label(c: PlanConfig) -> str:
    tiers = [f"L1 {c.l1_tokens:,}"] + [f"{n} {v:,}" for n, v in (("L2", c.l2_tokens), ("L3", c.l3_tokens)) if v]
    return ", ".join(tiers) + f", {c.eviction}"


def _ttft(c: ConfigResult) -> str:
    return "/".join(f"{percentile(c.ttft_s, q):.2f}" for q in (50, 95, 99)) + " s"


def _fetch_vs_prefill(c: ConfigResult) -> str:
    fetched = c.l2_hit_tokens + c.l3_hit_tokens
    if not fetched:
        return f"no L2/L3 hits in the best config; prefill {c.prefill_s or 0:.1f} s in total"
    return (
        f"{fetched:,} tokens fetched from L2/L3 in {c.fetch_s or 0:.2f} s vs {c.prefill_tokens:,} prefilled in "
        f"{c.prefill_s or 0:.1f} s ({_label(c.config)})"
    )


def plan(
    records: Sequence[Record],
    options: PlanOptions,
    renderer: Renderer | None = None,
    progress: Callable[[int, int], None] | None = None,
) -> PlanReport:
    """Run the planner over ``records`` (any loader's, in time order). ``renderer`` turns a record into its token
    ids (default :class:`BlockRenderer`). ``progress(done, total)`` is called after each rendered record and each
    simulated configuration (``total``: the records, plus the simulations once their number is known). A record
    the renderer cannot read is skipped and listed in ``errors``. Raises ValueError for invalid options."""
    render = renderer if renderer is not None else BlockRenderer()
    tick = progress if progress is not None else _no_progress
    sessions: list[str] = []
    ats: list[float | None] = []
    prompts: list[Prompt] = []
    errors: list[InputError] = []
    for n, rec in enumerate(records, 1):
        try:
            prompts.append(render(rec))
        except InputError as exc:
            errors.append(exc if exc.source else InputError(str(exc), source=rec.source, record=rec.index))
            continue
        finally:
            tick(n, len(records))
        sessions.append(rec.session)
        ats.append(rec.at)
    steps, timing = schedule(sessions, ats, prompts, options.rate, options.concurrency)
    page = options.page_size
    total = sum(p.tokens for p in prompts)

    def run(config: PlanConfig) -> ConfigResult:
        return simulate(
            steps, config, page, idle_timeout=options.idle_timeout, close_at_end=options.close_at_end, cost=options.cost
        )

    unbounded = run(PlanConfig(max(total, page)))
    working = max(unbounded.peak.get("l1", 0), page)
    largest = -(-max((p.tokens for p in prompts), default=page) // page) * page
    l1s = options.l1 or tuple(sorted({min(largest * k, max(working, largest)) for k in (1, 2, 4, 8)}))
    sweep = [
        PlanConfig(l1, l2, l3, ev)
        for l1 in l1s
        for l2 in dict.fromkeys(resolve(v, l1) for v in options.l2)
        for l3 in dict.fromkeys(resolve(v, l1) for v in options.l3)
        for ev in options.evictions
    ]
    configs: list[ConfigResult] = []
    for config in sweep:
        configs.append(run(config))
        tick(len(records) + len(configs), len(records) + len(sweep))
    name = getattr(render, "name", type(render).__name__)
    return PlanReport(
        configs=configs,
        tokens=name,
        timing=timing,
        working_set_tokens=working,
        unbounded_hit_rate=unbounded.hit_rate,
        sessions=len(set(sessions)),
        requests=len(steps),
        turn_share=turn_sharing(steps),
        assumptions=_assumptions(options, name, timing),
        recommendations=_recommend(configs, options, working),
        page_size=page,
        kv_bytes=options.kv_bytes,
        errors=errors,
    )


def _assumptions(options: PlanOptions, tokens: str, timing: str) -> list[str]:
    """What the plan assumed, one sentence each: the token source, time, page size, sessions, cost model."""
    assumptions = [f"tokens: {tokens}", f"time: {timing}", f"page size {options.page_size} tokens (SGLang --page-size)"]
    assumptions.append(
        "sessions close after their last recorded request (the proxy posts /close_session)"
        if options.close_at_end
        else "sessions stay open until idle"
    )
    if options.idle_timeout is not None:
        assumptions.append(f"idle sessions close after {options.idle_timeout:g} s (the proxy's --idle-timeout)")
    assumptions.append("one request at a time; generated tokens are not inserted; decode is not modelled")
    if options.cost is not None:
        c = options.cost
        assumptions.append(
            f"cost model: prefill {c.prefill_tps:g} tokens/s, L2 fetch {c.l2_gbps:g} GB/s, L3 fetch {c.l3_gbps:g} "
            f"GB/s, {c.kv_bytes or 'unknown'} KV bytes/token, one engine in arrival order (all assumed unless "
            "measured on the target GPU); done: requests whose first token comes before the last request arrives "
            "(completed within the trace's span, so the last request never counts)"
        )
    return assumptions


def _recommend(configs: list[ConfigResult], options: PlanOptions, working: int) -> list[dict[str, Any]]:
    """Per swept L1 (the GPU's KV pool is given by the hardware): the smallest tiers within :data:`WORTH` of
    the best hit rate, as ``agentcache serve`` flags (``--l2`` a ratio of L1 or GB; ``--l3 file:DIR``)."""
    out: list[dict[str, Any]] = []
    eviction = "session" if "session" in options.evictions else options.evictions[0]
    for l1 in dict.fromkeys(c.config.l1_tokens for c in configs):
        group = [c for c in configs if c.config.l1_tokens == l1 and c.config.eviction == eviction]
        best = max(c.hit_rate for c in group)
        good = [c for c in group if c.hit_rate >= best - WORTH]
        pick = min(good, key=lambda c: (c.config.l3_tokens > 0, c.config.l2_tokens, c.config.l3_tokens))
        flags: list[str] = []
        l2, l3 = pick.config.l2_tokens, pick.config.l3_tokens
        if l2:
            if options.kv_bytes:
                flags += ["--l2", f"{max(1, round(l2 * options.kv_bytes / 1e9))}GB"]
            else:
                flags += ["--l2", f"{l2 / l1:g}"]
        if l3:
            flags += ["--l3", "file:DIR"]
        why_l2 = "L2 as a ratio of the GPU KV pool" if not options.kv_bytes and l2 else ""
        reason = (
            f"L1 {l1:,} tokens holds the working set ({working:,})"
            if not flags and l1 >= working
            else f"hit rate {pick.hit_rate:.1%}; best swept {best:.1%}"
        )
        command = " ".join(["agentcache", "serve", options.model, *flags])
        out.append({"l1_tokens": l1, "command": command, "hit_rate": round(pick.hit_rate, 6), "why": reason})
        if why_l2:
            out[-1]["note"] = why_l2
    return out


def _no_progress(done: int, total: int) -> None:
    """The ``progress`` callback when none is given."""
