"""Benchmark: audit of the bundled tau-bench file, and the per-turn cost of identity + diff.

Usage::

    python benchmarks/audit_bench.py [--json OUT] [--quick]

Part 1 audits ``data/tau-bench/gpt-4o-airline.json`` (200 sessions, 2,454 requests) under the Anthropic and
OpenAI rules: load time, tiktoken encoder load, a cold audit (empty token memo), the best of 3 warm audits,
requests/s, an audit with the memo emptied again, peak RSS, and ``encode_ordinary`` over every distinct block
text (what an empty memo adds).

Part 2 replays a 200-message, ~100K-token session stitched from real tau-bench messages (see ``_synth.py``),
one request per assistant turn, in both wire forms (OpenAI Chat Completions and Anthropic Messages). Each
pass starts with a fresh token memo and sends the turns in order, as a proxy would, so every turn tokenises
only the blocks that are new in it. Per turn it times ``json.loads`` of the wire bytes, ``canonicalize``,
``diagnose`` against the previous request, ``plan_repairs``, ``plan_breakpoints`` (+ ``with_markers``) and
``SessionMemory.remember``; in a separate pass ``SessionPipeline.prepare`` + ``commit`` (what the proxy
runs); and counts the blocks tokenised (token-memo growth). It also times a second
``canonicalize`` of the same body with every block already memoised (the part that does not depend on
tokenisation). Figures are medians / percentiles over the passes.

Part 3 profiles ``json.loads`` + ``SessionPipeline.prepare`` + ``commit`` on the 200-message turn with
cProfile.

All times come from ``time.perf_counter_ns``; the garbage collector stays enabled (a proxy runs with it),
and ``gc.collect()`` runs before every pass.
"""

from __future__ import annotations

import argparse
import ast
import cProfile
import datetime as dt
import functools
import gc
import json
import math
import os
import platform
import pstats
import resource
import statistics
import subprocess
import sys
import time
from collections.abc import Callable, Sequence
from dataclasses import asdict, dataclass, field
from pathlib import Path
from typing import Any, TypeVar

import _synth

from agentcache import CanonicalRequest, audit, diagnose
from agentcache.adapters import apply, canonicalize
from agentcache.analysis._repair import Sent, ToolMemory, plan_repairs, repaired_request
from agentcache.loaders import Record, load
from agentcache.model import _rawjson as rawjson
from agentcache.model._build import BlockCache
from agentcache.model._canonical import with_markers
from agentcache.model._rules import anthropic_rules, default_model
from agentcache.model._tokens import TokenCounter, default_counter, reset_default_counter
from agentcache.policies import plan_breakpoints
from agentcache.session import SessionPipeline

T = TypeVar("T")
CHECKPOINTS = (10, 50, 100, 200)
#: Folders whose uncommitted changes affect the figures (reported with the commit).
CODE_DIRS = ("agentcache", "adapters", "policies")
STEPS = ("json_loads", "canonicalize", "diagnose", "plan_repairs", "plan_breakpoints", "remember")
#: Wire format, how to build its bodies, and the provider whose policies SessionPipeline applies to it.
FORMATS = (
    ("openai.chat", _synth.openai_bodies, "openai"),
    ("anthropic.messages", _synth.anthropic_bodies, "anthropic"),
)


def now_ns() -> int:
    return time.perf_counter_ns()


def peak_rss_mib() -> float:
    """Peak resident set size of this process so far (Linux reports KiB)."""
    return resource.getrusage(resource.RUSAGE_SELF).ru_maxrss / 1024


@dataclass(frozen=True, slots=True)
class CpuSnap:
    wall: float
    machine_busy: float
    own: float


def cpu_snap() -> CpuSnap:
    """Wall time, CPU seconds the whole machine spent busy (``/proc/stat``) and CPU seconds of this process."""
    busy = math.nan
    try:
        with open("/proc/stat", encoding="ascii") as f:
            v = [int(x) for x in f.readline().split()[1:]]
        # user nice system idle iowait irq softirq steal ...
        busy = (v[0] + v[1] + v[2] + v[5] + v[6] + v[7]) / os.sysconf("SC_CLK_TCK")
    except (OSError, ValueError, IndexError):
        pass
    ru = resource.getrusage(resource.RUSAGE_SELF)
    return CpuSnap(time.monotonic(), busy, ru.ru_utime + ru.ru_stime)


