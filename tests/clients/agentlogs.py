"""Generate agents' own logs at test time: a real client's scripted runs against the realistic fake upstream
(:class:`~tests.clients.fake_upstream.FakeUpstream` with ``realistic=True``), whose ``usage_log`` is the truth a
reader of the client's logs must reproduce.

A step may follow a pause: the fake's clock is moved on (its cache entries age), and afterwards every timestamp
the client logged from that step on is moved by the same offset — the test plays a user who paused, without
waiting. Only the timestamps the readers use are moved (a JSON line's top-level ``timestamp``; opencode's message
``time`` in the database).
"""

from __future__ import annotations

import json
import os
import sqlite3
import time
from collections.abc import Callable, Iterable
from contextlib import closing
from dataclasses import dataclass, field
from datetime import UTC, datetime
from pathlib import Path
from typing import Any

import pytest

from tests import needs
from tests.clients.drivers import Client, RunOutput, find_binary
from tests.clients.fake_upstream import FakeUpstream, serve


@dataclass
class Step:
    """One client run: ``prompt`` (``resume`` continues the last conversation) after ``pause`` seconds of the
    user's time; ``setup`` adjusts the driver first (a config limit, another model or API)."""

    name: str
    prompt: str
    resume: bool = False
    pause: float = 0.0
    setup: Callable[[Client, FakeUpstream], None] | None = None


@dataclass
class Generated:
    """What the steps left: the client's ``home``, the fake (``usage_log``, ``requests``), each step's output and
    the usage-log entries of its calls."""

    home: Path
    fake: FakeUpstream
    outputs: dict[str, RunOutput] = field(default_factory=dict)
    calls: dict[str, list[dict[str, Any]]] = field(default_factory=dict)

    def step_of(self, entry_id: str) -> str:
        """The step whose run made the call with fake response id ``entry_id``."""
        return next(step for step, calls in self.calls.items() if any(c["id"] == entry_id for c in calls))


def require(binary: str) -> None:
    """Skip the module when ``binary`` is not installed (fail under ``AGENTCACHE_REQUIRE_CLIENTS=1``, as CI sets)."""
    if find_binary(binary) is None:
        message = needs.agent_cli(binary)
        if os.environ.get("AGENTCACHE_REQUIRE_CLIENTS") == "1":
            pytest.fail(message)
        pytest.skip(message)


def generate(driver: Client, steps: Iterable[Step], shift: Callable[[Path, float, float], None]) -> Generated:
    """Run ``steps`` with ``driver`` against a realistic fake; then ``shift(home, since, seconds)`` moves the
    timestamps logged at or after wall time ``since`` by ``seconds``, for each pause (latest first, so offsets add
    up). Raises AssertionError when a run fails."""
    pauses: list[tuple[float, float]] = []
    with serve(FakeUpstream(realistic=True)) as (fake, url):
        out = Generated(driver.home, fake)
        for step in steps:
            if step.pause:
                fake.clock.advance(step.pause)
                pauses.append((time.time(), step.pause))
            if step.setup is not None:
                step.setup(driver, fake)
            start = len(fake.usage_log)
            out.outputs[step.name] = run = driver.run(url, step.prompt, step.resume)
            assert run.returncode == 0, (step.name, run.stdout[-1000:], run.stderr[-3000:])
            out.calls[step.name] = fake.usage_log[start:]
    for since, seconds in reversed(pauses):
        shift(driver.home, since, seconds)
    return out


def _iso(seconds: float) -> str:
    return datetime.fromtimestamp(seconds, UTC).isoformat(timespec="milliseconds").replace("+00:00", "Z")


def shift_jsonl(files: Iterable[Path], since: float, seconds: float) -> None:
    """Move the top-level ``timestamp`` (ISO 8601) of every line logged at or after ``since`` by ``seconds``."""
    for path in files:
        lines = []
        for raw in path.read_text().splitlines():
            obj = json.loads(raw) if raw.strip() else None
            if isinstance(obj, dict) and isinstance(obj.get("timestamp"), str):
                at = datetime.fromisoformat(obj["timestamp"]).timestamp()
                if at >= since:
                    obj["timestamp"] = _iso(at + seconds)
                raw = json.dumps(obj)
            lines.append(raw)
        path.write_text("\n".join(lines) + "\n")


def shift_opencode(db: Path, since: float, seconds: float) -> None:
    """Move the messages opencode created at or after ``since`` by ``seconds``: the ``time_created`` column, the
    message's ``time.created``/``time.completed`` (ms) and its id, whose first 12 hex digits are its creation time
    (``packages/opencode/src/id/id.ts``: the low 48 bits of ms × 4096 + a counter). opencode is not running."""
    since_ms, offset = int(since * 1000), int(seconds * 1000)
    with closing(sqlite3.connect(db)) as con, con:
        rows = con.execute("SELECT id, data FROM message WHERE time_created >= ?", (since_ms,)).fetchall()
        for mid, data in rows:
            msg = json.loads(data)
            for key in ("created", "completed"):
                if isinstance(msg.get("time", {}).get(key), int):
                    msg["time"][key] += offset
            new = _shift_id(mid, offset)
            con.execute(
                "UPDATE message SET id = ?, time_created = time_created + ?, data = ? WHERE id = ?",
                (new, offset, json.dumps(msg, separators=(",", ":")), mid),
            )
            con.execute("UPDATE part SET message_id = ? WHERE message_id = ?", (new, mid))


def _shift_id(mid: str, offset_ms: int) -> str:
    prefix, rest = mid.split("_", 1)
    stamp = (int(rest[:12], 16) + (offset_ms << 12)) % (1 << 48)
    return f"{prefix}_{stamp:012x}{rest[12:]}"


def usage_triples(entries: Iterable[dict[str, Any]]) -> list[tuple[int, int, int]]:
    """``(prompt, cache read, output)`` of fake usage-log entries, whatever their API (Anthropic's prompt is the
    uncached remainder plus the cache read and write)."""
    out = []
    for e in entries:
        u = e["usage"]
        if "prompt_tokens" in u:
            prompt, read = u["prompt_tokens"], u["prompt_tokens_details"]["cached_tokens"]
            out.append((prompt, read, u["completion_tokens"]))
        elif "input_tokens_details" in u:
            out.append((u["input_tokens"], u["input_tokens_details"]["cached_tokens"], u["output_tokens"]))
        else:
            write, read = u["cache_creation_input_tokens"], u["cache_read_input_tokens"]
            out.append((u["input_tokens"] + read + write, read, u["output_tokens"]))
    return out
