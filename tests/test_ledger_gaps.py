"""A ledger that did not see some of a session's requests (another proxy worker or replica served them, or it had
dropped the session) simulates the next one as the cache upstream holds it: the request before is written into its
simulated caches, uncounted, so the turn is not simulated as a session start again (the per-worker live report
of ``agentcache proxy --workers N`` had counted one per worker)."""

from __future__ import annotations

from typing import Any

from agentcache.analysis._ledger import Ledger
from agentcache.model._usage import CacheUsage
from agentcache.session import Identity, Sessions


def _body(n: int) -> dict[str, Any]:
    messages = [
        {"role": "user" if k % 2 == 0 else "assistant", "content": f"step {k}: " + "details of the task " * 40}
        for k in range(n)
    ]
    return {"model": "claude-sonnet-4-5", "max_tokens": 64, "system": "You are a careful agent. " * 60,
            "messages": messages}  # fmt: skip


def test_a_ledger_that_missed_requests_simulates_the_next_as_the_whole_one_does() -> None:
    sessions = Sessions(provider="anthropic")
    usage = CacheUsage(prompt_tokens=10, cache_read_tokens=0, cache_write_tokens=10, uncached_tokens=0,
                       source="anthropic")  # fmt: skip
    turns = []
    for i, n in enumerate(range(1, 14, 2)):
        turn = sessions.begin("anthropic.messages", _body(n), identity=Identity(session="s1"), now=1000.0 + 20 * i)
        turn.succeed(usage)
        turns.append(turn)
    target = turns[0].session.target
    whole, part, other = Ledger(target), Ledger(target), Ledger(target)
    want = [whole.record("s1", i, t.prepared).results for i, t in enumerate(turns)]
    seen = {i: part.record("s1", i, turns[i].prepared).results for i in (0, 3, 4, 6)}
    for i in (1, 2, 5):
        other.record("s1", i, turns[i].prepared)
    for i in (3, 4, 6):
        for arm in ("as_sent", "agentcache"):
            assert seen[i][arm].usage == want[i][arm].usage, (i, arm)
        assert seen[i]["agentcache"].usage.cache_read_tokens > 0  # the client marks nothing: as_sent reads none
    assert part.sessions["s1"].requests == 4  # the request primed from is not counted
    assert part.totals["agentcache"].requests == 4
    assert part.totals["agentcache"].cache_write_tokens < whole.totals["agentcache"].cache_write_tokens