def other_load(a: CpuSnap, b: CpuSnap) -> float:
    """Average number of CPUs that *other* processes kept busy between two snapshots."""
    wall = b.wall - a.wall
    return max(0.0, ((b.machine_busy - a.machine_busy) - (b.own - a.own)) / wall) if wall > 0 else math.nan


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
    recold_s: float
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
    # Empty the memo again, now that the process is warm: isolates what tokenising costs the audit.
    reset_default_counter()
    assert default_counter().exact
    gc.collect()
    _, recold = timed(lambda: audit(records, provider))
    return AuditFigures(
        provider=provider,
        requests=len(records),
        sessions=len({r.session for r in records}),
        cold_s=cold / 1e9,
        recold_s=recold / 1e9,
        warm_best_s=best / 1e9,
        warm_runs_s=[t / 1e9 for t in warm],
        requests_per_s=len(records) / (best / 1e9),
        memo_blocks=memo,
        peak_rss_mib=peak_rss_mib(),
    )


class _RecordingCounter(TokenCounter):
    """A token counter that keeps the text of every distinct block it is asked about."""

    def __init__(self) -> None:
        super().__init__()
        self.texts: dict[bytes, str] = {}

    def count(self, key: bytes, text: str) -> int:
        self.texts.setdefault(key, text)
        return super().count(key, text)


def bench_tokenise(records: list[Record], repeats: int) -> dict[str, float]:
    """What tiktoken costs an audit of the file: ``encode_ordinary`` over the text of every distinct block
    (exactly the calls a cold token memo makes), best of ``repeats``."""
    import tiktoken

    rec = _RecordingCounter()
    for r in records:
        canonicalize(r.api, r.body, rec)
    texts = list(rec.texts.values())
    enc = tiktoken.get_encoding(rec.encoding_name)
    tokens = sum(len(enc.encode_ordinary(t)) for t in texts)
    best = math.inf
    for _ in range(repeats):
        gc.collect()
        t0 = now_ns()
        for t in texts:
            enc.encode_ordinary(t)
        best = min(best, now_ns() - t0)
    return {
        "distinct_blocks": len(texts),
        "tokens": tokens,
        "encode_s": best / 1e9,
        "tokens_per_s": tokens / (best / 1e9),
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
    session_pipeline: list[int] = field(default_factory=list)
    session_memo_growth: list[int] = field(default_factory=list)
    proxy_path: list[int] = field(default_factory=list)

    def identity_diff(self) -> list[int]:
        return [a + b for a, b in zip(self.steps["canonicalize"], self.steps["diagnose"], strict=True)]

    def pipeline(self) -> list[int]:
        parts = [self.steps[s] for s in STEPS if s != "json_loads"]
        return [sum(v) for v in zip(*parts, strict=True)]


class Pipeline:
    """The per-turn steps, timed one by one, in the order ``SessionPipeline.prepare``/``commit`` runs them
    (canonicalize, diagnose, plan_repairs (+ apply + the repaired request assembled from blocks),
    plan_breakpoints (+ with_markers), remember), without its extras (TTL choice, routing key, writing
    markers onto the wire)."""

    def __init__(self, api: str):
        self.api = api
        self.last: Sent | None = None
        self.tools = ToolMemory()
        self.prev: CanonicalRequest | None = None
        self.rules = anthropic_rules(default_model("anthropic"))
        # The session's block cache, as SessionPipeline keeps one: unchanged messages re-use their blocks.
        self.cache = BlockCache()

    def turn(self, wire: bytes, out: TurnSamples | None) -> None:
        t0 = now_ns()
        body = json.loads(wire)
        t1 = now_ns()
        self.cache.begin()
        canon = canonicalize(self.api, body, cache=self.cache)
        t2 = now_ns()
        if self.prev is not None:
            d = diagnose(self.prev, canon)
            assert not d.is_break, d
        t3 = now_ns()
        repair = plan_repairs(canon, body, self.last, self.tools)
        body1 = apply(self.api, body, repair.plan) if not repair.plan.empty else body
        sent = self.last.request if self.last is not None else None
        rep = repaired_request(canon, repair, (sent,) if sent is not None else ())
        t4 = now_ns()
        bp = plan_breakpoints(rep, sent, self.rules)
        planned = with_markers(rep, bp.markers, bp.top)
        t5 = now_ns()
        self.tools = self.tools.after(planned, sent)
        self.last = Sent(planned, body1, canon, dict(repair.messages))
        self.prev = canon
        t6 = now_ns()
        if out is not None:
            for name, t in zip(STEPS, (t1 - t0, t2 - t1, t3 - t2, t4 - t3, t5 - t4, t6 - t5), strict=True):
                out.steps[name].append(t)


def session_turn(pipe: SessionPipeline, api: str, body: dict[str, Any], now: float) -> None:
    """What the proxy runs per request (wire body already parsed)."""
    pipe.commit(pipe.prepare(api, body, now=now))


def fresh_memo() -> None:
    """Empty the process-wide token memo (the one canonicalize, audit and SessionPipeline use)."""
    reset_default_counter()
    assert default_counter().exact, "tiktoken encoder unavailable: figures would be byte estimates"


def bench_turns(api: str, provider: str, wires: list[bytes], passes: int, warmup: int) -> list[TurnSamples]:
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
        # The steps one by one.
        fresh_memo()
        pipe = Pipeline(api)
        gc.collect()
        for w, ts in zip(wires, turns, strict=True):
            before = default_counter().memo_len()
            pipe.turn(w, ts if record else None)
            if record:
                ts.memo_growth.append(default_counter().memo_len() - before)
                body = json.loads(w)
                t0 = now_ns()
                canonicalize(api, body)
                ts.canon_all_hits.append(now_ns() - t0)
        # The real thing: SessionPipeline, one request every 10 s.
        fresh_memo()
        sp = SessionPipeline(provider, session="bench")
        gc.collect()
        for k, (w, ts) in enumerate(zip(wires, turns, strict=True)):
            body = json.loads(w)
            before = default_counter().memo_len()
            t0 = now_ns()
            session_turn(sp, api, body, 10.0 * k)
            t1 = now_ns()
            if record:
                ts.session_pipeline.append(t1 - t0)
                ts.session_memo_growth.append(default_counter().memo_len() - before)
        # The proxy's path: the wire bytes parsed once keeping their source texts, then the same pipeline
        # (unchanged messages keyed by their text instead of encoded again).
        fresh_memo()
        sp = SessionPipeline(provider, session="bench")
        gc.collect()
        for k, (w, ts) in enumerate(zip(wires, turns, strict=True)):
            t0 = now_ns()
            body, texts = rawjson.loads(w)
            sp.commit(sp.prepare(api, body, now=10.0 * k, raw=texts))
            t1 = now_ns()
            if record:
                ts.proxy_path.append(t1 - t0)
    return turns


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
    ident, pipe, sp, px = ts.identity_diff(), ts.pipeline(), ts.session_pipeline, ts.proxy_path
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
        "session_pipeline_ms": {"p50": ms(pct(sp, 50)), "p95": ms(pct(sp, 95)), "max": ms(max(sp))},
        "proxy_path_ms": {"p50": ms(pct(px, 50)), "p95": ms(pct(px, 95)), "max": ms(max(px))},
        "session_memo_growth_median": statistics.median(ts.session_memo_growth),
        "samples": len(pipe),
    }


