"""Benchmark: audit of the bundled tau-bench file, and the per-turn cost of identity + diff.

Usage::

    python benchmarks/audit_bench.py [--json OUT] [--quick]

Part 1 audits ``data/tau-bench/gpt-4o-airline.json`` (200 sessions, 2,454 requests) under the Anthropic and
OpenAI rules: load time, tiktoken encoder load, a cold audit (empty token memo), the best of 3 warm audits,
requests/s and peak RSS.

Part 2 replays a 200-message, ~100K-token session stitched from real tau-bench messages (see ``_synth.py``),
one request per assistant turn, in both wire forms (OpenAI Chat Completions and Anthropic Messages). Each
pass starts with a fresh token memo and sends the turns in order, as a proxy would, so every turn tokenises
only the blocks that are new in it. Per turn it times ``json.loads`` of the wire bytes, ``canonicalize``,
``diagnose`` against the previous request, ``plan_repairs``, ``plan_breakpoints`` (+ ``with_markers``) and
``SessionMemory.remember``, and counts the blocks tokenised (token-memo growth). It also times a second
``canonicalize`` of the same body with every block already memoised (the part that does not depend on
tokenisation). Figures are medians / percentiles over the passes.

Part 3 profiles the full pipeline on the 200-message turn with cProfile.

All times come from ``time.perf_counter_ns``; the garbage collector stays enabled (a proxy runs with it),
and ``gc.collect()`` runs before every pass.
"""

from __future__ import annotations

import argparse
import cProfile
import datetime as dt
import gc
import json
import math
import os
import platform
import pstats
import resource
import statistics
import sys
import time
from collections.abc import Callable, Sequence
from dataclasses import asdict, dataclass, field
from pathlib import Path
from typing import Any, TypeVar

import _synth

from agentcache import CanonicalRequest, audit, diagnose
from agentcache._canonical import with_markers
from agentcache._pricing import anthropic_rules, default_model
from agentcache._repair import SessionMemory, plan_repairs
from agentcache._tokens import TokenCounter, default_counter, reset_default_counter
from agentcache.adapters import apply, canonicalize
from agentcache.loaders import Record, load
from agentcache.policies import plan_breakpoints

T = TypeVar("T")
CHECKPOINTS = (10, 50, 100, 200)
STEPS = ("json_loads", "canonicalize", "diagnose", "plan_repairs", "plan_breakpoints", "remember")
FORMATS = (("openai.chat", _synth.openai_bodies), ("anthropic.messages", _synth.anthropic_bodies))


def now_ns() -> int:
    return time.perf_counter_ns()


def peak_rss_mib() -> float:
    """Peak resident set size of this process so far (Linux reports KiB)."""
    return resource.getrusage(resource.RUSAGE_SELF).ru_maxrss / 1024


def pct(values: Sequence[float], p: float) -> float:
    """Nearest-rank percentile."""
    s = sorted(values)
    return s[max(0, math.ceil(p / 100 * len(s)) - 1)]


def ms(ns: float) -> float:
    return ns / 1e6


def timed(fn: Callable[[], T]) -> tuple[T, int]:
    t0 = now_ns()
    out = fn()
    return out, now_ns() - t0


# ---- part 1: audit of the tau-bench file ---------------------------------------------------------------


@dataclass(slots=True)
class AuditFigures:
    provider: str
    requests: int
    sessions: int
    cold_s: float
    warm_best_s: float
    warm_runs_s: list[float]
    requests_per_s: float
    memo_blocks: int
    peak_rss_mib: float


def bench_audit(records: list[Record], provider: str, repeats: int) -> AuditFigures:
    reset_default_counter()
    counter = default_counter()
    assert counter.exact, "tiktoken encoder unavailable: figures would be byte estimates"
    gc.collect()
    _, cold = timed(lambda: audit(records, provider))
    memo = counter.memo_len()
    warm: list[int] = []
    for _ in range(repeats):
        gc.collect()
        _, t = timed(lambda: audit(records, provider))
        warm.append(t)
    best = min(warm)
    return AuditFigures(
        provider=provider,
        requests=len(records),
        sessions=len({r.session for r in records}),
        cold_s=cold / 1e9,
        warm_best_s=best / 1e9,
        warm_runs_s=[t / 1e9 for t in warm],
        requests_per_s=len(records) / (best / 1e9),
        memo_blocks=memo,
        peak_rss_mib=peak_rss_mib(),
    )


