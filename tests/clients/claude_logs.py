"""Claude Code's own logs, generated at test time: the real CLI run against the realistic fake upstream.

:func:`generate` runs one Claude Code binary through :data:`RUNS` in one private config dir (each a ``claude -p``
process: a fresh run, ``--continue``, a model switch, ``/compact``, a run after it, a subagent, and a ``--resume``
after a pause), with ``OTEL_LOG_RAW_API_BODIES=file:<home>/bodies``, and returns what the upstream saw (every body,
the usage of every answer: the truth the readers must reproduce) and which answers each run got.

The pause: before the ``--resume`` run the fake's clock moves on :data:`PAUSE` seconds, so the cache entries expire
as they would for a user who came back later; the transcript's timestamps are real time, so the lines that run
writes get the same offset afterwards (this helper plays the role of that user: the log then says what a real pause
would have made it say). The same goes for the dump index's timestamps.
"""

from __future__ import annotations

import json
import os
import re
import shutil
import subprocess
from dataclasses import dataclass, field
from datetime import datetime, timedelta
from pathlib import Path
from typing import Any

from tests.clients.drivers import ClaudeCode
from tests.clients.fake_upstream import FakeUpstream, serve

PAUSE = 600.0
#: (run name, claude arguments after ``-p``); ``{session}`` is the session the first run opened.
RUNS: tuple[tuple[str, tuple[str, ...]], ...] = (
    ("fresh", ("Print a marker. agentcache-script:shell",)),
    ("continue", ("--continue", "Print again. agentcache-script:shell")),
    ("model", ("--continue", "--model", "claude-sonnet-4-6", "Switch models. agentcache-script:shell")),
    ("compact", ("--continue", "/compact")),
    ("after_compact", ("--continue", "After the compaction. agentcache-script:shell")),
    ("subagent", ("--continue", "Delegate to a subagent. agentcache-script:task")),
    ("resume", ("--resume", "{session}", "Back after a pause. agentcache-script:shell")),
)


@dataclass
class Generated:
    """What one generation left: the config dir (``claude``), the dump folder (``bodies``), every model request body
    the upstream received (``bodies_sent``, in order), its usage log (``usage_log``: ``id`` without ``msg_``), the
    answers of each run (``runs``: run name -> response ids ``msg_...`` in order) and each run's exit and output."""

    home: Path
    version: str
    session: str = ""
    bodies_sent: list[dict[str, Any]] = field(default_factory=list)
    usage_log: list[dict[str, Any]] = field(default_factory=list)
    runs: dict[str, list[str]] = field(default_factory=dict)
    outputs: dict[str, tuple[int, str]] = field(default_factory=dict)

    @property
    def projects(self) -> Path:
        return self.home / "claude" / "projects"

    @property
    def dumps(self) -> Path:
        return self.home / "bodies"

    def body_of(self, response_id: str) -> dict[str, Any]:
        """The body the upstream answered with ``response_id`` (``msg_...``)."""
        ids = [f"msg_{u['id']}" for u in self.usage_log]
        return self.bodies_sent[ids.index(response_id)]


def version_of(binary: str) -> str | None:
    """``2.1.197`` from ``claude --version``, or None when the binary does not run."""
    try:
        out = subprocess.run([binary, "--version"], capture_output=True, text=True, timeout=60).stdout
    except (OSError, subprocess.SubprocessError):
        return None
    found = re.match(r"\s*(\d+\.\d+\.\d+)", out)
    return found.group(1) if found else None


def generate(binary: str, home: Path, version: str) -> Generated:
    """Run :data:`RUNS` with ``binary`` in ``home`` (see the module docstring)."""
    home.mkdir(parents=True, exist_ok=True)
    client = ClaudeCode(home)
    out = Generated(home, version)
    with serve(FakeUpstream(realistic=True)) as (fake, url):
        env = {**client.env(url), "OTEL_LOG_RAW_API_BODIES": f"file:{out.dumps}"}
        for name, args in RUNS:
            before = len(fake.usage_log)
            marks: dict[Path, int] = {}
            if name == "resume":
                fake.clock.advance(PAUSE)
                marks = _sizes(home)
            argv = [a.replace("{session}", out.session) for a in args]
            proc = run_print(binary, client, env, *argv)
            out.outputs[name] = (proc.returncode, proc.stdout[-300:] + proc.stderr[-1000:])
            out.runs[name] = [f"msg_{u['id']}" for u in fake.usage_log[before:]]
            if name == "fresh":
                out.session = next(out.projects.glob("*/*.jsonl")).stem
            if name == "resume":
                _shift_after(home, marks, PAUSE)
        out.bodies_sent = [r.body for r in fake.model_requests()]
        out.usage_log = list(fake.usage_log)
    return out


def run_print(binary: str, client: ClaudeCode, env: dict[str, str], *args: str) -> subprocess.CompletedProcess[str]:
    """Claude Code ``binary`` in print mode (``-p``) with ``args``, in ``client``'s work folder, with ``env``, no
    stdin and no permission prompts; its output captured (at most 180 s)."""
    return subprocess.run(
        [binary, "-p", *args, "--dangerously-skip-permissions"],
        cwd=client.work,
        env=env,
        stdin=subprocess.DEVNULL,
        capture_output=True,
        text=True,
        timeout=180,
    )


def _sizes(root: Path) -> dict[Path, int]:
    """The size of every JSON-lines file under ``root`` now (a file born later starts at 0)."""
    return {p: p.stat().st_size for p in root.rglob("*.jsonl")}


def _shift_after(home: Path, marks: dict[Path, int], seconds: float) -> None:
    """Move the top-level ``timestamp`` of every line written after ``marks`` by ``seconds``, in the transcripts
    and the dump index (see the module docstring)."""
    for path in home.rglob("*.jsonl"):
        start = marks.get(path, 0)
        data = path.read_bytes()
        lines = [_shift_line(line, seconds) for line in data[start:].split(b"\n")]
        path.write_bytes(data[:start] + b"\n".join(lines))


def _shift_line(line: bytes, seconds: float) -> bytes:
    if not line.strip():
        return line
    stamp = json.loads(line).get("timestamp")
    if not isinstance(stamp, str):
        return line
    when = datetime.fromisoformat(stamp.replace("Z", "+00:00")) + timedelta(seconds=seconds)
    shifted = when.strftime("%Y-%m-%dT%H:%M:%S.") + f"{when.microsecond // 1000:03d}Z"
    old = b'"timestamp":"' + stamp.encode() + b'"'
    return line.replace(old, b'"timestamp":"' + shifted.encode() + b'"', 1)


def binaries() -> dict[str, list[str]]:
    """Where to look for the Claude Code builds the tests run, by version: the one ``.ci/run`` pins (its npm cache
    ``npm``, else ``claude`` on PATH) and the newest one tried (``npm-latest``)."""
    root = Path(os.environ.get("AGENTCACHE_CACHE_DIR") or Path.home() / ".cache" / "agentcache")
    on_path = shutil.which("claude")
    return {
        "2.1.197": [str(root / "npm" / "node_modules" / ".bin" / "claude"), *([on_path] if on_path else [])],
        "2.1.332": [str(root / "npm-latest" / "node_modules" / ".bin" / "claude")],
    }


def find(version: str) -> str | None:
    """The first of :func:`binaries` that runs as ``version``, or None."""
    return next((b for b in binaries()[version] if version_of(b) == version), None)