# ---- part 3: profile of the 200-message turn ------------------------------------------------------------


def profile_last_turn(api: str, provider: str, wires: list[bytes], reps: int, top: int) -> dict[str, Any]:
    """cProfile of ``SessionPipeline.prepare`` + ``commit`` on the last turn; each repetition starts from a
    pipeline that has seen the previous turn (the memo holds the prefix), so the new blocks are tokenised
    every time. ``json.loads`` of the wire bytes is profiled with it."""
    prof = cProfile.Profile()
    for _ in range(reps):
        fresh_memo()
        sp = SessionPipeline(provider, session="bench")
        session_turn(sp, api, json.loads(wires[-2]), 0.0)
        prof.enable()
        session_turn(sp, api, json.loads(wires[-1]), 10.0)
        prof.disable()
    st = pstats.Stats(prof)
    raw: dict[tuple[str, int, str], tuple[int, int, float, float, Any]] = st.stats  # type: ignore[attr-defined]
    total = sum(v[2] for v in raw.values())
    rows: list[dict[str, Any]] = []
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


@functools.cache
def _functions(file: str) -> list[tuple[int, int, str]]:
    try:
        tree = ast.parse(Path(file).read_text(encoding="utf-8"))
    except (OSError, SyntaxError):
        return []
    return [
        (n.lineno, n.end_lineno or n.lineno, n.name)
        for n in ast.walk(tree)
        if isinstance(n, ast.FunctionDef | ast.AsyncFunctionDef)
    ]