def bench_tokenise(records: list[Record], repeats: int) -> dict[str, float]:
    """``canonicalize`` of every request with an empty token memo (encoder already loaded) vs with every
    block memoised: the difference is what tiktoken costs an audit of the file."""
    cold: list[int] = []
    warm: list[int] = []
    blocks = 0
    for _ in range(repeats):
        counter = TokenCounter()
        assert counter.exact
        gc.collect()
        t0 = now_ns()
        for r in records:
            canonicalize(r.api, r.body, counter)
        cold.append(now_ns() - t0)
        blocks = counter.memo_len()
        gc.collect()
        t0 = now_ns()
        for r in records:
            canonicalize(r.api, r.body, counter)
        warm.append(now_ns() - t0)
    return {
        "canonicalize_cold_s": min(cold) / 1e9,
        "canonicalize_warm_s": min(warm) / 1e9,
        "tiktoken_s": (min(cold) - min(warm)) / 1e9,
        "distinct_blocks": blocks,
    }


# ---- part 2: per-turn cost on a long session -----------------------------------------------------------


@dataclass(slots=True)
class TurnSamples:
    """Samples (ns) of one turn over all passes."""

    messages: int
    blocks: int
    new_blocks: int
    tokens: int
    wire_bytes: int
    memo_growth: list[int] = field(default_factory=list)
    steps: dict[str, list[int]] = field(default_factory=lambda: {s: [] for s in STEPS})
    canon_all_hits: list[int] = field(default_factory=list)

    def identity_diff(self) -> list[int]:
        return [a + b for a, b in zip(self.steps["canonicalize"], self.steps["diagnose"], strict=True)]

    def pipeline(self) -> list[int]:
        parts = [self.steps[s] for s in STEPS if s != "json_loads"]
        return [sum(v) for v in zip(*parts, strict=True)]


class Pipeline:
    """The per-turn work of a proxy for one session: the same steps and order as ``agentcache.audit``."""

    def __init__(self, api: str, counter: TokenCounter | None):
        self.api = api
        self.counter = counter
        self.memory = SessionMemory()
        self.prev: CanonicalRequest | None = None
        self.rules = anthropic_rules(default_model("anthropic"))

    def turn(self, wire: bytes, out: TurnSamples | None) -> CanonicalRequest:
        t0 = now_ns()
        body = json.loads(wire)
        t1 = now_ns()
        canon = canonicalize(self.api, body, self.counter)
        t2 = now_ns()
        if self.prev is not None:
            d = diagnose(self.prev, canon)
            assert not d.is_break, d
        t3 = now_ns()
        repair = plan_repairs(self.memory, canon, body)
        body1 = apply(self.api, body, repair.plan) if not repair.plan.empty else body
        rep = canonicalize(self.api, body1, self.counter) if body1 is not body else canon
        t4 = now_ns()
        bp = plan_breakpoints(rep, self.memory.sent, self.rules)
        planned = with_markers(rep, bp.markers, bp.top)
        t5 = now_ns()
        self.memory.remember(planned, body1)
        self.prev = canon
        t6 = now_ns()
        if out is not None:
            for name, t in zip(STEPS, (t1 - t0, t2 - t1, t3 - t2, t4 - t3, t5 - t4, t6 - t5), strict=True):
                out.steps[name].append(t)
        return canon


def bench_turns(api: str, wires: list[bytes], passes: int, warmup: int) -> list[TurnSamples]:
    canon = [canonicalize(api, json.loads(w), TokenCounter()) for w in wires]
    turns = [
        TurnSamples(
            messages=2 * (i + 1),
            blocks=len(c.blocks),
            new_blocks=len(c.blocks) - (len(canon[i - 1].blocks) if i else 0),
            tokens=c.tokens,
            wire_bytes=len(wires[i]),
        )
        for i, c in enumerate(canon)
    ]
    for p in range(warmup + passes):
        record = p >= warmup
        counter = TokenCounter()
        assert counter.exact
        pipe = Pipeline(api, counter)
        gc.collect()
        for w, ts in zip(wires, turns, strict=True):
            before = counter.memo_len()
            pipe.turn(w, ts if record else None)
            if record:
                ts.memo_growth.append(counter.memo_len() - before)
                body = json.loads(w)
                t0 = now_ns()
                canonicalize(api, body, counter)
                ts.canon_all_hits.append(now_ns() - t0)
    return turns


