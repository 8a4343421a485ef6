"""The real ``anthropic`` and ``openai`` SDKs, unmodified, pointed at the proxy by ``base_url`` (sync clients over
HTTP to the proxy under uvicorn, async clients in-process), streaming and not; upstream errors reach the SDK as
its own exception types."""

from __future__ import annotations

import asyncio
from collections.abc import Iterator
from typing import Any

import anthropic
import httpx
import openai
import pytest

from agentcache.proxy import ProxyConfig, create_app
from tests.conftest import anthropic_tools
from tests.test_proxy_support import (
    ANTHROPIC_KEY,
    FakeUpstream,
    Seen,
    ServerThread,
    conversation,
    eventually,
    settings,
)


@pytest.fixture
def served() -> Iterator[tuple[ServerThread, FakeUpstream, Any]]:
    fake = FakeUpstream()
    app = create_app(ProxyConfig(upstream="anthropic"), settings=settings(), transport=fake.transport())
    with ServerThread(app) as server:
        yield server, fake, app.state.proxy


def _ant(server: ServerThread) -> anthropic.Anthropic:
    return anthropic.Anthropic(base_url=server.url, api_key=ANTHROPIC_KEY, max_retries=0)


def test_anthropic_sdk_create_and_stream(served: tuple[ServerThread, FakeUpstream, Any]) -> None:
    server, fake, state = served
    client = _ant(server)
    msgs: Any = conversation(1)
    first = client.messages.create(model="claude-opus-4-8", max_tokens=32, messages=msgs, tools=anthropic_tools())
    assert first.content[0].text == "Hello there."  # type: ignore[union-attr]
    seen = fake.requests[-1]
    # auth passes through as the SDK sent it (x-api-key, or a bearer token in newer SDKs)
    auth = seen.headers.get("x-api-key") or seen.headers["authorization"].removeprefix("Bearer ")
    assert auth == ANTHROPIC_KEY and seen.headers["anthropic-version"]
    assert seen.headers["user-agent"].startswith("Anthropic/Python")
    with client.messages.stream(
        model="claude-opus-4-8",
        max_tokens=32,
        messages=conversation(3),
        tools=anthropic_tools(),  # type: ignore[arg-type]
    ) as stream:
        text = "".join(stream.text_stream)
        final = stream.get_final_message()
    assert text == "Hello there."
    assert (final.usage.cache_read_input_tokens or 0) > 0
    streamed = client.messages.create(
        model="claude-opus-4-8",
        max_tokens=32,
        messages=conversation(5),
        stream=True,  # type: ignore[arg-type]
    )
    kinds = [event.type for event in streamed]
    assert kinds[0] == "message_start" and kinds[-1] == "message_stop"
    eventually(lambda: state.report.to_dict()["totals"]["reported"]["requests"] == 3)
    assert state.report.to_dict()["totals"]["reported"]["cache_read_tokens"] > 0


def test_anthropic_sdk_sees_upstream_errors_as_its_own(served: tuple[ServerThread, FakeUpstream, Any]) -> None:
    server, fake, _ = served
    fake.fault = lambda seen: httpx.Response(
        429,
        json={"type": "error", "error": {"type": "rate_limit_error", "message": "slow down"}},
        headers={"retry-after": "1"},
    )
    with pytest.raises(anthropic.RateLimitError, match="slow down"):
        _ant(server).messages.create(model="claude-opus-4-8", max_tokens=8, messages=conversation(1))  # type: ignore[arg-type]

    def timeout(seen: Seen) -> None:
        raise httpx.ReadTimeout("upstream too slow")

    fake.fault = timeout
    with pytest.raises(anthropic.InternalServerError) as caught:
        _ant(server).messages.create(model="claude-opus-4-8", max_tokens=8, messages=conversation(1))  # type: ignore[arg-type]
    assert caught.value.status_code == 504
    assert caught.value.body["error"]["type"] == "timeout_error"  # type: ignore[index]


def test_openai_sdk_chat_and_responses(served: tuple[ServerThread, FakeUpstream, Any]) -> None:
    server, fake, state = served
    client = openai.OpenAI(base_url=server.url + "/v1", api_key="sk-openai", max_retries=0)
    msgs: Any = [{"role": "system", "content": "Be terse."}, {"role": "user", "content": "Book a flight."}]
    done = client.chat.completions.create(model="gpt-4o", messages=msgs)
    assert done.choices[0].message.content == "Hello there."
    assert fake.requests[-1].headers["authorization"] == "Bearer sk-openai"
    msgs += [{"role": "assistant", "content": "Where to?"}, {"role": "user", "content": "Paris."}]
    chunks = list(
        client.chat.completions.create(
            model="gpt-4o", messages=msgs, stream=True, stream_options={"include_usage": True}
        )
    )
    assert chunks[-1].usage is not None and chunks[-1].usage.prompt_tokens_details.cached_tokens > 0  # type: ignore[union-attr]
    resp = client.responses.create(model="gpt-4o", input="Hi")
    assert resp.output_text == "Hello there." and resp.usage is not None
    events = [e.type for e in client.responses.create(model="gpt-4o", input="Hi", stream=True)]
    assert events == ["response.created", "response.completed"]
    eventually(lambda: state.report.to_dict()["totals"]["reported"]["requests"] == 4)


def _sdk_http_lib() -> Any:
    import importlib

    source = importlib.import_module("anthropic._base_client")
    return importlib.import_module("httpx2") if "httpx2" in vars(source) else httpx


def test_async_sdks_in_process() -> None:
    async def scenario() -> None:
        fake = FakeUpstream()
        app = create_app(ProxyConfig(upstream="openai"), settings=settings(), transport=fake.transport())
        async with app.state.proxy.running():
            # the SDKs take their own HTTP library's client (httpx, or httpx2 in newer releases)
            lib = _sdk_http_lib()
            http = lib.AsyncClient(transport=lib.ASGITransport(app=app), base_url="http://proxy")
            ant = anthropic.AsyncAnthropic(base_url="http://proxy", api_key="k", http_client=http, max_retries=0)
            stream = await ant.messages.create(
                model="claude-opus-4-8",
                max_tokens=8,
                messages=conversation(1),
                stream=True,  # type: ignore[arg-type]
            )
            assert [e.type async for e in stream][-1] == "message_stop"
            oai = openai.AsyncOpenAI(base_url="http://proxy/v1", api_key="k", http_client=http, max_retries=0)
            done = await oai.chat.completions.create(model="gpt-4o", messages=[{"role": "user", "content": "hi"}])
            assert done.usage is not None and done.usage.prompt_tokens > 0
            await http.aclose()

    asyncio.run(scenario())
