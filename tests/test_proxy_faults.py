"""Failure behaviour: upstream errors verbatim, upstream failures as the same kind of failure, the proxy's own
400/413 in the caller's error format, and fail-open on agentcache's own exceptions."""

from __future__ import annotations

import asyncio
import json
from collections.abc import AsyncIterator
from typing import Any

import httpx
import pytest

from agentcache.session import MemoryStore
from agentcache.session._pipeline import SessionPipeline
from tests.test_proxy_support import ANTHROPIC_KEY, FakeUpstream, Seen, anthropic_body, chat_body, conversation, proxy

A = {"x-api-key": ANTHROPIC_KEY}


def run(coro: Any) -> Any:
    return asyncio.run(coro)


def test_upstream_error_status_body_and_headers_reach_the_client_verbatim() -> None:
    raw = b'{"type":"error","error":{"type":"rate_limit_error","message":"slow down"}}'

    def limited(seen: Seen) -> httpx.Response:
        return httpx.Response(429, content=raw, headers={"retry-after": "7", "content-type": "application/json"})

    async def scenario() -> None:
        async with proxy(FakeUpstream(fault=limited)) as (client, _state, _):
            r = await client.post("/v1/messages", json=anthropic_body(conversation(1)), headers=A)
            assert r.status_code == 429 and r.content == raw and r.headers["retry-after"] == "7"
            assert "x-agentcache-error" not in r.headers
            r = await client.get("/v1/models", headers=A)
            assert r.status_code == 429 and r.content == raw

    run(scenario())


@pytest.mark.parametrize(
    ("exc", "status", "kind"),
    [
        (httpx.ReadTimeout("slow"), 504, "timeout_error"),
        (httpx.ConnectTimeout("slow"), 504, "timeout_error"),
        (httpx.ConnectError("refused"), 502, "api_error"),
        (httpx.RemoteProtocolError("reset"), 502, "api_error"),
    ],
)
def test_pre_response_failures_become_provider_shaped_502_504(
    exc: Exception, status: int, kind: str, caplog: pytest.LogCaptureFixture
) -> None:
    def fail(seen: Seen) -> None:
        raise exc

    async def scenario() -> None:
        async with proxy(FakeUpstream(fault=fail)) as (client, state, _):
            r = await client.post("/v1/messages", json=anthropic_body(conversation(1)), headers=A)
            assert r.status_code == status
            assert r.json()["type"] == "error" and r.json()["error"]["type"] == kind
            r = await client.post("/v1/chat/completions", json=chat_body([{"role": "user", "content": "hi"}]))
            assert r.status_code == status and set(r.json()["error"]) == {"message", "type", "param", "code"}
            r = await client.get("/v1/models", headers=A)  # passthrough: Anthropic upstream → Anthropic format
            assert r.status_code == status and r.json()["type"] == "error"
            assert state.store.live() == 2  # sessions opened, nothing committed
            assert all(s.turns == 0 for s in state.store._live.values())  # type: ignore[attr-defined]

    with caplog.at_level("INFO", logger="agentcache"):
        run(scenario())
    lines = [r.getMessage() for r in caplog.records if "proxy.request" in r.getMessage()]
    assert len(lines) == 2 and all(str(status) in ln and "upstream_unavailable" in ln for ln in lines), lines


def test_stream_cut_midway_is_cut_for_the_client_and_the_upstream_is_closed() -> None:
    closed = asyncio.Event()

    def cut(seen: Seen) -> httpx.Response | None:
        if seen.path != "/v1/messages":
            return None

        async def body() -> AsyncIterator[bytes]:
            try:
                yield b'event: message_start\ndata: {"type":"message_start","message":{"usage":{"input_tokens":5}}}\n\n'
                raise httpx.RemoteProtocolError("peer closed connection without sending complete message body")
            finally:
                closed.set()

        return httpx.Response(200, headers={"content-type": "text/event-stream"}, content=body())

    async def scenario() -> None:
        async with proxy(FakeUpstream(fault=cut)) as (client, state, _):
            with pytest.raises(Exception, match="upstream stream broken"):
                await client.post("/v1/messages", json=anthropic_body(conversation(1), stream=True), headers=A)
            assert closed.is_set()
            metrics = state.metrics.render().decode()
            assert 'agentcache_proxy_upstream_errors_total{kind="stream_cut",route="/v1/messages"} 1.0' in metrics

    run(scenario())


