"""A :class:`~agentcache.session.Turn` owns its state: prepared → sent → committed/failed → finished. A repeated
step is harmless, a step out of order raises :class:`~agentcache.session.TurnStateError` naming it; the async
commit is the same implementation as the sync one."""

from __future__ import annotations

import asyncio

import pytest

from agentcache import Sessions
from agentcache.session import TurnState, TurnStateError

from .test_session import API, USAGE, body


def test_a_turn_walks_prepared_sent_committed_finished() -> None:
    s = Sessions(provider="anthropic").session("walk")
    t = s.begin(API, body(1))
    assert (t.state, t.committed, t.done) == (TurnState.PREPARED, None, False)
    t.mark_sent()
    t.mark_sent()  # a repeat
    assert t.state == TurnState.SENT
    assert t.commit() is True and t.state == TurnState.COMMITTED and not t.done
    assert t.commit() is True  # a repeat answers as the first commit did
    report = t.finish(USAGE)
    assert report is not None and report.usage == USAGE
    assert (t.state, t.committed, t.done, s.turns) == (TurnState.FINISHED, True, True, 1)
    assert t.finish(USAGE) is None  # finished once: the second report is not emitted
    assert s.totals.output_tokens == USAGE.output_tokens  # counted once


def test_commit_after_fail_is_refused() -> None:
    s = Sessions(provider="anthropic").session("failed")
    t = s.begin(API, body(1))
    t.fail("http_503")
    assert (t.state, s.attempt) == (TurnState.FAILED, 1)
    t.fail("http_503")  # a repeat: still one retry
    assert s.attempt == 1
    with pytest.raises(TurnStateError, match=r"cannot commit turn \d+ of session failed: it is failed"):
        t.commit()
    with pytest.raises(TurnStateError, match="cannot commit"):
        asyncio.run(t.acommit())
    assert s.turns == 0 and s.pipeline.sent is None  # nothing recorded
    assert t.finish(USAGE) is None and t.state == TurnState.FINISHED


def test_fail_after_commit_and_finish_before_either_are_refused() -> None:
    s = Sessions(provider="anthropic").session("order")
    early = s.begin(API, body(1))
    with pytest.raises(TurnStateError, match=r"cannot finish .* it is prepared"):
        early.finish(USAGE)
    assert early.commit()
    with pytest.raises(TurnStateError, match=r"cannot fail .* it is committed"):
        early.fail(TimeoutError())
    with pytest.raises(TurnStateError, match="cannot replace the body of"):
        early.send_original(body(1))
    with pytest.raises(TurnStateError, match="cannot send"):
        early.mark_sent()
    assert s.attempt == 0 and early.state == TurnState.COMMITTED


def test_a_stale_commit_finishes_the_turn_and_a_late_failure_is_ignored() -> None:
    s = Sessions(provider="anthropic").session("stale")
    s.begin(API, body(1)).succeed(USAGE)
    late = s.begin(API, body(2))
    s.restart()
    assert late.commit() is False
    assert (late.state, late.committed, late.done) == (TurnState.FINISHED, False, True)
    late.fail("http_500")  # the turn was refused: nothing more changes the session
    assert s.attempt == 0 and late.finish(USAGE) is None


def test_async_commit_is_the_sync_one() -> None:
    sessions = Sessions(provider="anthropic")
    a, b = sessions.session("a"), sessions.session("b")
    ta, tb = a.begin(API, body(2)), b.begin(API, body(2))
    assert ta.commit() is True
    assert asyncio.run(tb.acommit()) is True
    assert (ta.state, tb.state) == (TurnState.COMMITTED, TurnState.COMMITTED)
    assert a.pipeline.sent == b.pipeline.sent and a.turns == b.turns == 1
