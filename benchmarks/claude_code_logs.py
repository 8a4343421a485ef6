"""Benchmark: reading a ``~/.claude/projects`` of realistic size with the ``claude-code`` reader (issue 21, item 7).

Usage::

    python benchmarks/claude_code_logs.py [--files 2000] [--mb 1000] [--dir DIR] [--keep]

Writes a corpus shaped like the transcripts Claude Code 2.1.197 and 2.1.332 write (the line kinds and fields
observed running them, ``tests/test_claude_code_logs.py``): half the sessions in each version's form, 2.1.332's with
its request records (shape, blobs, ``api-request`` lines whose hashes and ``requestDigest`` are right, so every body
is rebuilt), one session in ten with a subagent, tool results of log-normal size (median ~5 KB, a few of hundreds of
KB: most of a real transcript's bytes). Then reads it with ``load_paths``, each mode in its own process (for its peak
RSS): ``usage`` (``read(path, bodies=False)``: calls only), ``bodies`` (the default: 2.1.332's bodies rebuilt and
checked too) and ``noskip`` (usage, every line parsed: what the bytes prefilter saves). The files are in the page
cache (just written): the figures are the reader's, not the disk's. CPU seconds are reported beside wall time (the
reader is single-threaded; on a shared machine CPU time is the steadier figure).
"""

from __future__ import annotations

import argparse
import hashlib
import json
import math
import random
import resource
import shutil
import subprocess
import sys
import tempfile
import time
from pathlib import Path
from typing import Any

sys.path.insert(0, str(Path(__file__).resolve().parent.parent))

from agentcache.loaders._claude_code_request import RequestLog, canonical

_ALPHABET = "abcdefghijklmnopqrstuvwxyz      \n0123456789{}()=.,;:_-"
_rng = random.Random(21)
_TEXT = "".join(_rng.choice(_ALPHABET) for _ in range(1 << 21))


def _text(size: int) -> str:
    start = _rng.randrange(0, len(_TEXT) - size) if size < len(_TEXT) else 0
    return _TEXT[start : start + size]


def _hash(message: dict[str, Any]) -> str:
    content = message["content"]
    blocks = [{"type": "text", "text": content}] if isinstance(content, str) else content
    return hashlib.sha256(canonical({"content": blocks, "role": message["role"]})).hexdigest()


