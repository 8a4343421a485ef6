"""Replaying recorded traffic through the tiered radix tree: the schedule, the cost model and one result per
configuration.

Time: the records' ``at`` when every record has one; otherwise ``rate`` requests per second with
``concurrency`` sessions in flight (session ``k`` runs on lane ``k mod concurrency``, lanes take turns request
by request), which is an assumption the report states. Sessions are closed (their references released, as the
agentcache proxy's ``/close_session`` does) after their last recorded request when ``close_at_end``, and when
idle for ``idle_timeout`` seconds.

Cost model (optional, all inputs are assumptions unless measured on the target): one engine serving requests in
arrival order; a request's time to first token is its wait plus ``prefill tokens / prefill_tps`` plus the KV it
loads from L2 and L3 (``tokens x kv_bytes / bandwidth``). Decode, batching and chunked prefill are not modelled.
``completed``: requests whose first token comes before the last request arrives (the trace's span), as a run of
fixed length counts them.
"""

from __future__ import annotations

import math
from collections.abc import Sequence
from dataclasses import dataclass, field
from typing import Any

from ..engine import Access, Prompt, TieredRadixCache, shared_prefix

__all__ = ["ConfigResult", "CostModel", "PlanConfig", "Step", "percentile", "schedule", "simulate"]


@dataclass(frozen=True, slots=True)
class Step:
    """One request in replay order: arrival ``at`` (seconds), ``session``, its ``prompt``, and ``last``: the
    session's last recorded request."""

    at: float
    session: str
    prompt: Prompt
    last: bool = False


def schedule(
    sessions: Sequence[str], ats: Sequence[float | None], prompts: Sequence[Prompt], rate: float, concurrency: int
) -> tuple[list[Step], str]:
    """The replay order of requests given in recorded order, and a description of where time came from.

    Raises ValueError for a non-positive ``rate`` or ``concurrency``."""
    if rate <= 0 or concurrency < 1:
        raise ValueError("--rate must be positive and --concurrency at least 1")
    n = len(prompts)
    last_of: dict[str, int] = {s: i for i, s in enumerate(sessions)}
    if n and all(a is not None for a in ats):
        order = sorted(range(n), key=lambda i: (ats[i], i))
        steps = [Step(float(ats[i] or 0.0), sessions[i], prompts[i], last_of[sessions[i]] == i) for i in order]
        return steps, "the records' timestamps (at)"
    by_session: dict[str, list[int]] = {}
    for i, s in enumerate(sessions):
        by_session.setdefault(s, []).append(i)
    lanes: list[list[int]] = [[] for _ in range(concurrency)]
    for k, idx in enumerate(by_session.values()):
        lanes[k % concurrency].extend(idx)
    order = []
    depth = max((len(lane) for lane in lanes), default=0)
    for j in range(depth):
        order += [lane[j] for lane in lanes if j < len(lane)]
    steps = [Step(t / rate, sessions[i], prompts[i], last_of[sessions[i]] == i) for t, i in enumerate(order)]
    return steps, f"assumed: {rate:g} requests/s, {concurrency} sessions in flight (records carry no timestamps)"


@dataclass(frozen=True, slots=True)
class PlanConfig:
    """One configuration: tier capacities in tokens (0: no tier; an L1 of 0: no prefix cache) and the L1
    eviction (``lru``, ``session`` or ``slot``)."""

    l1_tokens: int
    l2_tokens: int = 0
    l3_tokens: int = 0
    eviction: str = "lru"


@dataclass(frozen=True, slots=True)
class CostModel:
    """The TTFT estimate's inputs: ``prefill_tps`` prompt tokens/s of one engine; ``kv_bytes`` per token (None:
    loads from L2/L3 are not costed); ``l2_gbps``/``l3_gbps`` fetch bandwidth in GB/s (10^9 bytes)."""

    prefill_tps: float
    kv_bytes: int | None = None
    l2_gbps: float = 20.0
    l3_gbps: float = 2.0

    def times(self, access: Access) -> tuple[float, float]:
        """``(prefill seconds, fetch seconds)`` of one request."""
        prefill = access.prefill / self.prefill_tps
        if self.kv_bytes is None:
            return prefill, 0.0
        fetch = access.l2 * self.kv_bytes / (self.l2_gbps * 1e9) + access.l3 * self.kv_bytes / (self.l3_gbps * 1e9)
        return prefill, fetch


