"""``agentcache.wrap`` around the real, unmodified ``anthropic`` and ``openai`` SDKs talking HTTP to a fake
upstream on loopback (:class:`tests.test_wrap_upstream.FakeUpstream`): the SDK's own response
types come back, repairs reach the wire, usage and turn reports are recorded, and everything the wrapper
does not understand passes through unchanged.
"""

from __future__ import annotations

import asyncio
import json
from collections.abc import Iterator
from typing import Any

import pytest

anthropic = pytest.importorskip("anthropic")
openai = pytest.importorskip("openai")

import agentcache  # noqa: E402
from agentcache import Sessions, wrap  # noqa: E402
from agentcache._wrap import WrappedClient  # noqa: E402

from .conftest import anthropic_tools, policy  # noqa: E402
from .test_wrap_upstream import (  # noqa: E402
    FakeUpstream,
    a_body,
    anthropic_client,
    o_body,
    openai_client,
    shuffled,
)


@pytest.fixture
def upstream() -> Iterator[FakeUpstream]:
    up = FakeUpstream()
    yield up
    up.close()


# ---- tests --------------------------------------------------------------------------------------------------


def test_anthropic_create_returns_sdk_type_and_records_the_turn(upstream: FakeUpstream) -> None:
    sessions = Sessions(provider="anthropic")
    with sessions.session("a1") as session:
        client = wrap(anthropic_client(upstream), session=session)
        first = client.messages.create(**a_body(1))
        assert type(first) is anthropic.types.Message
        report = session.last_report
        assert report is not None and report.usage is not None
        assert (report.usage.cache_read_tokens, report.usage.cache_write_tokens, report.usage.uncached_tokens) == (
            1200,
            50,
            7,
        )
        assert report.cost_usd == pytest.approx((7 + 1200 * 0.1 + 50 * 1.25) * 3.0 / 1e6)
        assert report.storage_tier.kind == "provider" and report.storage_tier.ttl in ("5m", "1h")
        assert report.markers, "agentcache placed cache_control markers"
        first_tokens = report.prefix_identity.tokens
        sent = upstream.seen[-1].body
        assert any("cache_control" in t for t in sent["tools"]) or isinstance(sent["system"], list)
        # Turn two: tools shuffled by the client, repaired on the wire to the first-seen order.
        body = a_body(2, shuffled(anthropic_tools(), 1))
        client.messages.create(**body)
        names = [t["name"] for t in upstream.seen[-1].body["tools"]]
        assert names == [t["name"] for t in anthropic_tools()]
        report = session.last_report
        assert report is not None
        assert "tools.reordered" in report.repairs
        assert report.reuse_boundary.cause == "tools.reordered"
        assert report.reuse_boundary.matched_tokens == first_tokens  # all of turn one, after the repair
        assert report.session_signal.turn == 1 and session.turns == 2
    assert sessions.totals("a1") is not None and sessions.totals("a1").requests == 2  # type: ignore[union-attr]


def test_pydantic_content_and_not_given_reach_the_wire_as_the_sdk_sends_them(upstream: FakeUpstream) -> None:
    session = Sessions(provider="anthropic").session()
    client = wrap(anthropic_client(upstream), session=session)
    reply = client.messages.create(**a_body(1))
    body = a_body(1)
    body["messages"] += [{"role": "assistant", "content": reply.content}, {"role": "user", "content": "more"}]
    omit = getattr(anthropic, "omit", anthropic.NOT_GIVEN)  # `omit` is newer than NOT_GIVEN
    client.messages.create(**body, stop_sequences=anthropic.NOT_GIVEN, metadata=omit)
    sent = upstream.seen[-1].body
    assert sent["messages"][1]["content"][0]["text"] == "Hello."
    assert "stop_sequences" not in sent and "metadata" not in sent
    assert session.last_report is not None and session.last_report.reuse_boundary.cause is None


def test_sdk_only_arguments_pass_through(upstream: FakeUpstream) -> None:
    session = Sessions(provider="openai").session()
    client = wrap(openai_client(upstream), session=session)
    client.chat.completions.create(
        **o_body(1), extra_headers={"X-Trace": "t1"}, extra_body={"custom_field": 7}, timeout=30.0
    )
    seen = upstream.seen[-1]
    assert seen.headers["x-trace"] == "t1"
    assert seen.body["custom_field"] == 7
    assert seen.body["prompt_cache_key"].startswith("ac-")


