"""``agentcache.wrap`` and the SDKs' ``with_raw_response`` / ``with_streaming_response`` views and low-level
``post``, against the fake upstream: the SDK's own response objects come back (the same types as from an unwrapped
client), the body on the wire is repaired (a reshuffled tool list goes out in its first-seen order), and the usage
comes from the body the caller reads, whichever way it reads it.
"""

from __future__ import annotations

import asyncio
import gc
import inspect
from collections.abc import Callable, Iterator
from dataclasses import dataclass
from typing import Any

import pytest

anthropic = pytest.importorskip("anthropic")
openai = pytest.importorskip("openai")

from agentcache import Sessions, wrap  # noqa: E402

from .conftest import anthropic_tools, openai_tools, policy  # noqa: E402
from .test_wrap_upstream import (  # noqa: E402
    FakeUpstream,
    Reply,
    a_body,
    anthropic_client,
    anthropic_events,
    o_body,
    openai_client,
    shuffled,
)


@pytest.fixture
def upstream() -> Iterator[FakeUpstream]:
    up = FakeUpstream()
    yield up
    up.close()


def responses_tools() -> list[dict[str, Any]]:
    keys = ("name", "description", "parameters")
    return [{"type": "function", **{k: t["function"][k] for k in keys}} for t in openai_tools()]


def r_body(turns: int = 1, tools: list[dict[str, Any]] | None = None) -> dict[str, Any]:
    items: list[dict[str, Any]] = []
    for i in range(turns):
        items.append({"role": "user", "content": f"question {i}"})
        if i < turns - 1:
            items.append({"role": "assistant", "content": f"answer {i}"})
    return {"model": "gpt-4o", "instructions": policy(), "input": items, "tools": tools or responses_tools()}


@dataclass(frozen=True)
class Api:
    """One intercepted API: its client, resource, request bodies, the tool names on the wire and its usage."""

    provider: str
    client: Callable[..., Any]
    resource: Callable[[Any], Any]
    body: Callable[..., dict[str, Any]]
    tools: Callable[[], list[dict[str, Any]]]
    tool_name: Callable[[dict[str, Any]], str]
    cached: int  # the fake upstream's cached-token count for this API
    stream_extra: dict[str, Any]


APIS = {
    "anthropic.messages": Api(
        "anthropic", anthropic_client, lambda c: c.messages, a_body, anthropic_tools, lambda t: t["name"], 1200, {}
    ),
    "openai.chat": Api(
        "openai",
        openai_client,
        lambda c: c.chat.completions,
        o_body,
        openai_tools,
        lambda t: t["function"]["name"],
        1152,
        {"stream_options": {"include_usage": True}},
    ),
    "openai.responses": Api(
        "openai", openai_client, lambda c: c.responses, r_body, responses_tools, lambda t: t["name"], 1024, {}
    ),
}
CASES = [(api, mode, stream) for api in APIS for mode in ("raw", "streaming") for stream in (False, True)]


def kwargs_of(api: Api, turns: int, stream: bool, seed: int | None = None) -> dict[str, Any]:
    tools = shuffled(api.tools(), seed) if seed is not None else None
    body = api.body(turns, tools)
    return {**body, "stream": True, **api.stream_extra} if stream else body


def call_sync(api: Api, client: Any, mode: str, kwargs: dict[str, Any], stream: bool) -> tuple[list[type], Any]:
    """One call through the view; the types the caller saw and what it read (parsed reply or SSE lines)."""
    resource = api.resource(client)
    if mode == "raw":
        raw = resource.with_raw_response.create(**kwargs)
        parsed = raw.parse()
        return [type(raw), type(parsed)], (list(parsed) if stream else parsed)
    manager = resource.with_streaming_response.create(**kwargs)
    with manager as response:
        read = [x for x in response.iter_lines() if x.startswith("data:")] if stream else response.parse()
        return [type(manager), type(response)], read


async def call_async(api: Api, client: Any, mode: str, kwargs: dict[str, Any], stream: bool) -> tuple[list[type], Any]:
    resource = api.resource(client)
    if mode == "raw":
        raw = await resource.with_raw_response.create(**kwargs)
        parsed = raw.parse()  # openai's LegacyAPIResponse parses synchronously, even for the async client
        parsed = await parsed if inspect.isawaitable(parsed) else parsed
        return [type(raw), type(parsed)], ([e async for e in parsed] if stream else parsed)
    manager = resource.with_streaming_response.create(**kwargs)
    async with manager as response:
        read = [x async for x in response.iter_lines() if x.startswith("data:")] if stream else await response.parse()
        return [type(manager), type(response)], read


