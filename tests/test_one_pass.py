"""One pass per request: on every turn the pipeline canonicalizes the client's body once, applies one wire plan
at most once, and reads the sent body again at most once, only when writing a marker turned a string into a text
block. Counted on real traffic (tau-bench with tools reshuffled per turn, SWE-agent's rewritten history, a
Claude-Code-shaped conversation) under Anthropic rules, OpenAI rules and a local engine."""

from __future__ import annotations

import copy
from collections.abc import Iterator
from typing import Any

import pytest

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


def swe_agent_records() -> list[Record]:
    recs = load(DATA / "swe-agent" / "marshmallow-code__marshmallow-1867.function_calling.traj").records
    out = []
    for r in recs:
        body = convert(r.api, r.body, "anthropic.messages")
        body.setdefault("max_tokens", 64)
        out.append(Record(r.session, "anthropic.messages", body))
    return out


@pytest.mark.parametrize(
    ("target", "records", "repairs"),
    [
        ("anthropic", tau_records("anthropic.messages"), True),
        ("anthropic", swe_agent_records(), False),  # real rewrites of history: nothing to repair, much to learn
        ("anthropic", claude_code_records(), True),
        ("openai", tau_records("openai.chat"), True),
        ("engine", tau_records("openai.chat"), True),
    ],
    ids=["anthropic-tau", "anthropic-swe", "anthropic-claude-code", "openai-tau", "engine-tau"],
)
def test_one_canonicalize_at_most_one_reread_one_apply(
    counted: Counter, target: str, records: list[Record], repairs: bool
) -> None:
    pipes: dict[str, SessionPipeline] = {}
    rereads = repaired = 0
    for r in records:
        pipe = pipes.setdefault(r.session, SessionPipeline(target, session=r.session))
        body = copy.deepcopy(r.body)
        counted.body = body
        counted.client = counted.reread = counted.apply = 0
        prep = pipe.prepare(r.api, body, now=1.0)
        assert counted.client == 1, "the client's body is canonicalized exactly once"
        assert counted.reread == (1 if prep.plan.reshapes else 0), "the sent body is read again only when reshaped"
        assert counted.apply == (0 if prep.body is body else 1), "one wire plan, applied once"
        rereads += counted.reread
        repaired += bool(prep.repairs)
        pipe.commit(prep)
    assert (repaired > 0) == repairs  # the traffic did (or did not) need repairs
    if target == "anthropic":
        assert rereads < len(records)  # string reshaping happens, but not on every turn of every conversation