def test_openai_chat_stream_is_the_sdk_stream_and_usage_is_read_as_it_passes(upstream: FakeUpstream) -> None:
    session = Sessions(provider="openai").session()
    client = wrap(openai_client(upstream), session=session)
    stream = client.chat.completions.create(**o_body(1), stream=True, stream_options={"include_usage": True})
    assert type(stream) is openai.Stream
    assert session.last_report is None  # nothing committed before the stream ends
    text = "".join(c.choices[0].delta.content or "" for c in stream if c.choices)
    assert text == "Hello."
    report = session.last_report
    assert report is not None and report.usage is not None
    assert report.usage.cache_read_tokens == 1152 and report.usage.prompt_tokens == 1300
    assert report.cost_usd == pytest.approx((148 * 2.5 + 1152 * 1.25) / 1e6)


def test_responses_create_and_stream(upstream: FakeUpstream) -> None:
    session = Sessions(provider="openai").session()
    client = wrap(openai_client(upstream), session=session)
    body = {"model": "gpt-4o", "instructions": policy(), "input": [{"role": "user", "content": "hi"}]}
    reply = client.responses.create(**body)
    assert type(reply) is openai.types.responses.Response
    assert session.last_report is not None and session.last_report.usage is not None
    assert session.last_report.usage.cache_read_tokens == 1024
    stream = client.responses.create(**body, stream=True)
    kinds = [e.type for e in stream]
    assert kinds[-1] == "response.completed"
    assert session.turns == 2 and session.last_report.usage is not None
    assert session.last_report.usage.source == "openai.responses"


def test_anthropic_stream_helper_and_create_stream(upstream: FakeUpstream) -> None:
    session = Sessions(provider="anthropic").session()
    client = wrap(anthropic_client(upstream), session=session)
    with client.messages.stream(**a_body(1)) as stream:
        assert type(stream).__name__ == "MessageStream"
        assert "".join(stream.text_stream) == "Hello."
        final = stream.get_final_message()
    assert final.usage.cache_read_input_tokens == 1200
    report = session.last_report
    assert report is not None and report.usage is not None and report.usage.cache_read_tokens == 1200
    assert report.usage.output_tokens == 3  # message_delta's cumulative usage merged in
    raw = client.messages.create(**a_body(2), stream=True)
    assert type(raw) is anthropic.Stream
    kinds = [e.type for e in raw]
    assert kinds[0] == "message_start" and kinds[-1] == "message_stop"
    assert session.turns == 2


def test_early_close_of_a_stream_commits_with_the_usage_seen(upstream: FakeUpstream) -> None:
    session = Sessions(provider="anthropic").session()
    client = wrap(anthropic_client(upstream), session=session)
    stream = client.messages.create(**a_body(1), stream=True)
    for event in stream:
        if event.type == "message_start":
            break
    stream.close()
    del stream, event
    import gc

    gc.collect()
    assert session.turns == 1
    assert session.last_report is not None and session.last_report.usage is not None
    assert session.last_report.usage.cache_read_tokens == 1200


def test_async_clients(upstream: FakeUpstream) -> None:
    async def main() -> None:
        sessions = Sessions(provider="anthropic")
        a = wrap(anthropic_client(upstream, async_=True), sessions=sessions)
        msg = await a.messages.create(**a_body(1))
        assert type(msg) is anthropic.types.Message
        async with a.messages.stream(**a_body(2)) as stream:
            assert type(stream).__name__ == "AsyncMessageStream"
            async for _ in stream:
                pass
        raw = await a.messages.create(**a_body(3), stream=True)
        assert type(raw) is anthropic.AsyncStream
        async for _ in raw:
            pass
        session = a.agentcache_session  # type: ignore[attr-defined]
        assert session.turns == 3 and session.last_report is not None and session.last_report.usage is not None
        o = wrap(openai_client(upstream, async_=True), sessions=Sessions(provider="openai"))
        chat = await o.chat.completions.create(**o_body(1))
        assert type(chat) is openai.types.chat.ChatCompletion
        s2 = await o.chat.completions.create(**o_body(2), stream=True, stream_options={"include_usage": True})
        assert type(s2) is openai.AsyncStream
        async for _ in s2:
            pass
        r = await o.responses.create(model="gpt-4o", input="hi")
        assert type(r) is openai.types.responses.Response
        osess = o.agentcache_session  # type: ignore[attr-defined]
        assert osess.turns == 3 and osess.last_report.usage.cache_read_tokens == 1024

    asyncio.run(main())


