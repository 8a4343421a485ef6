"""One pass per request: on every turn the pipeline canonicalizes the client's body once, applies one wire plan
at most once, and never reads the sent body again: where writing a marker turned a string into a text block, the
block is rebuilt from the one it replaces, and what is assembled equals what reading the sent body would give.
Counted on real traffic (tau-bench with tools reshuffled per turn, SWE-agent's rewritten history, a
Claude-Code-shaped conversation) under Anthropic rules, OpenAI rules and a local engine."""

from __future__ import annotations

import copy
from collections.abc import Iterator
from typing import Any

import pytest

from agentcache.adapters import canonicalize
from agentcache.loaders import Record, load
from agentcache.replay import convert
from agentcache.session import SessionPipeline
from agentcache.session import _pipeline as pipeline_module

from .conftest import DATA
from .test_parity import claude_code_records, tau_records


class Counter:
    def __init__(self) -> None:
        self.client = self.reread = self.apply = 0
        self.body: Any = None


@pytest.fixture
def counted(monkeypatch: pytest.MonkeyPatch) -> Iterator[Counter]:
    c = Counter()
    real_canon, real_apply = pipeline_module.canonicalize, pipeline_module.apply

    def canonicalize(api: Any, body: Any, **kw: Any) -> Any:
        if body is c.body:
            c.client += 1
        else:
            c.reread += 1
        return real_canon(api, body, **kw)

    def apply(api: Any, body: Any, plan: Any) -> Any:
        c.apply += 1
        return real_apply(api, body, plan)

    monkeypatch.setattr(pipeline_module, "canonicalize", canonicalize)
    monkeypatch.setattr(pipeline_module, "apply", apply)
    yield c


def string_records() -> list[Record]:
    """tau-bench as Anthropic Messages whose text-only messages are plain strings (the tail marker reshapes one
    every turn; older ones go back as the strings the client sends)."""
    out = []
    for r in tau_records("anthropic.messages"):
        body = copy.deepcopy(r.body)
        for m in body["messages"]:
            c = m["content"]
            if isinstance(c, list) and len(c) == 1 and c[0].get("type") == "text":
                m["content"] = c[0]["text"]
        out.append(Record(r.session, r.api, body))
    return out


def swe_agent_records() -> list[Record]:
    recs = load(DATA / "swe-agent" / "marshmallow-code__marshmallow-1867.function_calling.traj").records
    out = []
    for r in recs:
        body = convert(r.api, r.body, "anthropic.messages")
        body.setdefault("max_tokens", 64)
        out.append(Record(r.session, "anthropic.messages", body))
    return out


@pytest.mark.parametrize(
    ("target", "records", "repairs", "reshapes"),
    [
        ("anthropic", tau_records("anthropic.messages"), True, True),  # a string system prompt gets a marker
        ("anthropic", string_records(), True, True),
        ("anthropic", swe_agent_records(), False, False),  # real rewrites of history: nothing to repair
        ("anthropic", claude_code_records(), True, False),
        ("openai", tau_records("openai.chat"), True, False),
        ("engine", tau_records("openai.chat"), True, False),
    ],
    ids=["anthropic-tau", "anthropic-strings", "anthropic-swe", "anthropic-claude-code", "openai-tau", "engine-tau"],
)
def test_one_canonicalize_at_most_one_reread_one_apply(
    counted: Counter, target: str, records: list[Record], repairs: bool, reshapes: bool
) -> None:
    pipes: dict[str, SessionPipeline] = {}
    reshaped = repaired = 0
    for r in records:
        pipe = pipes.setdefault(r.session, SessionPipeline(target, session=r.session))
        body = copy.deepcopy(r.body)
        counted.body = body
        counted.client = counted.reread = counted.apply = 0
        prep = pipe.prepare(r.api, body, now=1.0)
        assert counted.client == 1, "the client's body is canonicalized exactly once"
        assert counted.reread == 0, "the sent body is never read again"
        assert counted.apply == (0 if prep.body is body else 1), "one wire plan, applied once"
        reshaped += prep.plan.reshapes
        repaired += bool(prep.repairs)
        read = canonicalize(r.api, prep.body)  # what the upstream gets, read from scratch
        assert read.chain == prep.planned.chain and read.cum_tokens == prep.planned.cum_tokens
        assert [(b.path, b.marker and b.marker.ttl) for b in read.blocks] == [
            (b.path, b.marker and b.marker.ttl) for b in prep.planned.blocks
        ]
        assert (read.msg_start, read.marked, read.digests) == (
            prep.planned.msg_start,
            prep.planned.marked,
            prep.planned.digests,
        )
        pipe.commit(prep)
    assert (repaired > 0) == repairs  # the traffic did (or did not) need repairs
    assert (reshaped > 0) == reshapes  # where markers went on strings, their blocks were rebuilt without a re-read