def check_default_counter(api: str, wires: list[bytes]) -> list[int]:
    """One pass through the process-wide counter (``counter=None``, as audit and the proxy use it):
    ``default_counter().memo_len()`` growth per turn."""
    reset_default_counter()
    pipe = Pipeline(api, None)
    growth: list[int] = []
    for w in wires:
        before = default_counter().memo_len()
        pipe.turn(w, None)
        growth.append(default_counter().memo_len() - before)
    return growth


def linear_fit(xs: Sequence[float], ys: Sequence[float]) -> tuple[float, float, float]:
    """Least squares ``y = a + b x``: (a, b, r²)."""
    mx, my = statistics.fmean(xs), statistics.fmean(ys)
    sxx = sum((x - mx) ** 2 for x in xs)
    sxy = sum((x - mx) * (y - my) for x, y in zip(xs, ys, strict=True))
    syy = sum((y - my) ** 2 for y in ys)
    b = sxy / sxx
    a = my - b * mx
    r2 = (sxy * sxy) / (sxx * syy) if syy else 1.0
    return a, b, r2


def turn_summary(ts: TurnSamples) -> dict[str, Any]:
    med = {s: ms(statistics.median(v)) for s, v in ts.steps.items()}
    ident, pipe = ts.identity_diff(), ts.pipeline()
    return {
        "messages": ts.messages,
        "blocks": ts.blocks,
        "new_blocks": ts.new_blocks,
        "memo_growth_median": statistics.median(ts.memo_growth),
        "prompt_tokens": ts.tokens,
        "wire_bytes": ts.wire_bytes,
        "median_ms": med,
        "canonicalize_all_hits_ms": ms(statistics.median(ts.canon_all_hits)),
        "identity_diff_ms": {"p50": ms(pct(ident, 50)), "p95": ms(pct(ident, 95)), "max": ms(max(ident))},
        "pipeline_ms": {"p50": ms(pct(pipe, 50)), "p95": ms(pct(pipe, 95)), "max": ms(max(pipe))},
        "samples": len(pipe),
    }


# ---- part 3: profile of the 200-message turn ------------------------------------------------------------


def profile_last_turn(api: str, wires: list[bytes], reps: int, top: int) -> dict[str, Any]:
    """cProfile of the full pipeline on the last turn; each repetition starts from a pipeline that has
    seen the previous turn (memo holds the prefix), so the new blocks are tokenised every time."""
    prof = cProfile.Profile()
    for _ in range(reps):
        pipe = Pipeline(api, TokenCounter())
        pipe.turn(wires[-2], None)
        prof.enable()
        pipe.turn(wires[-1], None)
        prof.disable()
    st = pstats.Stats(prof)
    raw: dict[tuple[str, int, str], tuple[int, int, float, float, Any]] = st.stats  # type: ignore[attr-defined]
    total = sum(v[2] for v in raw.values())
    rows = []
    for (file, line, func), (_cc, nc, tt, ct, _callers) in raw.items():
        rows.append(
            {
                "function": _where(file, line, func),
                "calls_per_turn": nc / reps,
                "tottime_ms_per_turn": tt * 1e3 / reps,
                "cumtime_ms_per_turn": ct * 1e3 / reps,
                "tottime_share": tt / total if total else 0.0,
            }
        )
    by_tt = sorted(rows, key=lambda r: -r["tottime_ms_per_turn"])[:top]
    by_ct = sorted(rows, key=lambda r: -r["cumtime_ms_per_turn"])[:top]
    return {"api": api, "reps": reps, "total_ms_per_turn": total * 1e3 / reps, "by_tottime": by_tt, "by_cumtime": by_ct}


