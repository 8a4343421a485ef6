"""Faults between a wrapped SDK client and its upstream: 5xx, timeouts and streams cut mid-way.

The fake upstream (:class:`tests.test_wrap_upstream.FakeUpstream`, real sockets on loopback) fails on cue. For each
fault the wrapped client must raise exactly what the unwrapped SDK raises, record a retry (``attempt`` + 1 in
the same generation) and commit nothing, so the next successful turn is diagnosed against the last request
that succeeded.
"""

from __future__ import annotations

import asyncio
import json
from collections.abc import Callable, Iterator
from typing import Any

import pytest

anthropic = pytest.importorskip("anthropic")
openai = pytest.importorskip("openai")

from agentcache import Sessions, wrap  # noqa: E402

from .test_wrap_upstream import (  # noqa: E402
    FakeUpstream,
    Reply,
    a_body,
    anthropic_client,
    anthropic_events,
    chat_events,
    default_reply,
    o_body,
    openai_client,
)


@pytest.fixture
def upstream() -> Iterator[FakeUpstream]:
    up = FakeUpstream()
    yield up
    up.close()


SERVER_ERROR = Reply(500, {"type": "error", "error": {"type": "api_error", "message": "upstream broke"}})
OVERLOADED = Reply(529, {"type": "error", "error": {"type": "overloaded_error", "message": "busy"}})


def slow(seconds: float) -> Callable[[str, dict[str, Any]], Reply]:
    def reply(path: str, body: dict[str, Any]) -> Reply:
        return Reply(body=default_reply(path, body).body, events=default_reply(path, body).events, delay=seconds)

    return reply


def cut_anthropic(path: str, body: dict[str, Any]) -> Reply:
    return Reply(events=anthropic_events(), cut_after=3)


def cut_chat(path: str, body: dict[str, Any]) -> Reply:
    return Reply(events=chat_events(True), cut_after=1)


def const(reply: Reply) -> Callable[[str, dict[str, Any]], Reply]:
    return lambda path, body: reply


def raised(fn: Callable[[], Any]) -> BaseException:
    with pytest.raises(Exception) as caught:
        fn()
    return caught.value


def test_anthropic_faults_surface_sdk_exceptions_and_count_attempts(upstream: FakeUpstream) -> None:
    plain = anthropic_client(upstream, timeout=0.5)
    sessions = Sessions(provider="anthropic")
    session = sessions.session("faulty")
    client = wrap(anthropic_client(upstream, timeout=0.5), session=session)
    client.messages.create(**a_body(1))
    first = session.last_report
    assert first is not None
    committed = session.pipeline.sent

    def consume(c: Any) -> None:
        for _ in c.messages.create(**a_body(2), stream=True):
            pass

    faults: list[tuple[Callable[[str, dict[str, Any]], Reply], Callable[[Any], Any]]] = [
        (const(SERVER_ERROR), lambda c: c.messages.create(**a_body(2))),
        (const(OVERLOADED), lambda c: c.messages.create(**a_body(2))),
        (slow(2.0), lambda c: c.messages.create(**a_body(2))),
    ]
    for attempt, (fault, call) in enumerate(faults, start=1):
        upstream.script.append(fault)
        expected = raised(lambda call=call: call(plain))  # type: ignore[misc]
        upstream.script.append(fault)
        got = raised(lambda call=call: call(client))  # type: ignore[misc]
        assert type(got) is type(expected), (got, expected)
        assert str(got) == str(expected)
        assert isinstance(got, anthropic.APIError | anthropic.APIConnectionError) or "peer closed" in str(got)
        assert (session.generation, session.attempt, session.turns) == (0, attempt, 1)
        assert session.pipeline.sent is committed  # nothing committed
        assert session.last_report is first
    # A stream cut after the upstream accepted the request: committed (the prompt was processed and cached, as
    # the proxy counts it), and a retry is counted because the client will send the turn again.
    upstream.script.append(cut_anthropic)
    expected = raised(lambda: consume(plain))
    upstream.script.append(cut_anthropic)
    got = raised(lambda: consume(client))
    assert type(got) is type(expected) and str(got) == str(expected)
    cut = session.last_report
    assert cut is not None and cut is not first and cut.session_signal.attempt == len(faults)
    assert (session.generation, session.attempt, session.turns) == (0, 1, 2)
    assert cut.reuse_boundary.cause is None and cut.reuse_boundary.matched_blocks == first.prefix_identity.blocks
    client.messages.create(**a_body(2))  # the default reply: succeeds
    report = session.last_report
    assert report is not None and report is not cut
    assert report.session_signal.attempt == 1 and session.attempt == 0 and session.turns == 3
    # Diagnosed against the cut turn, the last committed request: the same request, all of it reusable.
    assert report.reuse_boundary.cause is None
    assert report.reuse_boundary.matched_blocks == cut.prefix_identity.blocks