def test_malformed_and_oversized_bodies_get_the_callers_error_format() -> None:
    async def scenario() -> None:
        async with proxy(max_body_bytes=2000) as (client, _, fake):
            r = await client.post("/v1/messages", content=b'{"model": "x", "messages": [', headers=A)
            assert r.status_code == 400
            body = r.json()
            assert body["type"] == "error" and body["error"]["type"] == "invalid_request_error"
            assert "not valid JSON" in body["error"]["message"]
            big = json.dumps(anthropic_body(conversation(1))).encode()
            r = await client.post("/v1/messages", content=big, headers=A)
            assert r.status_code == 413 and r.json()["error"]["type"] == "request_too_large"

            async def chunks() -> AsyncIterator[bytes]:  # no content-length: counted while reading
                for i in range(0, len(big), 500):
                    yield big[i : i + 500]

            r = await client.post("/v1/responses", content=chunks())
            assert r.status_code == 413 and r.json()["error"]["code"] == "request_too_large"
            assert fake.requests == []  # none of them reached the upstream

    run(scenario())


def test_unreadable_request_shape_is_forwarded_unchanged() -> None:
    async def scenario() -> None:
        async with proxy() as (client, _state, fake):
            raw = b'{"model": "claude-opus-4-8", "messages": "not a list"}'
            fake.fault = lambda seen: httpx.Response(
                400,
                json={
                    "type": "error",
                    "error": {"type": "invalid_request_error", "message": "messages: Input should be a valid list"},
                },
            )
            r = await client.post("/v1/messages", content=raw, headers=A)
            assert r.status_code == 400 and "valid list" in r.json()["error"]["message"]
            assert fake.requests[-1].body == raw

    run(scenario())


def test_internal_failure_fails_open_with_the_original_bytes(monkeypatch: pytest.MonkeyPatch) -> None:
    def broken(self: SessionPipeline, *args: Any, **kwargs: Any) -> Any:
        raise RuntimeError("bug in agentcache")

    monkeypatch.setattr(SessionPipeline, "prepare", broken)

    async def scenario() -> None:
        async with proxy() as (client, state, fake):
            raw = json.dumps(anthropic_body(conversation(1)), indent=1).encode()
            r = await client.post("/v1/messages", content=raw, headers={**A, "content-type": "application/json"})
            assert r.status_code == 200 and r.json()["type"] == "message"
            assert fake.requests[-1].body == raw
            assert fake.requests[-1].headers["x-api-key"] == ANTHROPIC_KEY
            assert 'agentcache_proxy_fail_open_total{stage="prepare"} 1.0' in state.metrics.render().decode()

    run(scenario())


def test_store_failure_fails_open(monkeypatch: pytest.MonkeyPatch) -> None:
    async def scenario() -> None:
        async with proxy() as (client, state, fake):

            def down(*args: Any, **kwargs: Any) -> None:
                raise ConnectionError("store down")

            monkeypatch.setattr(MemoryStore, "find", down)
            raw = json.dumps(anthropic_body(conversation(1))).encode()
            r = await client.post("/v1/messages", content=raw, headers={**A, "content-type": "application/json"})
            assert r.status_code == 200 and fake.requests[-1].body == raw
            metrics = state.metrics.render().decode()
            assert 'agentcache_proxy_store_errors_total{op="find"} 1.0' in metrics

    run(scenario())


