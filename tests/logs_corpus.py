"""Agents' log calls (:class:`~agentcache.loaders.UsageRecord`) generated in memory for tests of the audit-of-logs
report: sessions over several days and projects with the usage an Anthropic prompt cache reports (reads of what the
session cached when the pause is within its TTL, rewrites after longer pauses, compactions, new processes, model
switches) and subagents linked to their parent. Seeded, so every run builds the same calls."""

from __future__ import annotations

import random
from dataclasses import dataclass

from agentcache.loaders import UsageRecord
from agentcache.model._usage import CacheUsage, normalize_usage

T0 = 1_796_000_000.0  # 2026-11-29 UTC
STATIC = 20_000  # tools + system prompt: what a fresh session of the same model reads
PROJECTS = ("/home/dev/api", "/home/dev/web", "/home/dev/infra", "/home/dev/ml")
MODELS = ("claude-opus-4-8", "claude-sonnet-4-6")


def usage(read: int, w5: int = 0, w1: int = 0, uncached: int = 0) -> CacheUsage:
    """Anthropic usage as a Claude Code transcript keeps it, normalised by the core's parser."""
    raw = {
        "input_tokens": uncached,
        "cache_read_input_tokens": read,
        "cache_creation_input_tokens": w5 + w1,
        "cache_creation": {"ephemeral_5m_input_tokens": w5, "ephemeral_1h_input_tokens": w1},
        "output_tokens": 200,
    }
    out = normalize_usage(raw, "anthropic.messages")
    assert out is not None
    return out


@dataclass
class _Session:
    """One session being generated: its name, model, project, TTL (seconds) and what it has cached."""

    name: str
    model: str
    project: str
    ttl: float
    cached: int = 0
    at: float = 0.0


def _call(s: _Session, i: int, read: int, write: int, events: tuple[str, ...], **kw: object) -> UsageRecord:
    one_hour = s.ttl > 300
    u = usage(read, 0 if one_hour else write, write if one_hour else 0, uncached=3)
    return UsageRecord(
        s.name, "claude-code", "anthropic.messages", u, s.model, s.at, f"{s.name}-{i}", project=s.project,
        events=events, **kw,  # type: ignore[arg-type]
    )  # fmt: skip


def _pause(rng: random.Random) -> float:
    """Seconds between two calls: mostly tool loops, sometimes a person thinking past 5 minutes, rarely an hour."""
    r = rng.random()
    if r < 0.80:
        return rng.uniform(3, 90)
    if r < 0.97:
        return rng.uniform(360, 1500)
    return rng.uniform(3700, 9000)


def _session(rng: random.Random, name: str, start: float, calls: int) -> list[UsageRecord]:
    model = MODELS[0] if rng.random() < 0.75 else MODELS[1]
    s = _Session(name, model, rng.choice(PROJECTS), 3600.0 if rng.random() < 0.2 else 300.0, at=start)
    out: list[UsageRecord] = []
    for i in range(calls):
        events: tuple[str, ...] = ()
        prompt = max(s.cached, STATIC) + rng.randint(400, 5_000)
        if i == 0:
            read = STATIC
        elif rng.random() < 0.03:
            s.model = MODELS[1] if s.model == MODELS[0] else MODELS[0]
            read = 0  # the other model's cache holds none of this session
        elif rng.random() < 0.04 and s.cached > 60_000:
            events, prompt, read = ("compacted",), STATIC + 8_000, STATIC
        elif rng.random() < 0.02:
            events, read = ("resumed",), 14_000  # a new process rebuilt the system prompt: only the tools read
        elif out and s.at - (out[-1].at or 0.0) > s.ttl:
            read = STATIC  # the session's own entry expired; other sessions keep the static prefix alive
        else:
            read = s.cached
        out.append(_call(s, i, read, prompt - read, events))
        s.cached = prompt
        for k in range(2 if i == 1 and rng.random() < 0.3 else 0):
            out += _subagent(rng, s, k)
        s.at += _pause(rng)
    return out


def _subagent(rng: random.Random, parent: _Session, k: int) -> list[UsageRecord]:
    s = _Session(f"{parent.name}/agent-{k}", parent.model, parent.project, 300.0, at=parent.at + 2)
    out = []
    for i in range(rng.randint(3, 8)):
        prompt = (s.cached or 9_000) + rng.randint(300, 3_000)
        read = 0 if i == 0 else s.cached
        out.append(_call(s, i, read, prompt - read, (), parent=parent.name, kind="subagent"))
        s.cached, s.at = prompt, s.at + rng.uniform(2, 30)
    return out


def corpus(sessions: int = 40, days: int = 6, calls: tuple[int, int] = (4, 30), seed: int = 3) -> list[UsageRecord]:
    """``sessions`` main sessions (with their subagents) started over ``days`` UTC days, each with a number of
    calls drawn from ``calls``."""
    rng = random.Random(seed)
    out: list[UsageRecord] = []
    for n in range(sessions):
        start = T0 + rng.uniform(0, days * 86_400)
        out += _session(rng, f"s{n:05d}", start, rng.randint(*calls))
    return out
