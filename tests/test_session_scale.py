"""Sessions at scale: 100 asyncio sessions interleaving turns through one wrapped async SDK client keep separate,
correct state (with retries mixed in), and 10,000 sessions opened and closed keep memory bounded."""

from __future__ import annotations

import asyncio
import gc
import itertools
import random
import tracemalloc
from collections import defaultdict
from collections.abc import Iterator
from typing import Any

import pytest

openai = pytest.importorskip("openai")

from agentcache import Sessions, TurnReport, normalize_usage, wrap  # noqa: E402
from agentcache.model._types import TargetKind  # noqa: E402

from .conftest import openai_tools, policy  # noqa: E402
from .test_session import Clock  # noqa: E402
from .test_wrap_upstream import FakeUpstream, Reply, default_reply, openai_client, shuffled  # noqa: E402

SESSIONS, TURNS = 100, 5


@pytest.fixture
def upstream() -> Iterator[FakeUpstream]:
    up = FakeUpstream()
    yield up
    up.close()


@pytest.fixture
def quiet() -> Iterator[None]:
    yield


def test_100_async_sessions_interleaving_turns_keep_separate_state(upstream: FakeUpstream, quiet: None) -> None:
    rng = random.Random(2026)
    flaky = {f"s{i} question {t}" for i in range(SESSIONS) for t in range(TURNS) if rng.random() < 0.1}
    failed: set[str] = set()
    answered: list[dict[str, Any]] = []

    def fallback(path: str, body: dict[str, Any]) -> Reply:
        last = body["messages"][-1]["content"]
        if last in flaky and last not in failed:
            failed.add(last)
            return Reply(500, {"error": {"message": "transient", "type": "server_error"}})
        answered.append(body)
        return default_reply(path, body)

    upstream.fallback = fallback
    sessions = Sessions(provider="openai")
    sdk = openai_client(upstream, async_=True)  # one SDK client (one connection pool) for every session
    reports: dict[str, list[TurnReport]] = defaultdict(list)
    retries: dict[str, int] = defaultdict(int)

    async def agent(i: int) -> None:
        async with sessions.session(f"s{i}") as session:
            client = wrap(sdk, session=session)
            messages: list[dict[str, Any]] = [{"role": "system", "content": policy()}]
            for t in range(TURNS):
                messages.append({"role": "user", "content": f"s{i} question {t}"})
                body = {"model": "gpt-4o", "messages": list(messages), "tools": shuffled(openai_tools(), i * 100 + t)}
                while True:
                    await asyncio.sleep(rng.random() * 0.005)
                    try:
                        await client.chat.completions.create(**body)
                        break
                    except openai.InternalServerError:
                        retries[session.session_id] += 1
                assert session.last_report is not None
                reports[session.session_id].append(session.last_report)
                messages.append({"role": "assistant", "content": f"s{i} answer {t}"})
            assert (session.turns, session.attempt, session.generation) == (TURNS, 0, 0)

    async def main() -> None:
        await asyncio.gather(*(agent(i) for i in range(SESSIONS)))

    asyncio.run(main())
    assert len(sessions) == 0 and sum(retries.values()) == len(flaky) > 5
    chats = answered
    tags = [b["messages"][-1]["content"].split()[0] for b in chats]
    assert sum(a != b for a, b in itertools.pairwise(tags)) > SESSIONS * 2  # really interleaved
    keys: dict[str, set[str]] = defaultdict(set)
    orders: dict[str, set[tuple[str, ...]]] = defaultdict(set)
    for b in chats:
        tag = b["messages"][-1]["content"].split()[0]
        assert all(tag in str(m["content"]) for m in b["messages"][1:])  # only this session's history
        keys[tag].add(b["prompt_cache_key"])
        orders[tag].add(tuple(t["function"]["name"] for t in b["tools"]))
    assert all(len(k) == 1 for k in keys.values())
    assert all(len(o) == 1 for o in orders.values())  # shuffled every turn by the client, sent in one order
    for sid, rs in reports.items():
        assert [r.session_signal.turn for r in rs] == list(range(TURNS))
        assert all(r.session_signal.session_id == sid for r in rs)
        for prev, cur in itertools.pairwise(rs):
            # Each turn is diagnosed against this session's own previous turn: append-only, all of it shared.
            assert cur.reuse_boundary.matched_blocks == prev.prefix_identity.blocks
            assert cur.reuse_boundary.cause in (None, "tools.reordered")
        assert sum(r.session_signal.attempt for r in rs) == retries[sid]
        totals = sessions.totals(sid)
        assert totals is not None and totals.requests == TURNS and totals.cache_read_tokens == TURNS * 1152
    # A session opened later adopts the tool order the scope saw first (shared ScopeMemory).
    names = frozenset(t["function"]["name"] for t in openai_tools())
    first_seen = list(sessions.scope("anonymous", TargetKind.OPENAI).tools[names].order)
    late = sessions.session("late")
    body = {"model": "gpt-4o", "messages": [{"role": "user", "content": "late"}], "tools": shuffled(openai_tools(), 9)}
    assert [t["function"]["name"] for t in late.begin("openai.chat", body).body["tools"]] == first_seen


def test_10000_sessions_opened_and_closed_keep_memory_bounded(quiet: None) -> None:
    clock = Clock()
    sessions = Sessions(provider="openai", clock=clock, max_tombstones=1000, max_lineages=1000)
    body = {
        "model": "gpt-4o",
        "messages": [{"role": "system", "content": "You are a support agent."}, {"role": "user", "content": "hi"}],
    }
    usage = normalize_usage({"usage": {"prompt_tokens": 300, "prompt_tokens_details": {"cached_tokens": 256}}})

    def cycle(n: int) -> None:
        for _ in range(n):
            clock.t += 1.0
            with sessions.session() as session:
                session.begin("openai.chat", body).succeed(usage)
                session.fork("sub").close()

    cycle(2_000)  # fills the tombstone and lineage LRUs to their bounds
    gc.collect()
    tracemalloc.start()
    try:
        # Until every LRU entry was allocated while tracing, traced memory grows as traced entries replace
        # untraced ones: 1,500 sessions replace all 1,000 lineage totals and 1,000 tombstones (2 per cycle).
        cycle(1_500)
        gc.collect()
        base, _ = tracemalloc.get_traced_memory()
        cycle(6_500)
        gc.collect()
        current, _ = tracemalloc.get_traced_memory()
    finally:
        tracemalloc.stop()
    assert len(sessions) == 0
    assert len(sessions.store._tombs) == 1000 and len(sessions._lineages) == 1000
    growth = current - base
    # 6,500 sessions and 6,500 subagents: a leak of even 10 bytes per session would show.
    assert growth < 64_000, f"memory grew by {growth:,} bytes over 6,500 sessions (+6,500 subagents)"