def test_stream_helper_faults(upstream: FakeUpstream) -> None:
    session = Sessions(provider="anthropic").session()
    client = wrap(anthropic_client(upstream), session=session)
    upstream.script.append(const(SERVER_ERROR))
    with pytest.raises(anthropic.InternalServerError), client.messages.stream(**a_body(1)):
        pass
    assert session.attempt == 1
    upstream.script.append(cut_anthropic)
    with pytest.raises(Exception) as caught, client.messages.stream(**a_body(1)) as stream:
        "".join(stream.text_stream)
    assert not isinstance(caught.value, AssertionError)
    assert (session.attempt, session.turns) == (1, 1)  # committed when the stream opened; the cut is a retry
    with client.messages.stream(**a_body(1)) as stream:
        stream.until_done()
    assert (session.attempt, session.turns) == (0, 2)


def test_openai_faults_sync_and_async(upstream: FakeUpstream) -> None:
    plain = openai_client(upstream, timeout=0.5)
    session = Sessions(provider="openai").session()
    client = wrap(openai_client(upstream, timeout=0.5), session=session)
    client.chat.completions.create(**o_body(1))
    key = upstream.seen[-1].body["prompt_cache_key"]

    def stream(c: Any) -> None:
        for _ in c.chat.completions.create(**o_body(2), stream=True, stream_options={"include_usage": True}):
            pass

    for fault, call in [
        (const(Reply(503, {"error": {"message": "unavailable", "type": "server_error"}})), stream),
        (slow(2.0), lambda c: c.chat.completions.create(**o_body(2))),
        (cut_chat, stream),
    ]:
        upstream.script.append(fault)
        expected = raised(lambda call=call: call(plain))  # type: ignore[misc]
        upstream.script.append(fault)
        got = raised(lambda call=call: call(client))  # type: ignore[misc]
        assert type(got) is type(expected) and str(got) == str(expected)
    assert (session.attempt, session.turns) == (1, 2)  # two failures before an answer, then a committed cut
    stream(client)
    assert (session.attempt, session.turns) == (0, 3)
    assert upstream.seen[-1].body["prompt_cache_key"] == key  # the routing key survives the retries

    async def main() -> None:
        asession = Sessions(provider="openai").session()
        aclient = wrap(openai_client(upstream, async_=True, timeout=0.5), session=asession)
        upstream.script.append(const(Reply(502, {"error": {"message": "bad gateway"}})))
        with pytest.raises(openai.InternalServerError):
            await aclient.chat.completions.create(**o_body(1))
        upstream.script.append(cut_chat)
        s = await aclient.chat.completions.create(**o_body(1), stream=True, stream_options={"include_usage": True})
        with pytest.raises(Exception) as caught:
            async for _ in s:
                pass
        assert not isinstance(caught.value, AssertionError)
        assert (asession.attempt, asession.turns) == (1, 1)
        await aclient.chat.completions.create(**o_body(1))
        assert (asession.attempt, asession.turns, asession.generation) == (0, 2, 0)

    asyncio.run(main())


def test_a_failed_try_leaves_the_plan_of_its_retry_unchanged(upstream: FakeUpstream) -> None:
    """prepare() learns client habits (edit points); a failed try must not make its retry plan differently."""

    def edited(turns: int) -> dict[str, Any]:
        body = a_body(turns)
        body["messages"][0] = {"role": "user", "content": f"question 0, edited for turn {turns}"}
        return body

    def run(fail_at: set[int]) -> tuple[list[str], Any]:
        session = Sessions(provider="anthropic").session()
        client = wrap(anthropic_client(upstream), session=session)
        sent: list[str] = []
        for turn in range(1, 6):
            if turn in fail_at:
                upstream.script.append(const(SERVER_ERROR))
                with pytest.raises(anthropic.InternalServerError):
                    client.messages.create(**edited(turn))
            client.messages.create(**edited(turn))
            sent.append(json.dumps(upstream.seen[-1].body))
        return sent, session.pipeline.state.learned

    clean = run(set())
    faulty = run({2, 3, 4})
    assert faulty == clean
