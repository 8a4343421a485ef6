"""How fast ``agentcache audit`` reads a real-sized ``~/.claude/projects``, side by side with ccusage on the same files.

Writes a synthetic corpus in Claude Code's transcript format (:mod:`_claude_corpus`: thousands of sessions,
subagents, compactions, tool outputs of realistic size) of about ``--mb`` megabytes, then runs, in one run and
alternating, ``agentcache audit DIR --json`` and (when installed) ``ccusage daily --json --offline`` with
``CLAUDE_CONFIG_DIR`` pointing at it. Reports each one's wall time (median of ``--runs``), throughput (MB/s, calls/s),
peak RSS of the process, and agentcache's time as a ratio of ccusage's; and checks that both count the same tokens
(each API call once). ccusage does less (token and cost tables, no causes, no what-if), so the ratio says what
agentcache's analysis costs on top of reading.

    python benchmarks/audit_logs_bench.py --mb 200 --runs 3 [--ccusage PATH] [--keep DIR]

ccusage: ``npm install --prefix ~/.cache/agentcache/npm-peers ccusage@17`` (pure JavaScript; newer releases need a
native binary per platform).
"""

from __future__ import annotations

import argparse
import json
import os
import shutil
import statistics
import subprocess
import sys
import tempfile
import time
from pathlib import Path
from typing import Any

sys.path.insert(0, str(Path(__file__).resolve().parent))

from _claude_corpus import Corpus, Shape, write_corpus

DEFAULT_CCUSAGE = Path.home() / ".cache" / "agentcache" / "npm-peers" / "node_modules" / ".bin" / "ccusage"


def corpus(root: Path, mb: float) -> Corpus:
    """A corpus of about ``mb`` megabytes (sessions scaled from a small probe)."""
    probe = write_corpus(root / "probe", Shape(sessions=20, seed=1))
    shutil.rmtree(root / "probe")
    sessions = max(1, round(20 * mb * 1e6 / probe.bytes))
    return write_corpus(root / "projects", Shape(sessions=sessions, days=30, seed=2))


def timed(cmd: list[str], env: dict[str, str]) -> tuple[float, int, str]:
    """Wall seconds, peak RSS (KB) of this child alone (``os.wait4``'s rusage), and its stdout."""
    with tempfile.TemporaryFile() as out:
        start = time.perf_counter()
        proc = subprocess.Popen(cmd, env=env, stdout=out, stderr=subprocess.DEVNULL)
        _, status, usage = os.wait4(proc.pid, 0)
        wall = time.perf_counter() - start
        proc.returncode = os.waitstatus_to_exitcode(status)
        if proc.returncode:
            raise subprocess.CalledProcessError(proc.returncode, cmd)
        out.seek(0)
        return wall, usage.ru_maxrss, out.read().decode()


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    parser.add_argument("--mb", type=float, default=200.0, help="corpus size, megabytes")
    parser.add_argument("--runs", type=int, default=3)
    parser.add_argument("--ccusage", type=Path, default=DEFAULT_CCUSAGE)
    parser.add_argument("--keep", type=Path, help="write the corpus here and keep it")
    args = parser.parse_args()
    root = args.keep or Path(tempfile.mkdtemp(prefix="agentcache-logs-bench-"))
    made = corpus(root, args.mb)
    print(f"corpus: {made.files:,} files, {made.bytes / 1e6:,.0f} MB, {made.calls:,} calls, {made.sessions:,} sessions")
    env = dict(os.environ, CLAUDE_CONFIG_DIR=str(root))
    ours = [sys.executable, "-m", "agentcache", "audit", str(root / "projects"), "--json"]
    theirs = [str(args.ccusage), "daily", "--json", "--offline"] if args.ccusage.exists() else None
    times: dict[str, list[float]] = {"agentcache": [], "ccusage": []}
    peaks: dict[str, int] = {}
    outputs: dict[str, Any] = {}
    for _ in range(args.runs):  # alternating, so a busy moment of the machine hits both
        for name, cmd in (("agentcache", ours), ("ccusage", theirs)):
            if cmd is None:
                continue
            wall, peak, out = timed(cmd, env)
            times[name].append(wall)
            peaks[name] = peak
            outputs[name] = json.loads(out)
    report(made, times, peaks, outputs)
    if args.keep is None:
        shutil.rmtree(root, ignore_errors=True)


def report(made: Corpus, times: dict[str, list[float]], peaks: dict[str, int], outputs: dict[str, Any]) -> None:
    mb = made.bytes / 1e6
    for name, walls in times.items():
        if not walls:
            continue
        med = statistics.median(walls)
        print(
            f"{name:>10}: {med:6.2f} s median of {len(walls)} ({mb / med:,.1f} MB/s, {made.calls / med:,.0f} calls/s), "
            f"peak RSS {peaks[name] / 1024:,.0f} MB"
        )
    totals = outputs["agentcache"]["totals"]["reported"]
    print(
        f"agentcache counted {totals['requests']:,} calls, {totals['cache_read_tokens']:,} read and "
        f"{totals['cache_write_tokens']:,} written tokens (the corpus: {made.calls:,}, {made.cache_read_tokens:,}, "
        f"{made.cache_write_tokens:,})"
    )
    if times["ccusage"]:
        days = outputs["ccusage"]["daily"]
        read = sum(d["cacheReadTokens"] for d in days)
        written = sum(d["cacheCreationTokens"] for d in days)
        print(f"ccusage counted {read:,} read and {written:,} written tokens")
        ratio = statistics.median(times["agentcache"]) / statistics.median(times["ccusage"])
        print(f"agentcache / ccusage wall time: {ratio:.2f}x")


if __name__ == "__main__":
    main()
