"""How long the command line takes to answer ``--help``, side by side with a bare typer app (issue 22).

Times, in one run and interleaved (round-robin, so load drifts hit every command alike), the wall-clock time of:

* ``python -m agentcache --help`` and ``python -m agentcache audit --help`` (this checkout, and with
  ``--baseline PYTHON`` another checkout's interpreter, e.g. a worktree of main before a change);
* ``python -c "import typer"``, a bare typer app's ``--help`` (a one-command app written inline) and a bare
  typer group's ``sub --help`` (a root option and one subcommand, agentcache's shape): what any typer command
  line pays before its own code.

Prints the median wall and CPU (user + system) time of each, ``agentcache --help`` against the bare app and
``agentcache audit --help`` against the bare group (difference and ratio); the goal is ``agentcache --help`` at
most 0.3 s slower than the bare app. Every process runs in an empty temporary directory, so ``python -m
agentcache`` cannot import a clone from the working directory.

    python benchmarks/cli_startup.py --runs 15
    python benchmarks/cli_startup.py --baseline /tmp/before/.venv/bin/python
"""

from __future__ import annotations

import argparse
import resource
import statistics
import subprocess
import sys
import tempfile
import time

BARE_APP = (
    "import typer\n"
    "app = typer.Typer()\n"
    "@app.command()\n"
    "def hello(name: str = 'x', count: int = 1) -> None:\n"
    "    'Say hello.'\n"
    "app()\n"
)
#: The same shape as agentcache's: a group with a root option and a subcommand (typer coerces the root's options,
#: through pydantic, before the subcommand's ``--help``), the fair twin of ``agentcache audit --help``.
BARE_GROUP = (
    "import typer\n"
    "app = typer.Typer()\n"
    "@app.callback()\n"
    "def root(level: str | None = None) -> None:\n"
    "    'A group.'\n"
    "@app.command()\n"
    "def sub(name: str = 'x', count: int = 1) -> None:\n"
    "    'Say hello.'\n"
    "app()\n"
)
GOAL_S = 0.3

Timings = dict[str, list[tuple[float, float]]]


def commands(python: str, baseline: str | None) -> dict[str, list[str]]:
    """Label → argv of every timed command."""
    out = {
        "python -c 'import typer'": [python, "-c", "import typer"],
        "bare typer app --help": [python, "-c", BARE_APP, "--help"],
        "bare typer group sub --help": [python, "-c", BARE_GROUP, "sub", "--help"],
        "agentcache --help": [python, "-m", "agentcache", "--help"],
        "agentcache audit --help": [python, "-m", "agentcache", "audit", "--help"],
    }
    if baseline is not None:
        out["baseline agentcache --help"] = [baseline, "-m", "agentcache", "--help"]
        out["baseline agentcache audit --help"] = [baseline, "-m", "agentcache", "audit", "--help"]
    return out


def timed(argv: list[str], cwd: str) -> tuple[float, float]:
    """``(wall, cpu)`` seconds of one run of ``argv`` (cpu: the child's user + system time, which a busy machine
    disturbs less than wall time); raises CalledProcessError if it fails."""
    before = resource.getrusage(resource.RUSAGE_CHILDREN)
    start = time.perf_counter()
    subprocess.run(argv, cwd=cwd, check=True, stdout=subprocess.DEVNULL, stderr=subprocess.DEVNULL)
    wall = time.perf_counter() - start
    after = resource.getrusage(resource.RUSAGE_CHILDREN)
    return wall, (after.ru_utime - before.ru_utime) + (after.ru_stime - before.ru_stime)


def measure(cmds: dict[str, list[str]], runs: int) -> Timings:
    """``runs`` timings per command, round-robin after one untimed warm-up each (file cache, .pyc files)."""
    times: Timings = {label: [] for label in cmds}
    with tempfile.TemporaryDirectory() as cwd:
        for argv in cmds.values():
            timed(argv, cwd)
        for _ in range(runs):
            for label, argv in cmds.items():
                times[label].append(timed(argv, cwd))
    return times


def report(times: Timings) -> list[str]:
    """The table and the comparisons (wall and CPU medians), as lines."""
    wall = {label: statistics.median(w for w, _ in ts) for label, ts in times.items()}
    cpu = {label: statistics.median(c for _, c in ts) for label, ts in times.items()}
    width = max(map(len, wall))
    lines = [f"{'command':<{width}}  wall s: median (min-max)  cpu s: median"]
    for label, ts in times.items():
        walls = [w for w, _ in ts]
        lines.append(f"{label:<{width}}  {wall[label]:13.3f} ({min(walls):.3f}-{max(walls):.3f})  {cpu[label]:13.3f}")
    pairs = [("agentcache --help", "bare typer app --help"), ("agentcache audit --help", "bare typer group sub --help")]
    pairs += [(f"baseline {a}", b) for a, b in pairs]
    for label, bare in pairs:
        if label in wall:
            lines.append(
                f"{label} vs {bare}: wall {wall[label] - wall[bare]:+.3f} s ({wall[label] / wall[bare]:.2f}x), "
                f"cpu {cpu[label] - cpu[bare]:+.3f} s ({cpu[label] / cpu[bare]:.2f}x)"
            )
    met = wall["agentcache --help"] - wall["bare typer app --help"] <= GOAL_S
    lines.append(f"goal (agentcache --help within {GOAL_S} s of the bare app, wall): {'met' if met else 'NOT met'}")
    return lines


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("--runs", type=int, default=15, help="timed runs per command (default 15)")
    parser.add_argument("--baseline", help="another checkout's Python (its agentcache is timed too)")
    parser.add_argument("--python", default=sys.executable, help="this checkout's Python (default: this one)")
    args = parser.parse_args()
    print("\n".join(report(measure(commands(args.python, args.baseline), args.runs))))


if __name__ == "__main__":
    main()