def check_turns(api: Api, upstream: FakeUpstream, session: Any, plain: Any, got: list[Any]) -> None:
    """``plain``: (types, read) from the unwrapped client; ``got``: the two wrapped turns."""
    (plain_types, plain_read), (types1, read1), (types2, _) = plain, *got
    assert types1 == types2 == plain_types  # the SDK's own objects, exactly as without agentcache
    if isinstance(plain_read, list):  # the same events / SSE lines reached the caller
        assert len(read1) == len(plain_read) > 2
    else:
        assert type(read1) is type(plain_read) and read1.id == plain_read.id
    names = [api.tool_name(t) for t in upstream.seen[-1].body["tools"]]
    assert names == [api.tool_name(t) for t in api.tools()]  # turn two's shuffled tools, repaired on the wire
    report = session.last_report
    assert session.turns == 2 and report is not None
    assert "tools.reordered" in report.repairs
    assert report.usage is not None and report.usage.cache_read_tokens == api.cached


@pytest.mark.parametrize(("name", "mode", "stream"), CASES)
def test_sync_views_are_intercepted(upstream: FakeUpstream, name: str, mode: str, stream: bool) -> None:
    api = APIS[name]
    plain = call_sync(api, api.client(upstream), mode, kwargs_of(api, 1, stream), stream)
    assert "cache_control" not in str(upstream.seen[-1].body)
    session = Sessions(provider=api.provider).session()
    client = wrap(api.client(upstream), session=session)
    got = [call_sync(api, client, mode, kwargs_of(api, t, stream, None if t == 1 else 5), stream) for t in (1, 2)]
    check_turns(api, upstream, session, plain, got)


@pytest.mark.parametrize(("name", "mode", "stream"), CASES)
def test_async_views_are_intercepted(upstream: FakeUpstream, name: str, mode: str, stream: bool) -> None:
    api = APIS[name]

    async def main() -> None:
        plain = await call_async(api, api.client(upstream, async_=True), mode, kwargs_of(api, 1, stream), stream)
        session = Sessions(provider=api.provider).session()
        client = wrap(api.client(upstream, async_=True), session=session)
        got = [
            await call_async(api, client, mode, kwargs_of(api, t, stream, None if t == 1 else 5), stream)
            for t in (1, 2)
        ]
        check_turns(api, upstream, session, plain, got)

    asyncio.run(main())


def test_client_level_and_nested_views(upstream: FakeUpstream) -> None:
    """``client.with_raw_response.<resource>`` and ``client.chat.with_raw_response.completions`` (LangChain's
    ChatOpenAI uses ``root_client.with_raw_response.responses``) reach the same interception."""
    session = Sessions(provider="openai").session()
    client = wrap(openai_client(upstream), session=session)
    raw = client.with_raw_response.chat.completions.create(**o_body(1))
    assert type(raw) is openai._legacy_response.LegacyAPIResponse and session.turns == 1
    client.chat.with_raw_response.completions.create(**o_body(2, shuffled(openai_tools(), 2)))
    assert session.turns == 2 and "tools.reordered" in session.last_report.repairs  # type: ignore[union-attr]
    with client.with_streaming_response.responses.create(**r_body(1)) as response:
        assert response.parse().output_text == "Hello."
    assert session.turns == 3 and session.last_report.usage.cache_read_tokens == 1024  # type: ignore[union-attr]
    a_session = Sessions(provider="anthropic").session()
    a = wrap(anthropic_client(upstream), session=a_session)
    assert a.with_raw_response.messages.create(**a_body(1)).parse().usage.cache_read_input_tokens == 1200
    assert a_session.turns == 1 and a_session.last_report.markers  # type: ignore[union-attr]
    assert "cache_control" in str(upstream.seen[-1].body)