def test_passthrough_of_what_the_wrapper_does_not_understand(upstream: FakeUpstream) -> None:
    session = Sessions(provider="anthropic").session()
    client = wrap(anthropic_client(upstream), session=session)
    with pytest.raises(TypeError):
        client.messages.create(**a_body(1), not_a_parameter=1)
    assert session.turns == 0 and session.attempt == 0
    assert client.base_url == client.agentcache_unwrap().base_url  # type: ignore[attr-defined]
    assert isinstance(client.with_options(timeout=5.0), WrappedClient)
    other = client.beta  # another resource: the SDK's own
    assert type(other).__module__.startswith("anthropic")


def test_internal_failure_fails_open_with_the_original_request(
    upstream: FakeUpstream, monkeypatch: pytest.MonkeyPatch
) -> None:
    session = Sessions(provider="anthropic").session()
    client = wrap(anthropic_client(upstream), session=session)

    def boom(*args: Any, **kwargs: Any) -> Any:
        raise RuntimeError("agentcache bug")

    monkeypatch.setattr(agentcache.session._pipeline.SessionPipeline, "prepare", boom)
    body = a_body(1, shuffled(anthropic_tools(), 3))
    reply = client.messages.create(**body)
    assert type(reply) is anthropic.types.Message
    assert upstream.seen[-1].body["tools"] == body["tools"]  # exactly as the client sent it
    assert session.turns == 0 and session.attempt == 0


def test_a_closed_session_starts_its_next_generation(upstream: FakeUpstream) -> None:
    session = Sessions(provider="anthropic").session()
    client = wrap(anthropic_client(upstream), session=session)
    session.close()
    client.messages.create(**a_body(1))
    assert "cache_control" in json.dumps(upstream.seen[-1].body)  # planned as any request: nothing refused
    assert (session.closed, session.generation, session.turns) == (False, 1, 1)


def test_target_resolution_detects_engines_and_gives_gateways_provider_rules() -> None:
    gateway, engine = FakeUpstream(), FakeUpstream(engine="llamacpp")
    try:
        sessions = Sessions()
        chat = wrap(openai_client(gateway), sessions=sessions)
        chat.chat.completions.create(**o_body(1))
        assert chat.agentcache_session.provider == "openai"  # type: ignore[attr-defined]
        assert "prompt_cache_key" in gateway.seen[-1].body  # an OpenAI gateway gets OpenAI's rules
        messages = wrap(anthropic_client(gateway), sessions=sessions)
        messages.messages.create(**a_body(1))
        assert messages.agentcache_session.provider == "anthropic"  # type: ignore[attr-defined]
        assert "cache_control" in json.dumps(gateway.seen[-1].body)  # markers, though the host is not anthropic.com
        local = wrap(openai_client(engine), sessions=sessions)
        local.chat.completions.create(**o_body(1))
        assert local.agentcache_session.provider == "engine"  # type: ignore[attr-defined]
        assert local.agentcache_session.target.engine == "llama.cpp"  # type: ignore[attr-defined]
        assert engine.probes == ["/v1/models", "/props"]  # asked once, then remembered
        assert "prompt_cache_key" not in engine.seen[-1].body and engine.seen[-1].path == "/v1/chat/completions"
        declared = wrap(openai_client(gateway), sessions=sessions, provider="engine")
        declared.chat.completions.create(**o_body(1))
        assert "prompt_cache_key" not in gateway.seen[-1].body
        with pytest.raises(agentcache.ConfigError):
            wrap(object())
    finally:
        gateway.close()
        engine.close()


def test_sglang_sink_adds_session_id_to_requests_bound_for_it(upstream: FakeUpstream) -> None:
    sink = agentcache.SGLangSink(upstream.url)
    sessions = Sessions(sinks=[sink])

    def chats() -> list[dict[str, Any]]:
        return [s.body for s in upstream.seen if s.path.endswith("/chat/completions")]

    with sessions.session("agent-7") as session:
        client = wrap(openai_client(upstream), session=session)
        client.chat.completions.create(**o_body(1), extra_body={"chat_template_kwargs": {"x": 1}})
        assert chats()[-1]["session_id"] == "agent-7"
        assert chats()[-1]["chat_template_kwargs"] == {"x": 1}
        session.restart()
        client.chat.completions.create(**o_body(1))
        assert chats()[-1]["session_id"] == "agent-7:g1"
    sink.flush(5)
    closes = [s.body for s in upstream.seen if s.path == "/close_session"]
    assert closes == [{"session_id": "agent-7"}, {"session_id": "agent-7:g1"}]
    other = Sessions(sinks=[agentcache.SGLangSink("http://127.0.0.1:9")]).session()
    wrap(openai_client(upstream), session=other).chat.completions.create(**o_body(1))
    assert "session_id" not in chats()[-1]  # not bound for that server
    sink.shutdown()
