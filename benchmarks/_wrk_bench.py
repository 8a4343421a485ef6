"""The closed-loop throughput part of ``proxy_bench.py`` (``--wrk``): ``wrk`` against each target at a few
connection counts, the targets taken in turn, round after round (the order rotating), so a slow spell of a shared
VM lands on all of them alike.

One wrk thread per connection, as an agent keeps its session on its own connection: each cycles through the same
conversations' turns in order (Lua, one body per line of a temporary file; ten turns each), with its thread number
in the first message, so every connection is its own sequence of sessions. Figures per target and
connection count: requests/s (mean over rounds), and the medians over rounds of wrk's latency p50 and p99 (ms),
non-2xx answers and socket errors (summed), and, when the target's processes are known, the CPU they used (user +
system, the process trees from Linux ``/proc``: workers, Node's threads and a Redis the target alone uses included)
as requests per CPU-second: throughput per core, whatever the number of processes or threads a target runs. Both
are counted over the whole run, the requests by the fake upstream (wrk's own count starts after its threads load
their bodies, and leaves out the requests in flight when it stops).
"""

from __future__ import annotations

import os
import re
import shutil
import statistics
import subprocess
import tempfile
from collections.abc import Callable, Iterable
from pathlib import Path
from typing import Any

_LUA = """
local counter = 0
function setup(thread)
  counter = counter + 1
  thread:set("id", counter)
end
local bodies = {}
local i = 0
function init(args)
  for line in io.lines("%(file)s") do
    bodies[#bodies + 1] = line:gsub("%%[stream %%d+", "[stream " .. id)
  end
end
wrk.method = "POST"
wrk.headers["content-type"] = "application/json"
wrk.headers["x-api-key"] = "sk-bench-0"
wrk.headers["anthropic-version"] = "2023-06-01"
%(extra)s
request = function()
  i = i %% #bodies + 1
  return wrk.format(nil, "%(path)s", nil, bodies[i])
end
"""

_UNITS = {"us": 0.001, "ms": 1.0, "s": 1000.0}


def _ms(text: str) -> float:
    m = re.fullmatch(r"([\d.]+)(us|ms|s)", text.strip())
    return float(m.group(1)) * _UNITS[m.group(2)] if m else float("nan")


def parse(out: str) -> dict[str, float]:
    """requests/s, latency p50/p99 (ms), non-2xx and socket errors from ``wrk --latency`` output."""
    rps = re.search(r"Requests/sec:\s+([\d.]+)", out)
    p50 = re.search(r"^\s+50%\s+(\S+)", out, re.M)
    p99 = re.search(r"^\s+99%\s+(\S+)", out, re.M)
    non2xx = re.search(r"Non-2xx or 3xx responses:\s+(\d+)", out)
    errors = re.search(r"Socket errors: connect (\d+), read (\d+), write (\d+), timeout (\d+)", out)
    return {
        "rps": float(rps.group(1)) if rps else 0.0,
        "p50": _ms(p50.group(1)) if p50 else float("nan"),
        "p99": _ms(p99.group(1)) if p99 else float("nan"),
        "non2xx": float(non2xx.group(1)) if non2xx else 0.0,
        "errors": float(sum(int(g) for g in errors.groups())) if errors else 0.0,
    }


def cpu_seconds(pids: Iterable[int]) -> float:
    """CPU seconds (user + system) used so far by processes ``pids`` and all their descendants (Linux ``/proc``;
    processes that exited meanwhile count no more)."""
    parent: dict[int, int] = {}
    used: dict[int, float] = {}
    tick = os.sysconf("SC_CLK_TCK")
    for stat in Path("/proc").glob("[0-9]*/stat"):
        try:
            fields = stat.read_text().rpartition(")")[2].split()
        except OSError:
            continue
        pid = int(stat.parent.name)
        parent[pid] = int(fields[1])
        used[pid] = (int(fields[11]) + int(fields[12])) / tick
    tree, todo = set(), list(pids)
    while todo:
        pid = todo.pop()
        if pid not in tree:
            tree.add(pid)
            todo += [child for child, ppid in parent.items() if ppid == pid]
    return sum(used.get(pid, 0.0) for pid in tree)