def _where(file: str, line: int, func: str) -> str:
    if file == "~":
        return func
    parts = Path(file).parts
    for anchor in ("agentcache", "adapters", "policies"):
        if anchor in parts:
            i = len(parts) - 1 - parts[::-1].index(anchor)
            return f"{'/'.join(parts[i:])}:{line}({func})"
    return f"{Path(file).name}:{line}({func})"


# ---- report ---------------------------------------------------------------------------------------------


def machine() -> dict[str, Any]:
    cpu = "unknown"
    try:
        for line in Path("/proc/cpuinfo").read_text().splitlines():
            if line.startswith("model name"):
                cpu = line.split(":", 1)[1].strip()
                break
    except OSError:
        pass
    import tiktoken

    return {
        "date": dt.datetime.now(dt.UTC).strftime("%Y-%m-%d %H:%M UTC"),
        "nproc": os.cpu_count(),
        "sched_affinity": len(os.sched_getaffinity(0)) if hasattr(os, "sched_getaffinity") else None,
        "cpu": cpu,
        "python": f"{platform.python_implementation()} {platform.python_version()}",
        "platform": platform.platform(),
        "tiktoken": getattr(tiktoken, "__version__", "?"),
    }


def markdown(res: dict[str, Any]) -> str:
    m = res["machine"]
    out = [
        f"Run {m['date']} on {m['cpu']} ({m['nproc']} CPUs), {m['python']}, tiktoken {m['tiktoken']}"
        f"{' (--quick)' if res['quick'] else ''}.",
        "",
        "### Audit of data/tau-bench/gpt-4o-airline.json",
        "",
        f"Load (`loaders.load`): {res['load_ms']:.1f} ms for {res['audit'][0]['requests']:,} requests in "
        f"{res['audit'][0]['sessions']} sessions; tiktoken encoder load (first use in the process): "
        f"{res['encoder_load_ms']:.0f} ms; peak RSS after imports {res['rss_after_imports_mib']:.0f} MiB, "
        f"after load {res['rss_after_load_mib']:.0f} MiB.",
        "",
        "| provider | cold audit (empty token memo) | warm audit, best of "
        f"{len(res['audit'][0]['warm_runs_s'])} | requests/s (warm) | tiktoken cost (cold − warm) "
        "| distinct blocks tokenised | peak RSS |",
        "| --- | ---: | ---: | ---: | ---: | ---: | ---: |",
    ]
    tk = res["tokenise"]
    for a in res["audit"]:
        out.append(
            f"| {a['provider']} | {a['cold_s']:.2f} s | {a['warm_best_s']:.2f} s | {a['requests_per_s']:,.0f} "
            f"| {a['cold_s'] - a['warm_best_s']:.2f} s | {a['memo_blocks']:,} | {a['peak_rss_mib']:.0f} MiB |"
        )
    out += [
        "",
        f"tiktoken in isolation: `canonicalize` of all {res['audit'][0]['requests']:,} requests takes "
        f"{tk['canonicalize_cold_s']:.2f} s with an empty token memo (encoder loaded) and "
        f"{tk['canonicalize_warm_s']:.2f} s with all {tk['distinct_blocks']:,} distinct blocks memoised, "
        f"so tokenising costs {tk['tiktoken_s']:.2f} s per audit of the file.",
    ]
    s = res["session"]
    out += [
        "",
        "### Per-turn cost, 200-message session stitched from real tau-bench messages",
        "",
        f"{s['messages']} messages ({s['tool_exchanges']} tool exchanges, {s['dialogue_exchanges']} text/user "
        f"exchanges, {s['reused']} tool exchanges used a second time), one request per assistant turn "
        f"({s['turns']} requests). {res['passes']} timed passes after {res['warmup']} warm-up passes; each pass "
        "starts with an empty token memo and replays the turns in order. Times in ms; step columns are medians; "
        "p50/p95/max are over the passes at that turn.",
        "",
    ]
    for fmt in res["turns"]:
        out += [
            f"**{fmt['api']}** (last request: {fmt['checkpoints'][-1]['prompt_tokens']:,} prompt tokens, "
            f"{fmt['checkpoints'][-1]['blocks']} blocks, {fmt['checkpoints'][-1]['wire_bytes']:,} wire bytes)",
            "",
            "| msgs | blocks | new blocks | tokenised (memo growth) | prompt tokens | json.loads | canonicalize "
            "| canonicalize, all memo hits | diagnose | identity+diff p50 / p95 / max | plan_repairs "
            "| plan_breakpoints | remember | full pipeline p50 / p95 / max |",
            "| ---: | ---: | ---: | ---: | ---: | ---: | ---: | ---: | ---: | ---: | ---: | ---: | ---: | ---: |",
        ]
        for c in fmt["checkpoints"]:
            md, idd, pp = c["median_ms"], c["identity_diff_ms"], c["pipeline_ms"]
            out.append(
                f"| {c['messages']} | {c['blocks']} | {c['new_blocks']} | {c['memo_growth_median']:g} "
                f"| {c['prompt_tokens']:,} | {md['json_loads']:.3f} | {md['canonicalize']:.3f} "
                f"| {c['canonicalize_all_hits_ms']:.3f} | {md['diagnose']:.3f} "
                f"| {idd['p50']:.3f} / {idd['p95']:.3f} / {idd['max']:.3f} | {md['plan_repairs']:.3f} "
                f"| {md['plan_breakpoints']:.3f} | {md['remember']:.3f} "
                f"| {pp['p50']:.3f} / {pp['p95']:.3f} / {pp['max']:.3f} |"
            )
        f = fmt["fit"]
        out += [
            "",
            f"Over all {s['turns']} turns: identity+diff median = {f['identity_diff']['a_ms']:.3f} ms + "
            f"{f['identity_diff']['b_us_per_block']:.2f} µs × blocks in the request (r² = "
            f"{f['identity_diff']['r2']:.3f}); canonicalize with all memo hits = "
            f"{f['canon_all_hits']['a_ms']:.3f} ms + {f['canon_all_hits']['b_us_per_block']:.2f} µs × blocks "
            f"(r² = {f['canon_all_hits']['r2']:.3f}); full pipeline = {f['pipeline']['a_ms']:.3f} ms + "
            f"{f['pipeline']['b_us_per_block']:.2f} µs × blocks (r² = {f['pipeline']['r2']:.3f}). "
            f"Token memo growth per turn (blocks tokenised) equals the number of new blocks on "
            f"{fmt['memo_growth_equals_new_blocks']} of {s['turns']} turns and never exceeds it: "
            f"{fmt['memo_growth_within_new_blocks']}; after the first turn at most "
            f"{fmt['memo_growth_later_turns_max']} blocks are tokenised per turn. Exceptions: "
            + "; ".join(
                f"{e['messages']} msgs: {e['new_blocks']} new, {'/'.join(map(str, e['memo_growth']))} tokenised"
                for e in fmt["memo_growth_exceptions"]
            )
            + f". A pass through the process-wide `default_counter()` gives the same per-turn growth: "
            f"{fmt['default_counter_same_as_fresh']}.",
            "",
        ]
    for prof in res["profile"]:
        out += [
            f"### cProfile, full pipeline on the 200-message turn ({prof['api']}, {prof['reps']} repetitions, "
            f"{prof['total_ms_per_turn']:.2f} ms/turn under the profiler)",
            "",
            "| function (by own time) | calls/turn | own ms/turn | share | cumulative ms/turn |",
            "| --- | ---: | ---: | ---: | ---: |",
        ]
        for r in prof["by_tottime"]:
            out.append(
                f"| `{r['function']}` | {r['calls_per_turn']:g} | {r['tottime_ms_per_turn']:.3f} "
                f"| {100 * r['tottime_share']:.1f}% | {r['cumtime_ms_per_turn']:.3f} |"
            )
        out += ["", "| function (by cumulative time) | calls/turn | cumulative ms/turn |", "| --- | ---: | ---: |"]
        for r in prof["by_cumtime"]:
            out.append(f"| `{r['function']}` | {r['calls_per_turn']:g} | {r['cumtime_ms_per_turn']:.3f} |")
        out.append("")
    return "\n".join(out)