def test_low_level_post_is_intercepted_as_litellm_sends_it(upstream: FakeUpstream) -> None:
    """litellm 1.110 posts ``/chat/completions`` itself, with the raw-response header ``true``."""
    from openai.types.chat import ChatCompletion, ChatCompletionChunk

    raw_header = {"X-Stainless-Raw-Response": "true"}
    session = Sessions(provider="openai").session()
    client = wrap(openai_client(upstream), session=session)
    raw = client.post("/chat/completions", body=o_body(1), cast_to=ChatCompletion, options={"headers": raw_header})
    assert type(raw) is openai._legacy_response.LegacyAPIResponse and type(raw.parse()) is ChatCompletion
    first = session.last_report
    body = {**o_body(2, shuffled(openai_tools(), 4)), "stream": True, "stream_options": {"include_usage": True}}
    raw = client.post(
        "/chat/completions",
        body=body,
        cast_to=ChatCompletion,
        options={"headers": raw_header},
        stream=True,
        stream_cls=openai.Stream[ChatCompletionChunk],
    )
    assert session.turns == 2 and session.last_report is first  # committed; its report waits for the stream
    text = "".join(c.choices[0].delta.content or "" for c in raw.parse() if c.choices)
    assert text == "Hello." and session.last_report is not first
    assert [t["function"]["name"] for t in upstream.seen[-1].body["tools"]] == [
        t["function"]["name"] for t in openai_tools()
    ]
    assert session.last_report is not None and session.last_report.usage.cache_read_tokens == 1152  # type: ignore[union-attr]
    with pytest.raises(openai.NotFoundError):  # another path: sent unchanged, not a turn
        client.post("/models/x", body={"a": 1}, cast_to=object)
    assert session.turns == 2 and upstream.seen[-1].body == {"a": 1}

    async def main() -> None:
        asession = Sessions(provider="openai").session()
        aclient = wrap(openai_client(upstream, async_=True), session=asession)
        raw = await aclient.post("/responses", body=r_body(1), cast_to=object, options={"headers": raw_header})
        assert type(raw) is openai._legacy_response.LegacyAPIResponse
        assert asession.turns == 1 and asession.last_report.usage.cache_read_tokens == 1024  # type: ignore[union-attr]

    asyncio.run(main())


def test_settings_set_on_the_wrapper_reach_the_client(upstream: FakeUpstream) -> None:
    client = wrap(openai_client(upstream), session=Sessions(provider="openai").session())
    client.max_retries = 5  # litellm sets max_retries on the client it is given
    assert client.agentcache_unwrap().max_retries == 5  # type: ignore[attr-defined]


def test_streaming_response_closed_early_or_cut(upstream: FakeUpstream) -> None:
    session = Sessions(provider="anthropic").session()
    client = wrap(anthropic_client(upstream), session=session)
    # Left without reading the body: the request was sent and accepted, so the turn counts, without usage.
    with client.messages.with_streaming_response.create(**a_body(1), stream=True) as response:
        assert response.http_response.status_code == 200
    assert session.turns == 1 and session.last_report is not None and session.last_report.usage is None
    # Read up to message_start, then closed: the usage seen so far is recorded.
    with client.messages.with_streaming_response.create(**a_body(2), stream=True) as response:
        for line in response.iter_lines():
            if "message_start" in line and line.startswith("data:"):
                break
    gc.collect()
    assert session.turns == 2 and session.last_report.usage.cache_read_tokens == 1200  # type: ignore[union-attr]
    # The upstream cuts the stream: the turn stays committed and a retry is counted.
    upstream.script.append(lambda path, body: Reply(events=anthropic_events(), cut_after=3))
    raw = client.messages.with_raw_response.create(**a_body(3), stream=True)
    with pytest.raises(Exception) as cut:
        list(raw.parse())
    assert type(cut.value).__name__ == "RemoteProtocolError"  # the HTTP client's own error reaches the caller
    assert session.turns == 3 and session.attempt == 1
    assert session.last_report.usage.cache_read_tokens == 1200  # type: ignore[union-attr]


def test_sdk_errors_on_views_count_a_retry(upstream: FakeUpstream) -> None:
    session = Sessions(provider="openai").session()
    client = wrap(openai_client(upstream), session=session)
    upstream.script.append(lambda path, body: Reply(429, {"error": {"message": "slow down", "type": "rate_limit"}}))
    with pytest.raises(openai.RateLimitError):
        client.chat.completions.with_raw_response.create(**o_body(1))
    upstream.script.append(lambda path, body: Reply(500, {"error": {"message": "boom", "type": "server"}}))
    with pytest.raises(openai.InternalServerError), client.chat.completions.with_streaming_response.create(**o_body(1)):
        pass
    assert (session.turns, session.attempt) == (0, 2)