def throughput(
    targets: dict[str, tuple[int, str, dict[str, str]]],
    bodies: list[bytes],
    connections: list[int],
    seconds: int,
    rounds: int,
    pids: dict[str, list[int]] | None = None,
    served: Callable[[], int] | None = None,
) -> dict[int, dict[str, dict[str, float]]]:
    """``wrk`` figures per connection count and target (``name: (port, path, extra headers)``; ``pids``: each
    target's processes, and ``served``: the requests the upstream has answered so far, for requests per
    CPU-second), see the module docstring."""
    wrk = shutil.which("wrk")
    if wrk is None:
        raise RuntimeError("wrk is not installed (apt-get install wrk)")
    tmp = Path(tempfile.mkdtemp(prefix="agentcache-wrk-"))
    try:
        data = tmp / "bodies.txt"
        data.write_bytes(b"\n".join(b.replace(b"\n", b" ") for b in bodies) + b"\n")
        scripts = {}
        for name, (_, path, headers) in targets.items():
            extra = "\n".join(f'wrk.headers["{k}"] = "{v}"' for k, v in headers.items())
            script = tmp / f"{len(scripts)}.lua"
            script.write_text(_LUA % {"file": data, "path": path, "extra": extra})
            scripts[name] = script
        runs: dict[int, dict[str, list[dict[str, float]]]] = {c: {n: [] for n in targets} for c in connections}
        names = list(targets)
        for r in range(rounds):
            for c in connections:
                for name in names[r % len(names) :] + names[: r % len(names)]:
                    port = targets[name][0]
                    argv = [wrk, f"-t{c}", f"-c{c}", f"-d{seconds}s", "--latency", "-s", str(scripts[name])]
                    procs = (pids or {}).get(name) if served is not None else None
                    before = (cpu_seconds(procs), served()) if procs and served else (0.0, 0)
                    out = subprocess.run([*argv, f"http://127.0.0.1:{port}"], capture_output=True, text=True)
                    run = parse(out.stdout)
                    if procs and served:
                        run["cpu"], run["served"] = cpu_seconds(procs) - before[0], served() - before[1]
                    runs[c][name].append(run)
        return {c: {n: _summary(v) for n, v in level.items()} for c, level in runs.items()}
    finally:
        shutil.rmtree(tmp, ignore_errors=True)


def _summary(runs: list[dict[str, float]]) -> dict[str, float]:
    cpu = sum(r.get("cpu", 0.0) for r in runs)
    return {
        "rps": statistics.fmean(r["rps"] for r in runs),
        "per_cpu": sum(r.get("served", 0.0) for r in runs) / cpu if cpu else float("nan"),
        "p50": statistics.median(r["p50"] for r in runs),
        "p99": statistics.median(r["p99"] for r in runs),
        "non2xx": sum(r["non2xx"] for r in runs),
        "errors": sum(r["errors"] for r in runs),
    }


def markdown(res: dict[int, dict[str, dict[str, float]]], seconds: int, rounds: int) -> str:
    """The figures as a table, with each target's requests/s as a ratio of the first agentcache target's."""
    lines = [
        f"closed loop (wrk, a thread per connection, {rounds} rounds of {seconds} s per target and connection count, "
        "targets in turn):",
        "",
        "| connections | target | req/s | × agentcache | req per CPU-s | × agentcache | p50 ms | p99 ms | non-2xx "
        "| socket errors |",
        "|---:|---|---:|---:|---:|---:|---:|---:|---:|---:|",
    ]
    for c, level in res.items():
        ref = level.get("agentcache") or next(iter(level.values()))
        for name, m in level.items():
            ratio = m["rps"] / ref["rps"] if ref["rps"] else float("nan")
            per_cpu = m.get("per_cpu", float("nan")) / ref.get("per_cpu", float("nan"))
            lines.append(
                f"| {c} | {name} | {m['rps']:.0f} | {ratio:.2f} | {m.get('per_cpu', float('nan')):.0f} | "
                f"{per_cpu:.2f} | {m['p50']:.1f} | {m['p99']:.1f} | {m['non2xx']:.0f} | {m['errors']:.0f} |"
            )
    return "\n".join(lines)


def summary_of(res: dict[int, dict[str, dict[str, float]]]) -> dict[str, Any]:
    """JSON-ready figures (connection counts as strings)."""
    return {str(c): level for c, level in res.items()}
