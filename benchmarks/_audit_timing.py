"""The tau-bench audit timed on its own and printed as JSON: ``python benchmarks/_audit_timing.py``.

Uses only what every agentcache version has (``agentcache.audit``, ``agentcache.loaders.load``, the token
memo), so ``audit_bench.py --baseline PYTHON`` can run it with another checkout's interpreter and compare.
"""

from __future__ import annotations

import gc
import json
import sys
import time
from pathlib import Path

from agentcache import audit
from agentcache.loaders import load

try:
    from agentcache.model._tokens import default_counter, reset_default_counter
except ImportError:  # a checkout from before agentcache.model
    from agentcache._tokens import default_counter, reset_default_counter  # type: ignore[no-redef]

TAU = Path(__file__).resolve().parent.parent / "data" / "tau-bench" / "gpt-4o-airline.json"


def main() -> None:
    records = load(TAU).records
    out = []
    for provider in ("anthropic", "openai"):
        reset_default_counter()
        assert default_counter().exact
        gc.collect()
        t0 = time.perf_counter()
        audit(records, provider)
        cold = time.perf_counter() - t0
        warm = []
        for _ in range(int(sys.argv[1]) if len(sys.argv) > 1 else 3):
            gc.collect()
            t0 = time.perf_counter()
            audit(records, provider)
            warm.append(time.perf_counter() - t0)
        out.append({"provider": provider, "cold_s": cold, "warm_best_s": min(warm), "warm_runs_s": warm})
    print(json.dumps(out))


if __name__ == "__main__":
    main()
