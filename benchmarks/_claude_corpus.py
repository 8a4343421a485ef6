"""A synthetic ``~/.claude/projects`` of any size, in Claude Code's transcript format, with usage a provider cache
would report: for the audit-of-logs benchmark (``benchmarks/audit_logs_bench.py``) and the sample bundled with the
package (``agentcache audit --sample``).

The line shapes are those Claude Code 2.1.197 writes (observed running it against a scripted upstream): ``user``
lines (a prompt, or tool results), one or two ``assistant`` lines per API call sharing ``message.id`` and
``requestId`` (the last carries the final usage), ``system`` ``compact_boundary`` lines, ``queue-operation`` and
``last-prompt`` lines around each process, subagents in ``<session>/subagents/agent-<id>.jsonl``. Text is generated
(words from a small list), never a real agent's prompt.

Usage follows Anthropic's prompt cache: the tools and system prompt (``static`` tokens) are shared by every
session of a model while some session touched them within the TTL; a session reads what it cached at its previous
call when the pause is within the TTL (5m, or 1h for the sessions that write 1h), else writes it all again; a
compaction replaces the history with a summary; a new process (``--continue``) rebuilds the system prompt, so only
the tools are read. So the corpus holds every inferred cause: ``ttl.expired``, ``messages.compacted``,
``session.resumed``, ``options.model``, and session and subagent starts.
"""

from __future__ import annotations

import datetime as dt
import json
import random
import uuid
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

WORDS = (
    "cache",
    "prefix",
    "token",
    "session",
    "request",
    "tool",
    "system",
    "message",
    "write",
    "read",
    "model",
    "agent",
    "turn",
    "result",
    "error",
    "test",
    "file",
    "line",
    "build",
    "run",
    "check",
    "value",
    "count",
    "state",
    "entry",
    "pause",
    "branch",
    "commit",
    "patch",
    "diff",
    "output",
    "input",
    "format",
    "parse",
)
MODELS = ("claude-sonnet-4-6", "claude-opus-4-8")
TOOLS_TOKENS, SYSTEM_TOKENS = 14_000, 6_000


@dataclass
class Shape:
    """How the corpus looks: ``sessions`` main sessions over ``days`` days; user turns per session; tool calls per
    turn; tool output size (tokens); the share of sessions on 1h TTLs, that spawn subagents, that switch models;
    compaction above ``compact_at`` prompt tokens; the share of turns after which the client rewrote its history
    (``edit_share``: only the tools and system prompt still match); ``text_per_token`` characters written per
    token counted."""

    sessions: int = 20
    days: int = 3
    turns: tuple[int, int] = (3, 12)
    calls_per_turn: tuple[int, int] = (1, 6)
    output_tokens: tuple[int, int] = (50, 4_000)
    one_hour_share: float = 0.2
    subagent_share: float = 0.3
    model_switch_share: float = 0.1
    edit_share: float = 0.04
    compact_at: int = 120_000
    text_per_token: float = 4.0  # characters of text written per token counted (the sample writes less text)
    seed: int = 7
    start: float = 1_796_000_000.0


@dataclass
class _Cache:
    """The shared static prefix per model: when it was last touched and with which TTL."""

    touched: dict[str, tuple[float, float]] = field(default_factory=dict)

    def static_alive(self, model: str, now: float) -> bool:
        at, ttl = self.touched.get(model, (-1e18, 0.0))
        return now - at <= ttl

    def touch(self, model: str, now: float, ttl: float) -> None:
        at, old = self.touched.get(model, (-1e18, 0.0))
        self.touched[model] = (now, max(ttl, old if now - at <= old else 0.0))