class _Session:
    """One transcript file being written, with 2.1.332's request records when ``records``."""

    def __init__(self, out: Any, sid: str, agent: str | None, records: bool, t0: float) -> None:
        self.out, self.sid, self.agent, self.records, self.t = out, sid, agent, records, t0
        self.version = "2.1.332" if records else "2.1.197"
        self.messages: list[dict[str, Any]] = []
        self.last_id: str | None = None
        self.log = RequestLog(Path("corpus"))
        self.system = [{"type": "text", "text": _text(8000)} for _ in range(3)]
        self.tools = [
            {"name": f"T{i}", "description": _text(1500), "input_schema": {"type": "object"}} for i in range(20)
        ]

    def write(self, obj: dict[str, Any]) -> None:
        self.out.write(json.dumps(obj, separators=(",", ":"), ensure_ascii=False) + "\n")

    def line(self, kind: str, message: dict[str, Any] | None = None, **extra: Any) -> dict[str, Any]:
        """A transcript line with its fields in the order Claude Code writes them (an assistant line's ``message``
        before its ``type``; a user line's ``type`` before its ``message``; an attachment before its ``type``)."""
        self.t += 0.7
        stamp = time.strftime("%Y-%m-%dT%H:%M:%S", time.gmtime(self.t)) + ".000Z"
        obj: dict[str, Any] = {"parentUuid": None, "isSidechain": self.agent is not None}
        if kind == "assistant":
            obj.update(message=message, **extra, type=kind)
        elif kind == "attachment":
            obj.update(**extra, type=kind)
        else:
            obj.update(promptId="p", type=kind, message=message, **extra)
        obj.update(uuid=f"{_rng.getrandbits(128):032x}", timestamp=stamp, userType="external", entrypoint="cli",
                   cwd="/home/u/proj", sessionId=self.sid, version=self.version, gitBranch="main")  # fmt: skip
        if self.agent:
            obj["agentId"] = self.agent
        return obj

    def request(self, tail: list[dict[str, Any]], first: bool) -> str | None:
        if not self.records:
            self.messages.extend(tail)
            return None
        if first:
            shape = {"system": self.system, "tools": self.tools}
            self.write({"type": "api-request-shape", "sessionId": self.sid, "shapeHash": "s1", "shape": shape})
        for m in tail[:1] if first else []:
            self.write({"type": "api-request-blob", "sessionId": self.sid, "hash": _hash(m), "message": m})
        keep = len(self.messages)
        self.messages.extend(tail)
        last = len(self.messages) - 1
        content = self.messages[last]["content"]
        n = 0 if isinstance(content, str) else len(content) - 1
        marks = [{"path": ["system", 0], "value": {"type": "ephemeral"}},
                 {"path": ["messages", last, "content", n], "value": {"type": "ephemeral"}}]  # fmt: skip
        params = {"model": "claude-sonnet-4-6", "betas": ["claude-code-20250219"], "max_tokens": 32000}
        rid = f"{_rng.getrandbits(128):032x}"
        line = {"type": "api-request", "sessionId": self.sid, "id": rid, "timestamp": "2026-12-01T00:00:00.000Z",
                "version": self.version, "querySource": "repl_main_thread", "shapeHash": "s1", "params": params,
                "thread": {"type": "none"}, "keep": keep, "tail": [_hash(m) for m in tail], "cacheControl": marks,
                "requestDigest": self._digest(params, marks)}  # fmt: skip
        if self.last_id:
            line["base"] = self.last_id
        self.last_id = rid
        self.write(line)
        return rid

    def _digest(self, params: dict[str, Any], marks: list[dict[str, Any]]) -> str:
        """The digest Claude Code would write (the reader's own code computes it: the corpus is for timing)."""
        system = [dict(self.system[0], cache_control=marks[0]["value"]), *self.system[1:]]
        last = self.messages[-1]
        content = last["content"]
        blocks = [{"type": "text", "text": content}] if isinstance(content, str) else [dict(b) for b in content]
        blocks[-1]["cache_control"] = marks[1]["value"]
        messages = [*self.messages[:-1], {"role": last["role"], "content": blocks}]
        return self.log._digest(params, {"system": system, "messages": messages, "tools": self.tools})

    def turns(self, count: int, median: float) -> int:
        """Write ``count`` calls (each answering a tool result); the number of calls written."""
        prompt = {
            "role": "user",
            "content": [{"type": "text", "text": _text(600)}, {"type": "text", "text": "Fix it."}],
        }
        self.write({"type": "queue-operation", "operation": "enqueue", "sessionId": self.sid, "content": "Fix it."})
        self.write(self.line("user", {"role": "user", "content": "Fix it."}))
        for _ in range(3):
            self.write(self.line("attachment", attachment={"type": "skill_listing", "content": _text(1500)}))
        tail = [prompt]
        for n in range(count):
            ref = self.request(tail, first=n == 0)
            mid, req = f"msg_{_rng.getrandbits(96):024x}", f"req_{_rng.getrandbits(96):024x}"
            usage = {"input_tokens": 3, "cache_creation_input_tokens": 900, "cache_read_input_tokens": 9000 + 900 * n,
                     "cache_creation": {"ephemeral_5m_input_tokens": 900, "ephemeral_1h_input_tokens": 0},
                     "output_tokens": 120}  # fmt: skip
            tool = {"type": "tool_use", "id": f"toolu_{mid}", "name": "Bash", "input": {"command": "ls"}}
            blocks = [{"type": "text", "text": _text(300)}, tool]
            extra = {"requestId": req, **({"requestRef": ref} if ref else {})}
            for block in blocks:  # one line per content block, the usage repeated
                message = {"id": mid, "type": "message", "role": "assistant", "model": "claude-sonnet-4-6",
                           "content": [block], "stop_reason": "tool_use", "usage": usage}  # fmt: skip
                self.write(self.line("assistant", message, **extra))
            size = min(int(median * math.exp(_rng.gauss(0, 1.3))), 600_000)
            result = {"tool_use_id": f"toolu_{mid}", "type": "tool_result", "content": _text(size), "is_error": False}
            user = {"role": "user", "content": [result]}
            self.write(self.line("user", user, toolUseResult={"stdout": _text(min(size, 2000))}))
            tail = [{"role": "assistant", "content": blocks}, user]
        self.write({"type": "last-prompt", "lastPrompt": "Fix it.", "sessionId": self.sid})
        if self.records:
            self.write({"type": "cost-state", "sessionId": self.sid, "startTime": 1})
        return count