def _where(file: str, line: int, func: str) -> str:
    if file == "~":
        return func
    if func.startswith("<"):  # <genexpr>, <lambda>, <listcomp>: name the function it sits in
        inside = [f for f in _functions(file) if f[0] <= line <= f[1]]
        if inside:
            func = f"{func} in {max(inside)[2]}"
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

    def git(*args: str) -> str:
        try:
            out = subprocess.run(["git", *args], cwd=_synth.ROOT, capture_output=True, text=True, timeout=10)
        except (OSError, subprocess.SubprocessError):
            return "?"
        return out.stdout.strip() if out.returncode == 0 else "?"

    dirty = [line[3:] for line in git("status", "--porcelain").splitlines() if line[3:].split("/")[0] in CODE_DIRS]
    return {
        "commit": git("rev-parse", "--short", "HEAD"),
        "uncommitted_code": dirty,
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
        f"Run {m['date']} at commit {m['commit']}"
        f"{' + uncommitted changes in ' + ', '.join(m['uncommitted_code']) if m['uncommitted_code'] else ''}, "
        f"on {m['cpu']} ({m['nproc']} CPUs), {m['python']}, tiktoken {m['tiktoken']}"
        f"{' (--quick)' if res['quick'] else ''}; load average (1/5/15 min) "
        f"{'/'.join(f'{x:.2f}' for x in res['loadavg_start'])} at the start, "
        f"{'/'.join(f'{x:.2f}' for x in res['loadavg_end'])} at the end. Other processes kept "
        f"{res['other_load']['audit']:.2f} CPUs busy on average during part 1 (audit) and "
        f"{res['other_load']['per_turn']:.2f} during part 2 (per-turn timing), out of {m['nproc']}.",
        "",
        "### Audit of data/tau-bench/gpt-4o-airline.json",
        "",
        f"Load (`loaders.load`): {res['load_ms']:.1f} ms for {res['audit'][0]['requests']:,} requests in "
        f"{res['audit'][0]['sessions']} sessions; tiktoken encoder load (first use in the process): "
        f"{res['encoder_load_ms']:.0f} ms; peak RSS after imports {res['rss_after_imports_mib']:.0f} MiB, "
        f"after load {res['rss_after_load_mib']:.0f} MiB.",
        "",
        "| provider | first audit (empty token memo) | warm audit, best of "
        f"{len(res['audit'][0]['warm_runs_s'])} | requests/s (warm) | warm runs | empty memo again, after the "
        "warm runs | distinct blocks tokenised | peak RSS |",
        "| --- | ---: | ---: | ---: | --- | ---: | ---: | ---: |",
    ]
    tk = res["tokenise"]
    for a in res["audit"]:
        out.append(
            f"| {a['provider']} | {a['cold_s']:.2f} s | {a['warm_best_s']:.2f} s | {a['requests_per_s']:,.0f} "
            f"| {', '.join(f'{x:.2f}' for x in a['warm_runs_s'])} s | {a['recold_s']:.2f} s | {a['memo_blocks']:,} "
            f"| {a['peak_rss_mib']:.0f} MiB |"
        )
    if "side_by_side" in res:
        sbs = res["side_by_side"]
        out += ["", "Side by side in this run (each in its own process, alternating; best warm audit):", "",
                "| provider | this checkout | baseline | ratio |", "| --- | ---: | ---: | ---: |"]  # fmt: skip
        for ours, theirs in zip(sbs["ours"], sbs["baseline"], strict=True):
            ratio = ours["warm_best_s"] / theirs["warm_best_s"]
            out.append(
                f"| {ours['provider']} | {ours['warm_best_s']:.2f} s | {theirs['warm_best_s']:.2f} s | {ratio:.2f} |"
            )
    out += [
        "",
        f"tiktoken in isolation: a cold memo tokenises the {tk['distinct_blocks']:,} distinct blocks of the file "
        f"({tk['tokens']:,.0f} tokens) once; `encode_ordinary` over their texts takes {tk['encode_s']:.3f} s "
        f"(best of {len(res['audit'][0]['warm_runs_s'])}, {tk['tokens_per_s'] / 1e6:.2f} M tokens/s). That is what "
        "an empty memo adds to an audit (warm audits re-tokenise nothing).",
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
        last = fmt["checkpoints"][-1]
        out += [
            f"**{fmt['api']}** (last request: {last['prompt_tokens']:,} prompt tokens, {last['blocks']} blocks, "
            f"{last['wire_bytes']:,} wire bytes)",
            "",
            "Identity + diff (`canonicalize` the new body, `diagnose` against the previous one):",
            "",
            "| msgs | blocks | new blocks | tokenised (memo growth) | prompt tokens | json.loads (for comparison) "
            "| canonicalize | canonicalize, all memo hits | diagnose | identity+diff p50 / p95 / max |",
            "| ---: | ---: | ---: | ---: | ---: | ---: | ---: | ---: | ---: | ---: |",
        ]
        for c in fmt["checkpoints"]:
            md, idd = c["median_ms"], c["identity_diff_ms"]
            out.append(
                f"| {c['messages']} | {c['blocks']} | {c['new_blocks']} | {c['memo_growth_median']:g} "
                f"| {c['prompt_tokens']:,} | {md['json_loads']:.3f} | {md['canonicalize']:.3f} "
                f"| {c['canonicalize_all_hits_ms']:.3f} | {md['diagnose']:.3f} "
                f"| {idd['p50']:.3f} / {idd['p95']:.3f} / {idd['max']:.3f} |"
            )
        out += [
            "",
            "Full per-turn pipeline: the steps one by one (identity+diff, then `plan_repairs`, `plan_breakpoints` "
            "with Anthropic rules + `with_markers`, `SessionMemory.remember`), and `SessionPipeline.prepare` + "
            f"`commit` with provider `{fmt['provider']}` as the proxy runs it (json.loads excluded from both):",
            "",
            "| msgs | plan_repairs | plan_breakpoints | remember | steps total p50 / p95 / max "
            "| SessionPipeline p50 / p95 / max | tokenised by SessionPipeline "
            "| proxy path: parse with source texts + SessionPipeline, p50 / p95 / max |",
            "| ---: | ---: | ---: | ---: | ---: | ---: | ---: | ---: |",
        ]
        for c in fmt["checkpoints"]:
            md, pp, sp, px = c["median_ms"], c["pipeline_ms"], c["session_pipeline_ms"], c["proxy_path_ms"]
            out.append(
                f"| {c['messages']} | {md['plan_repairs']:.3f} | {md['plan_breakpoints']:.3f} | {md['remember']:.3f} "
                f"| {pp['p50']:.3f} / {pp['p95']:.3f} / {pp['max']:.3f} "
                f"| {sp['p50']:.3f} / {sp['p95']:.3f} / {sp['max']:.3f} | {c['session_memo_growth_median']:g} "
                f"| {px['p50']:.3f} / {px['p95']:.3f} / {px['max']:.3f} |"
            )
        f = fmt["fit"]

        def line(key: str, f: dict[str, Any] = f) -> str:
            return f"{f[key]['a_ms']:.3f} ms + {f[key]['b_us_per_block']:.2f} µs × blocks (r² = {f[key]['r2']:.3f})"

        out += [
            "",
            f"Least-squares fit of the median over all {s['turns']} turns against the number of blocks in the "
            f"request: identity+diff = {line('identity_diff')}; canonicalize with all memo hits = "
            f"{line('canon_all_hits')}; steps total = {line('pipeline')}; SessionPipeline = "
            f"{line('session_pipeline')}; proxy path (parse with source texts + SessionPipeline) = "
            f"{line('proxy_path')}.",
            "",
            f"Token memo (`default_counter().memo_len()`) growth per turn equals the number of new blocks on "
            f"{fmt['memo_growth_equals_new_blocks']} of {s['turns']} turns and never exceeds it: "
            f"{fmt['memo_growth_within_new_blocks']}; after the first turn at most "
            f"{fmt['memo_growth_later_turns_max']} blocks are tokenised per turn "
            f"({fmt['memo_growth_total_median']:g} over the session). Exceptions: "
            + "; ".join(
                f"{e['messages']} msgs: {e['new_blocks']} new, {'/'.join(map(str, e['memo_growth']))} tokenised"
                for e in fmt["memo_growth_exceptions"]
            )
            + f". SessionPipeline tokenises {fmt['session_memo_growth_total_median']:g} blocks over the session, "
            f"at most {fmt['session_memo_growth_later_turns_max']} per turn after the first.",
            "",
        ]
    for prof in res["profile"]:
        out += [
            f"### cProfile, json.loads + SessionPipeline.prepare + commit on the 200-message turn ({prof['api']}, "
            f"provider {prof['provider']}, {prof['reps']} repetitions, "
            f"{prof['total_ms_per_turn']:.2f} ms/turn under the profiler, which inflates absolute times; "
            "compare the shares)",
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
    ap.add_argument(
        "--baseline",
        metavar="PYTHON",
        help="python of another agentcache checkout (its own venv): its tau-bench audit is timed beside this one",
    )
    args = ap.parse_args(argv)
    audit_repeats, passes, warmup, prof_reps = (1, 5, 1, 20) if args.quick else (3, 41, 3, 200)

    res: dict[str, Any] = {"machine": machine(), "quick": args.quick, "passes": passes, "warmup": warmup}
    res["loadavg_start"] = os.getloadavg()
    res["rss_after_imports_mib"] = peak_rss_mib()

    # Part 1.
    snap = cpu_snap()
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
    if args.baseline:  # the same audit timed by both checkouts' code in one run, alternating
        timing = str(Path(__file__).resolve().parent / "_audit_timing.py")
        both: dict[str, list[Any]] = {"ours": [], "baseline": []}
        for _ in range(2):
            for name, python in (("baseline", args.baseline), ("ours", sys.executable)):
                out = subprocess.run([python, timing, str(audit_repeats)], capture_output=True, check=True, text=True)
                both[name].append(json.loads(out.stdout))
        res["side_by_side"] = {
            name: [min((r[i] for r in runs), key=lambda a: a["warm_best_s"]) for i in range(2)]
            for name, runs in both.items()
        }
    res["other_load"] = {"audit": other_load(snap, cpu_snap())}
    del records, loaded
    reset_default_counter()
    gc.collect()

    # Part 2.
    snap = cpu_snap()
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
    for api, make, provider in FORMATS:
        wires = [json.dumps(b).encode() for b in make(session)]
        wires_by_api[api] = wires
        print(f"per-turn timing, {api}: {passes} passes x {len(wires)} turns...", file=sys.stderr)
        turns = bench_turns(api, provider, wires, passes, warmup)
        summaries = [turn_summary(t) for t in turns]
        xs = [t.blocks for t in turns]

        def fit(ys: list[float], xs: list[int] = xs) -> dict[str, float]:
            a, b, r2 = linear_fit(xs, ys)
            return {"a_ms": a, "b_us_per_block": b * 1e3, "r2": r2}

        res["turns"].append(
            {
                "api": api,
                "provider": provider,
                "checkpoints": [s for s in summaries if s["messages"] in CHECKPOINTS],
                "fit": {
                    "identity_diff": fit([s["identity_diff_ms"]["p50"] for s in summaries]),
                    "canon_all_hits": fit([s["canonicalize_all_hits_ms"] for s in summaries]),
                    "pipeline": fit([s["pipeline_ms"]["p50"] for s in summaries]),
                    "session_pipeline": fit([s["session_pipeline_ms"]["p50"] for s in summaries]),
                    "proxy_path": fit([s["proxy_path_ms"]["p50"] for s in summaries]),
                },
                "memo_growth_equals_new_blocks": sum(1 for t in turns if all(g == t.new_blocks for g in t.memo_growth)),
                "memo_growth_within_new_blocks": all(g <= t.new_blocks for t in turns for g in t.memo_growth),
                "memo_growth_exceptions": [
                    {"messages": t.messages, "new_blocks": t.new_blocks, "memo_growth": sorted(set(t.memo_growth))}
                    for t in turns
                    if any(g != t.new_blocks for g in t.memo_growth)
                ],
                "memo_growth_later_turns_max": max(max(t.memo_growth) for t in turns[1:]),
                "session_memo_growth_later_turns_max": max(max(t.session_memo_growth) for t in turns[1:]),
                "session_memo_growth_total_median": statistics.median(
                    sum(v) for v in zip(*(t.session_memo_growth for t in turns), strict=True)
                ),
                "memo_growth_total_median": statistics.median(
                    sum(v) for v in zip(*(t.memo_growth for t in turns), strict=True)
                ),
                "all_turns": summaries,
            }
        )

    res["other_load"]["per_turn"] = other_load(snap, cpu_snap())

    # Part 3.
    res["profile"] = []
    for api, _make, provider in FORMATS:
        print(f"profiling the 200-message turn, {api}...", file=sys.stderr)
        prof = profile_last_turn(api, provider, wires_by_api[api], prof_reps, top=15)
        res["profile"].append({**prof, "provider": provider})
    res["peak_rss_end_mib"] = peak_rss_mib()
    res["loadavg_end"] = os.getloadavg()

    print(markdown(res))
    if args.json:
        Path(args.json).write_text(json.dumps(res, indent=1))
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