def main(argv: Sequence[str] | None = None) -> int:
    ap = argparse.ArgumentParser(description=__doc__.split("\n\n")[0] if __doc__ else None)
    ap.add_argument("--json", metavar="OUT", help="also write all figures (every turn) as JSON to OUT")
    ap.add_argument("--quick", action="store_true", help="fewer repetitions (smoke test; noisier figures)")
    args = ap.parse_args(argv)
    audit_repeats, passes, warmup, prof_reps = (1, 5, 1, 20) if args.quick else (3, 41, 3, 200)

    res: dict[str, Any] = {"machine": machine(), "quick": args.quick, "passes": passes, "warmup": warmup}
    res["rss_after_imports_mib"] = peak_rss_mib()

    # Part 1.
    reset_default_counter()
    _, enc = timed(lambda: default_counter().exact)
    res["encoder_load_ms"] = ms(enc)
    loaded, t_load = timed(lambda: load(_synth.TAU_FILE))
    res["load_ms"] = ms(t_load)
    res["rss_after_load_mib"] = peak_rss_mib()
    records = loaded.records
    assert len(records) == 2454 and not loaded.errors, (len(records), loaded.errors)
    res["audit"] = []
    for provider in ("anthropic", "openai"):
        print(f"auditing {len(records)} requests under {provider} rules...", file=sys.stderr)
        res["audit"].append(asdict(bench_audit(records, provider, audit_repeats)))
    res["tokenise"] = bench_tokenise(records, audit_repeats)
    del records, loaded
    reset_default_counter()
    gc.collect()

    # Part 2.
    session = _synth.build_session()
    res["session"] = {
        "messages": len(session.messages),
        "turns": len(session.messages) // 2,
        "tool_exchanges": session.tool_exchanges,
        "dialogue_exchanges": session.dialogue_exchanges,
        "reused": session.reused,
    }
    res["turns"] = []
    wires_by_api: dict[str, list[bytes]] = {}
    for api, make in FORMATS:
        wires = [json.dumps(b).encode() for b in make(session)]
        wires_by_api[api] = wires
        print(f"per-turn timing, {api}: {passes} passes x {len(wires)} turns...", file=sys.stderr)
        turns = bench_turns(api, wires, passes, warmup)
        growth_default = check_default_counter(api, wires)
        summaries = [turn_summary(t) for t in turns]
        xs = [t.blocks for t in turns]

        def fit(ys: list[float], xs: list[int] = xs) -> dict[str, float]:
            a, b, r2 = linear_fit(xs, ys)
            return {"a_ms": a, "b_us_per_block": b * 1e3, "r2": r2}

        res["turns"].append(
            {
                "api": api,
                "checkpoints": [s for s in summaries if s["messages"] in CHECKPOINTS],
                "fit": {
                    "identity_diff": fit([s["identity_diff_ms"]["p50"] for s in summaries]),
                    "canon_all_hits": fit([s["canonicalize_all_hits_ms"] for s in summaries]),
                    "pipeline": fit([s["pipeline_ms"]["p50"] for s in summaries]),
                },
                "memo_growth_equals_new_blocks": sum(
                    1 for t in turns if all(g == t.new_blocks for g in t.memo_growth)
                ),
                "memo_growth_within_new_blocks": all(
                    g <= t.new_blocks for t in turns for g in [*t.memo_growth, growth_default[t.messages // 2 - 1]]
                ),
                "memo_growth_exceptions": [
                    {"messages": t.messages, "new_blocks": t.new_blocks, "memo_growth": sorted(set(t.memo_growth))}
                    for t in turns
                    if any(g != t.new_blocks for g in t.memo_growth)
                ],
                "memo_growth_later_turns_max": max(max(t.memo_growth) for t in turns[1:]),
                "default_counter_growth": growth_default,
                "default_counter_same_as_fresh": all(
                    g == t.memo_growth[0] for g, t in zip(growth_default, turns, strict=True)
                ),
                "all_turns": summaries,
            }
        )

    # Part 3.
    res["profile"] = []
    for api, _make in FORMATS:
        print(f"profiling the 200-message turn, {api}...", file=sys.stderr)
        res["profile"].append(profile_last_turn(api, wires_by_api[api], prof_reps, top=15))
    res["peak_rss_end_mib"] = peak_rss_mib()

    print(markdown(res))
    if args.json:
        Path(args.json).write_text(json.dumps(res, indent=1))
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