def generate(root: Path, files: int, megabytes: float) -> tuple[int, int]:
    """Write the corpus; (files, calls) written."""
    per_file = megabytes * 1e6 / files
    calls = written = 0
    n = 0
    while written < files:
        sid = f"{_rng.getrandbits(128):032x}"
        records = n % 2 == 1
        count = _rng.randint(10, 60)
        median = per_file / count / 2.4  # the log-normal's mean is ~2.3x its median; plus the other lines
        folder = root / f"-home-u-proj{n % 40}"
        folder.mkdir(parents=True, exist_ok=True)
        with open(folder / f"{sid}.jsonl", "w", encoding="utf-8") as f:
            calls += _Session(f, sid, None, records, 1.79e9 + n * 3600).turns(count, median)
        written += 1
        if n % 10 == 0 and written < files:
            sub = folder / sid / "subagents"
            sub.mkdir(parents=True)
            with open(sub / f"agent-a{n:016x}.jsonl", "w", encoding="utf-8") as f:
                calls += _Session(f, sid, f"a{n:016x}", records, 1.79e9 + n * 3600).turns(6, median)
            written += 1
        n += 1
    return written, calls


def _read(root: Path, mode: str) -> dict[str, Any]:
    """Read the corpus in one ``mode`` (this process): time, calls, records, peak RSS."""
    from agentcache.loaders import _claude_code
    from agentcache.loaders._formats import LOG_FORMATS
    from agentcache.loaders._paths import load_paths

    if mode != "bodies":

        def usage_only(path: Path) -> Any:
            return _claude_code.read(path, bodies=False)

        object.__setattr__(LOG_FORMATS[0], "read", usage_only)  # the registry's claude-code entry, calls only
        if mode == "noskip":
            _claude_code._Transcript.skip = lambda self, raw: False  # type: ignore[method-assign]
    start, cpu = time.perf_counter(), time.process_time()
    inputs = load_paths([root])
    seconds, cpu = time.perf_counter() - start, time.process_time() - cpu
    rss = resource.getrusage(resource.RUSAGE_SELF).ru_maxrss / 1024
    return {
        "mode": mode,
        "seconds": round(seconds, 2),
        "cpu": round(cpu, 2),
        "files": len(inputs.files),
        "calls": len(inputs.usage_records),
        "records": len(inputs.records),
        "peak_rss_mb": round(rss),
    }


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    parser.add_argument("--files", type=int, default=2000)
    parser.add_argument("--mb", type=float, default=1000.0)
    parser.add_argument("--dir", type=Path, default=None, help="where to write the corpus (default: a temp dir)")
    parser.add_argument("--keep", action="store_true", help="keep the corpus")
    parser.add_argument("--read", choices=["usage", "bodies", "noskip"], help=argparse.SUPPRESS)
    parser.add_argument("--reuse", action="store_true", help="read the corpus already in --dir")
    args = parser.parse_args()
    if args.read:
        print(json.dumps(_read(args.dir, args.read)))
        return
    root = args.dir or Path(tempfile.mkdtemp(prefix="cc-corpus-")) / "projects"
    start = time.perf_counter()
    if not args.reuse:
        files, calls = generate(root, args.files, args.mb)
        print(f"corpus: {files} files, {calls} calls, written in {time.perf_counter() - start:.0f} s")
    size = sum(p.stat().st_size for p in root.rglob("*.jsonl")) / 1e6
    print(f"{size:.0f} MB")
    try:
        for mode in ("usage", "bodies", "noskip"):
            cmd = [sys.executable, __file__, "--dir", str(root), "--read", mode]
            result = json.loads(subprocess.run(cmd, capture_output=True, text=True, check=True).stdout)
            seconds, cpu, calls = result["seconds"], result["cpu"], result["calls"]
            print(
                f"{mode:7s} {seconds:7.2f} s wall, {cpu:7.2f} s CPU: {size / cpu:5.0f} MB and {calls / cpu:5.0f} calls"
                f" per CPU second; calls {calls}, records {result['records']}, peak RSS {result['peak_rss_mb']} MB"
            )
    finally:
        if not args.keep and args.dir is None:
            shutil.rmtree(root.parent)


if __name__ == "__main__":
    main()