def test_client_disconnect_reported_by_send_closes_the_upstream() -> None:
    """Servers on ASGI spec 2.4 raise OSError from ``send`` once the client is gone: the relay stops quietly."""
    from agentcache.proxy._forward import StreamOutcome, UpstreamResponse

    closed = asyncio.Event()
    outcomes: list[StreamOutcome] = []

    async def body() -> AsyncIterator[bytes]:
        try:
            for i in range(100):
                yield b"data: %d\n\n" % i
                await asyncio.sleep(0)
        finally:
            closed.set()

    async def scenario() -> None:
        async with httpx.AsyncClient(
            transport=httpx.MockTransport(lambda r: httpx.Response(200, content=body()))
        ) as client:
            upstream = await client.send(client.build_request("GET", "http://x/"), stream=True)
        sent: list[dict[str, Any]] = []

        async def send(message: dict[str, Any]) -> None:
            if len(sent) == 3:
                raise OSError("client disconnected")
            sent.append(message)

        async def receive() -> dict[str, Any]:
            await asyncio.sleep(3600)
            return {"type": "http.disconnect"}

        async def done(outcome: StreamOutcome) -> None:
            outcomes.append(outcome)

        response = UpstreamResponse(upstream, started=0.0, on_done=done)
        await response({"type": "http"}, receive, send)  # type: ignore[arg-type]

    run(scenario())
    assert closed.is_set() and [o.status for o in outcomes] == ["client_gone"]


def test_client_leaving_right_after_the_terminal_event_is_a_complete_exchange() -> None:
    """An SDK that stops reading at ``message_stop`` closes before the chunked terminator arrives: the relay
    sees a disconnect, but the client had the whole stream (the usage tap saw the terminal event)."""
    from agentcache.proxy._forward import StreamOutcome, UpstreamResponse, UsageTap

    events = [b'event: message_start\ndata: {"type":"message_start","message":{"usage":{"input_tokens":5}}}\n\n',
              b'event: message_stop\ndata: {"type":"message_stop"}\n\n']  # fmt: skip
    outcomes: list[StreamOutcome] = []

    async def body() -> AsyncIterator[bytes]:
        for chunk in events:
            yield chunk
            await asyncio.sleep(0.05)  # the client's disconnect can arrive between events
        await asyncio.sleep(3600)  # the upstream's end of body comes late

    async def scenario(cut_after: int) -> None:
        async with httpx.AsyncClient(
            transport=httpx.MockTransport(lambda r: httpx.Response(200, content=body()))
        ) as client:
            upstream = await client.send(client.build_request("POST", "http://x/v1/messages"), stream=True)
        sent: list[dict[str, Any]] = []
        gone = asyncio.Event()

        async def send(message: dict[str, Any]) -> None:
            sent.append(message)
            if len(sent) == 1 + cut_after:
                gone.set()

        async def receive() -> dict[str, Any]:
            await gone.wait()
            return {"type": "http.disconnect"}

        async def done(outcome: StreamOutcome) -> None:
            outcomes.append(outcome)

        tap = UsageTap("anthropic.messages", "text/event-stream")
        response = UpstreamResponse(upstream, started=0.0, tap=tap, on_done=done)
        await response({"type": "http"}, receive, send)  # type: ignore[arg-type]

    run(scenario(cut_after=2))  # both events delivered, then the client left
    run(scenario(cut_after=1))  # left after message_start: gave up mid-stream
    assert [o.status for o in outcomes] == ["complete", "client_gone"]


def test_relayed_error_format_follows_the_clients_headers() -> None:
    from agentcache.proxy._errors import style_for

    assert style_for("/v1/models", "url", {"x-api-key": "k"}) == "anthropic"  # an Anthropic SDK's GET
    assert style_for("/v1/models", "url", {"anthropic-version": "2023-06-01"}) == "anthropic"
    assert style_for("/v1/models", "url", {"authorization": "Bearer k"}) == "openai"
    assert style_for("/v1/models", "anthropic", {}) == "anthropic"
    assert style_for("/v1/chat/completions", "url", {"x-api-key": "k"}) == "openai"  # the route decides
