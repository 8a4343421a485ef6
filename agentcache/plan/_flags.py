"""``agentcache plan``'s command-line values → :class:`~._plan.PlanOptions` (the CLI stays a thin door)."""

from __future__ import annotations

from pathlib import Path

from .._exceptions import ConfigError
from ..engine import EVICTIONS
from ._capacity import Ratio, kv_bytes_from_config, parse_sizes
from ._plan import PlanOptions
from ._run import CostModel

__all__ = ["options_from_flags"]


def options_from_flags(
    *,
    l1: str | None,
    l2: str | None,
    l3: str | None,
    eviction: str,
    page_size: int,
    kv_bytes_per_token: int | None,
    model_config: Path | None,
    rate: float,
    concurrency: int,
    idle_timeout: float,
    close_at_end: bool,
    prefill_tps: float | None,
    l2_gbps: float,
    l3_gbps: float,
    model: str,
) -> PlanOptions:
    """The planner's options from the flags' text. Raises ConfigError (one line naming the flag) for bad
    values. ``idle_timeout`` 0 never closes idle sessions."""
    kv = kv_bytes_per_token
    if kv is None and model_config is not None:
        kv = kv_bytes_from_config(model_config)
    if kv is not None and kv <= 0:
        raise ConfigError(f"--kv-bytes-per-token {kv}: must be positive")
    evictions = tuple(e.strip() for e in eviction.split(",") if e.strip())
    bad = [e for e in evictions if e not in EVICTIONS]
    if bad or not evictions:
        raise ConfigError(f"--eviction {eviction!r}: expected a list of {', '.join(EVICTIONS)}")
    if page_size < 1:
        raise ConfigError(f"--page-size {page_size}: must be at least 1")
    if rate <= 0 or concurrency < 1:
        raise ConfigError("--rate must be positive and --concurrency at least 1")
    l1s: list[int] = []
    for size in parse_sizes(l1, "--l1-tokens", kv) if l1 else []:
        if isinstance(size, Ratio) or size < page_size:
            raise ConfigError(f"--l1-tokens {l1!r}: every L1 must hold at least one page ({page_size} tokens)")
        l1s.append(size)
    cost = None
    if prefill_tps is not None:
        if prefill_tps <= 0 or l2_gbps <= 0 or l3_gbps <= 0:
            raise ConfigError("--prefill-tps, --l2-gbps and --l3-gbps must be positive")
        cost = CostModel(prefill_tps, kv, l2_gbps, l3_gbps)
    return PlanOptions(
        l1=tuple(l1s),
        l2=tuple(parse_sizes(l2, "--l2-tokens", kv, ratio=True)),
        l3=tuple(parse_sizes(l3, "--l3-tokens", kv, ratio=True)),
        evictions=evictions,
        page_size=page_size,
        rate=rate,
        concurrency=concurrency,
        idle_timeout=idle_timeout or None,
        close_at_end=close_at_end,
        cost=cost,
        kv_bytes=kv,
        model=model,
    )