@dataclass(slots=True)
class ConfigResult:
    """The totals of one configuration over the whole replay (tokens, seconds)."""

    config: PlanConfig
    requests: int = 0
    prompt_tokens: int = 0
    l1_hit_tokens: int = 0
    l2_hit_tokens: int = 0
    l3_hit_tokens: int = 0
    prefill_tokens: int = 0
    evicted_tokens: int = 0
    peak: dict[str, int] = field(default_factory=dict)
    prefill_s: float | None = None
    fetch_s: float | None = None
    ttft_s: list[float] = field(default_factory=list)
    completed: int | None = None

    @property
    def hit_tokens(self) -> int:
        """Prompt tokens reused from any tier."""
        return self.l1_hit_tokens + self.l2_hit_tokens + self.l3_hit_tokens

    @property
    def hit_rate(self) -> float:
        """Reused / prompt tokens (0 for no traffic)."""
        return self.hit_tokens / self.prompt_tokens if self.prompt_tokens else 0.0

    def to_dict(self) -> dict[str, Any]:
        """The JSON form (``configs[]`` of ``agentcache plan --json``)."""
        c = self.config
        out: dict[str, Any] = {
            "l1_tokens": c.l1_tokens,
            "l2_tokens": c.l2_tokens,
            "l3_tokens": c.l3_tokens,
            "eviction": c.eviction,
            "requests": self.requests,
            "prompt_tokens": self.prompt_tokens,
            "hit_rate": round(self.hit_rate, 6),
            "hit_tokens": self.hit_tokens,
            "l1_hit_tokens": self.l1_hit_tokens,
            "l2_hit_tokens": self.l2_hit_tokens,
            "l3_hit_tokens": self.l3_hit_tokens,
            "prefill_tokens": self.prefill_tokens,
            "evicted_tokens": self.evicted_tokens,
            "peak_tokens": dict(self.peak),
        }
        if self.prefill_s is not None:
            out["prefill_s"] = round(self.prefill_s, 6)
            out["fetch_s"] = round(self.fetch_s or 0.0, 6)
            out["ttft_s"] = {f"p{q}": round(percentile(self.ttft_s, q), 6) for q in (50, 95, 99)}
            out["completed_requests"] = self.completed
        return out


def percentile(values: Sequence[float], q: float) -> float:
    """The ``q``-th percentile (nearest rank) of ``values``; 0.0 for none."""
    if not values:
        return 0.0
    ordered = sorted(values)
    return ordered[max(0, math.ceil(q / 100 * len(ordered)) - 1)]


def simulate(
    steps: Sequence[Step],
    config: PlanConfig,
    page_size: int,
    *,
    idle_timeout: float | None = 3600.0,
    close_at_end: bool = True,
    cost: CostModel | None = None,
) -> ConfigResult:
    """Replay ``steps`` through one :class:`TieredRadixCache` built from ``config``; see the module docstring.
    ``config.l1_tokens`` 0 is no prefix cache at all (SGLang ``--disable-radix-cache``): every token is
    prefilled."""
    tree = (
        TieredRadixCache(page_size, config.l1_tokens, config.l2_tokens, config.l3_tokens, config.eviction)
        if config.l1_tokens
        else None
    )
    result = ConfigResult(config)
    last_seen: dict[str, float] = {}
    busy_until = 0.0
    prefill_s = fetch_s = 0.0
    end = steps[-1].at if steps else 0.0
    completed = 0
    for step in steps:
        if tree is None:
            n = step.prompt.tokens
            access = Access(n, 0, 0, 0, n, 0)
        else:
            if idle_timeout is not None:
                for s in [s for s, t in last_seen.items() if step.at - t > idle_timeout]:
                    tree.release(s)
                    del last_seen[s]
            access = tree.request(step.prompt.page_keys(page_size), step.prompt.tokens, step.session)
        result.requests += 1
        result.prompt_tokens += access.prompt
        result.l1_hit_tokens += access.l1
        result.l2_hit_tokens += access.l2
        result.l3_hit_tokens += access.l3
        result.prefill_tokens += access.prefill
        if cost is not None:
            p, f = cost.times(access)
            prefill_s += p
            fetch_s += f
            start = max(step.at, busy_until)
            busy_until = start + p + f
            result.ttft_s.append(busy_until - step.at)
            completed += end <= 0 or busy_until <= end  # first token within the trace's span
        if tree is None:
            continue
        if step.last and close_at_end:
            tree.release(step.session)
            last_seen.pop(step.session, None)
        else:
            last_seen[step.session] = step.at
    result.evicted_tokens = tree.evicted_tokens if tree is not None else 0
    result.peak = dict(tree.peak) if tree is not None else {}
    if cost is not None:
        result.prefill_s, result.fetch_s, result.completed = prefill_s, fetch_s, completed
    return result


def turn_sharing(steps: Sequence[Step]) -> tuple[int, int, int]:
    """``(turns after a session's first, tokens they share with the session's previous request, their prompt
    tokens)``: checklist item 1."""
    prev: dict[str, Prompt] = {}
    turns = shared = total = 0
    for step in steps:
        before = prev.get(step.session)
        if before is not None:
            turns += 1
            shared += shared_prefix(before, step.prompt)
            total += step.prompt.tokens
        prev[step.session] = step.prompt
    return turns, shared, total
