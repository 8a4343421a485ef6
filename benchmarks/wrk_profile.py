"""Where the proxy's CPU goes under load: ``agentcache proxy`` in front of ``proxy_bench.py``'s fake upstream, driven
by ``wrk`` with the same growing 46 KB conversations as ``proxy_bench.py --wrk`` (a connection per stream), sampled
by ``py-spy`` (``pip install py-spy``; a sampling profiler, so the proxy runs at full speed) for the middle of the
run; prints each function's share of the samples, by itself (``self``) and with what it calls (``inclusive``).

    python benchmarks/wrk_profile.py                      # the pipeline route, 32 connections
    python benchmarks/wrk_profile.py --path /relay/v1/messages --top 30
"""

from __future__ import annotations

import argparse
import collections
import re
import shutil
import subprocess
import sys
import tempfile
import time
from pathlib import Path

sys.path.insert(0, str(Path(__file__).resolve().parent))
from _wrk_bench import _LUA
from proxy_bench import Conversations, proxy_behind

_FRAME = re.compile(r"(.*?) \((.*?):\d+\)")


def _name(frame: str) -> str:
    m = _FRAME.match(frame)
    if m is None:
        return frame
    return f"{m.group(1)} ({m.group(2).split('site-packages/')[-1]})"


def shares(collapsed: str) -> tuple[int, collections.Counter[str], collections.Counter[str]]:
    """``(samples, self, inclusive)`` from py-spy's ``raw`` (collapsed stacks) output: samples per function."""
    own: collections.Counter[str] = collections.Counter()
    incl: collections.Counter[str] = collections.Counter()
    total = 0
    for line in collapsed.splitlines():
        stack, _, n = line.rpartition(" ")
        if not n.isdigit():
            continue
        frames = [_name(f) for f in stack.split(";")]
        total += int(n)
        own[frames[-1]] += int(n)
        for name in set(frames):
            incl[name] += int(n)
    return total, own, incl


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("--path", default="/v1/messages", help="the route driven (default the pipeline's)")
    parser.add_argument("--connections", type=int, default=32)
    parser.add_argument("--seconds", type=int, default=18, help="seconds sampled (wrk runs 7 s longer)")
    parser.add_argument("--top", type=int, default=40, help="rows of each table")
    args = parser.parse_args()
    spy, wrk = shutil.which("py-spy"), shutil.which("wrk")
    if spy is None or wrk is None:
        raise SystemExit("needs py-spy (pip install py-spy) and wrk (apt-get install wrk)")
    convs = Conversations(50_000)
    bodies = [b for n in range(20) for b in convs.session(1000 + n)]
    tmp = Path(tempfile.mkdtemp(prefix="agentcache-wrk-profile-"))
    (tmp / "bodies.txt").write_bytes(b"\n".join(b.replace(b"\n", b" ") for b in bodies) + b"\n")
    (tmp / "run.lua").write_text(_LUA % {"file": tmp / "bodies.txt", "path": args.path, "extra": ""})
    c = str(args.connections)
    with proxy_behind(str(Path(__file__).resolve().parent / "proxy_bench.py"), 512) as (port, pid):
        url = f"http://127.0.0.1:{port}"
        load = [wrk, "-t" + c, "-c" + c, f"-d{args.seconds + 7}s", "--latency", "-s", str(tmp / "run.lua"), url]
        with subprocess.Popen(load, stdout=subprocess.PIPE, text=True) as running:
            time.sleep(4)  # wrk's threads load their bodies first
            out = tmp / "stacks.txt"
            record = [spy, "record", "-p", str(pid), "-d", str(args.seconds), "-r", "250", "-f", "raw", "-o", str(out)]
            subprocess.run([*record, "--nonblocking"], capture_output=True, check=True)
            summary = running.communicate()[0]
    print("\n".join(line for line in summary.splitlines() if "Requests/sec" in line or "%" in line))
    total, own, incl = shares(out.read_text())
    print(f"\n{total} samples; self:")
    for name, n in own.most_common(args.top):
        print(f"{100 * n / total:5.1f}%  {name}")
    print("\ninclusive:")
    for name, n in incl.most_common(args.top):
        print(f"{100 * n / total:5.1f}%  {name}")
    shutil.rmtree(tmp, ignore_errors=True)


if __name__ == "__main__":
    main()