class _Writer:
    """Lines of one transcript file."""

    def __init__(
        self, path: Path, session: str, cwd: str, rng: random.Random, agent: str | None = None, chars: float = 4.0
    ) -> None:
        self.path, self.session, self.cwd, self.rng, self.agent, self.chars = path, session, cwd, rng, agent, chars
        self.lines: list[dict[str, Any]] = []
        self.parent: str | None = None

    def _base(self, kind: str, at: float) -> dict[str, Any]:
        line: dict[str, Any] = {"parentUuid": self.parent, "isSidechain": self.agent is not None}
        if self.agent is not None:
            line["agentId"] = self.agent
        stamp = dt.datetime.fromtimestamp(at, dt.UTC).isoformat(timespec="milliseconds").replace("+00:00", "Z")
        line.update(type=kind, uuid=str(uuid.UUID(int=self.rng.getrandbits(128))), timestamp=stamp)
        line.update(userType="external", entrypoint="cli", cwd=self.cwd, sessionId=self.session, version="2.1.197")
        self.parent = line["uuid"]
        return line

    def text(self, tokens: int) -> str:
        words = max(1, int(tokens * self.chars) // 6)
        return " ".join(self.rng.choice(WORDS) for _ in range(words))

    def user(self, at: float, tokens: int, tool_id: str | None = None) -> None:
        line = self._base("user", at)
        if tool_id is None:
            content: Any = self.text(tokens)
        else:
            content = [{"tool_use_id": tool_id, "type": "tool_result", "content": self.text(tokens), "is_error": False}]
        line["message"] = {"role": "user", "content": content}
        self.lines.append(line)

    def assistant(self, at: float, model: str, usage: dict[str, Any], tool: bool) -> str:
        msg_id = f"msg_{self.rng.getrandbits(96):024x}"
        request_id = f"req_{self.rng.getrandbits(96):024x}"
        tool_id = f"toolu_{self.rng.getrandbits(96):024x}"
        blocks: list[dict[str, Any]] = [{"type": "text", "text": self.text(self.rng.randint(10, 120))}]
        if tool:
            blocks.append({"type": "tool_use", "id": tool_id, "name": "Bash", "input": {"command": "make test"}})
        for i, block in enumerate(blocks):  # one line per content block, the same message id and request id
            line = self._base("assistant", at + 0.05 * i)
            out = dict(usage, output_tokens=usage["output_tokens"] if i == len(blocks) - 1 else 1)
            message = {"id": msg_id, "type": "message", "role": "assistant", "model": model, "content": [block]}
            line["message"] = {**message, "stop_reason": None, "usage": out}
            line["requestId"] = request_id
            self.lines.append(line)
        return tool_id

    def system(self, at: float, subtype: str, **extra: Any) -> None:
        line = self._base("system", at)
        line.update(subtype=subtype, content="Conversation compacted", level="info", **extra)
        self.lines.append(line)

    def process(self, at: float, prompt: str) -> None:
        """The lines a new ``claude`` process writes before its first prompt (queue operations)."""
        for op in ("enqueue", "dequeue"):
            stamp = dt.datetime.fromtimestamp(at, dt.UTC).isoformat(timespec="milliseconds").replace("+00:00", "Z")
            self.lines.append(
                {"type": "queue-operation", "operation": op, "timestamp": stamp, "sessionId": self.session}
            )
        self.lines.append({"type": "last-prompt", "lastPrompt": prompt[:40], "sessionId": self.session})

    def flush(self) -> int:
        self.path.parent.mkdir(parents=True, exist_ok=True)
        data = "".join(json.dumps(line, separators=(",", ":")) + "\n" for line in self.lines)
        self.path.write_text(data)
        return len(data)


@dataclass
class Corpus:
    """What :func:`write_corpus` wrote: ``files``, ``bytes``, API ``calls`` (each once), ``sessions`` (subagents
    included) and the summed reported ``usage`` (the truth an audit must reproduce)."""

    files: int = 0
    bytes: int = 0
    calls: int = 0
    sessions: int = 0
    prompt_tokens: int = 0
    cache_read_tokens: int = 0
    cache_write_tokens: int = 0


PROJECTS = ("/home/dev/api", "/home/dev/web", "/home/dev/infra")


def _pause(rng: random.Random) -> float:
    """Seconds between two user turns: mostly short, some past the 5m TTL, a few past the hour."""
    r = rng.random()
    if r < 0.6:
        return rng.uniform(10, 200)
    if r < 0.85:
        return rng.uniform(301, 1_200)
    return rng.uniform(1_800, 10_800)


@dataclass
class _Session:
    """One conversation's cache state while it is generated."""

    model: str
    ttl: float
    static: int
    static_key: str
    history: int = 0
    cached: int = 0
    last: float | None = None
    rebuilt: bool = False  # a new process rebuilt the system prompt: only the tools still match


def _usage(s: _Session, cache: _Cache, now: float, rng: random.Random, out: Corpus) -> dict[str, Any]:
    prompt = s.static + s.history
    own = s.last is not None and now - s.last <= s.ttl and not s.rebuilt and s.cached > 0
    if own:
        read = min(s.cached, prompt)
    elif cache.static_alive(s.static_key, now):
        read = TOOLS_TOKENS if s.rebuilt else s.static
    else:
        read = 0
    uncached = rng.randint(1, 12)
    write = max(0, prompt - read - uncached)
    s.cached, s.last, s.rebuilt = read + write, now, False
    cache.touch(s.static_key, now, s.ttl)
    out.calls += 1
    out.prompt_tokens += read + write + uncached
    out.cache_read_tokens += read
    out.cache_write_tokens += write
    one_hour = write if s.ttl > 300 else 0
    return {
        "input_tokens": uncached,
        "cache_creation_input_tokens": write,
        "cache_read_input_tokens": read,
        "output_tokens": rng.randint(20, 600),
        "service_tier": "standard",
        "cache_creation": {"ephemeral_1h_input_tokens": one_hour, "ephemeral_5m_input_tokens": write - one_hour},
    }


def _calls(w: _Writer, s: _Session, cache: _Cache, t: float, n: int, shape: Shape, out: Corpus) -> float:
    """``n`` API calls of one turn (each but the last calls a tool whose result follows); the time after them."""
    rng = w.rng
    for c in range(n):
        t += rng.uniform(2, 25)
        usage = _usage(s, cache, t, rng, out)
        tool_id = w.assistant(t, s.model, usage, tool=c < n - 1)
        s.history += usage["output_tokens"]
        if c < n - 1:
            t += rng.uniform(0.5, 20)
            size = int(rng.triangular(shape.output_tokens[0], shape.output_tokens[1], shape.output_tokens[0] * 4))
            w.user(t, size, tool_id)
            s.history += size
    return t


def _subagent(root: Path, parent: _Writer, model: str, cache: _Cache, t: float, shape: Shape, out: Corpus) -> None:
    rng = parent.rng
    agent = f"a{rng.getrandbits(64):016x}"
    path = root / parent.session / "subagents" / f"agent-{agent}.jsonl"
    w = _Writer(path, parent.session, parent.cwd, rng, agent, shape.text_per_token)
    s = _Session(model, 300.0, 9_000, f"{model}/subagent")
    prompt = rng.randint(100, 600)
    w.user(t, prompt)
    s.history = prompt
    _calls(w, s, cache, t, rng.randint(3, 9), shape, out)
    out.bytes += w.flush()
    out.files += 1
    out.sessions += 1


def _session(root: Path, shape: Shape, rng: random.Random, cache: _Cache, start: float, out: Corpus) -> None:
    sid = str(uuid.UUID(int=rng.getrandbits(128)))
    cwd = rng.choice(PROJECTS)
    folder = root / cwd.replace("/", "-")
    w = _Writer(folder / f"{sid}.jsonl", sid, cwd, rng, chars=shape.text_per_token)
    model = rng.choice(MODELS)
    s = _Session(model, 3600.0 if rng.random() < shape.one_hour_share else 300.0, TOOLS_TOKENS + SYSTEM_TOKENS, model)
    t = start
    w.process(t, "start")
    for turn in range(rng.randint(*shape.turns)):
        if turn:
            t += _pause(rng)
            if rng.random() < 0.15:  # the user quit and came back with --continue: a new process
                w.process(t, "continue")
                s.rebuilt = True
            if rng.random() < shape.model_switch_share:
                s.model = s.static_key = next(m for m in MODELS if m != s.model)
                s.cached = 0  # a cache is per model: nothing of this conversation is cached for the other one
            elif rng.random() < shape.edit_share:  # the client rewrote its history: only the static prefix matches
                s.cached = min(s.cached, s.static)
        prompt = rng.randint(20, 400)
        w.user(t, prompt)
        s.history += prompt
        if rng.random() < shape.subagent_share:
            _subagent(folder, w, s.model, cache, t + 5, shape, out)
        t = _calls(w, s, cache, t, rng.randint(*shape.calls_per_turn), shape, out)
        if s.static + s.history > shape.compact_at:
            t += 30
            w.system(t, "compact_boundary", compactMetadata={"trigger": "auto", "preTokens": s.static + s.history})
            s.history = rng.randint(3_000, 8_000)
            w.user(t, s.history)
            w.lines[-1]["isCompactSummary"] = True
            s.cached = 0
    out.bytes += w.flush()
    out.files += 1
    out.sessions += 1


def write_corpus(root: Path, shape: Shape | None = None) -> Corpus:
    """Write a synthetic ``projects`` folder under ``root`` (see the module docstring); what was written."""
    shape = shape or Shape()
    rng = random.Random(shape.seed)
    cache = _Cache()
    out = Corpus()
    starts = sorted(shape.start + rng.uniform(0, shape.days * 86_400) for _ in range(shape.sessions))
    for start in starts:
        _session(root, shape, rng, cache, start, out)
    return out


#: The sample bundled with the package (``agentcache audit --sample``): a few days of three developers' sessions.
SAMPLE = Shape(
    sessions=12,
    days=3,
    turns=(3, 9),
    output_tokens=(30, 1_500),
    model_switch_share=0.12,
    edit_share=0.08,
    compact_at=45_000,
    text_per_token=0.05,
    seed=13,
)


if __name__ == "__main__":  # python benchmarks/_claude_corpus.py DIR: write the bundled sample into DIR
    import sys

    target = Path(sys.argv[1])
    __import__("shutil").rmtree(target, ignore_errors=True)
    print(write_corpus(target, SAMPLE))
