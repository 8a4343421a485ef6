"""The proxy in-process (``httpx.ASGITransport``) in front of a fake upstream (``httpx.MockTransport``):
the pipeline routes, streaming passthrough with the usage tap, untouched passthrough of other paths, and the
session pipeline's effect on the forwarded bytes."""

from __future__ import annotations

import asyncio
import json
from typing import Any

from agentcache.adapters import canonicalize
from agentcache.model._canonical import common_prefix
from tests.test_proxy_support import (
    ANTHROPIC_KEY,
    anthropic_body,
    anthropic_events,
    chat_body,
    conversation,
    proxy,
    sse_bytes,
)

HEADERS = {"x-api-key": ANTHROPIC_KEY, "anthropic-version": "2023-06-01"}


def run(coro: Any) -> Any:
    return asyncio.run(coro)


def test_messages_forwarded_with_markers_and_usage_recorded() -> None:
    async def scenario() -> None:
        async with proxy() as (client, state, fake):
            body = anthropic_body(conversation(1))
            r = await client.post("/v1/messages", json=body, headers=HEADERS)
            assert r.status_code == 200
            assert r.json()["content"][0]["text"] == "Hello there."
            assert r.headers["request-id"] == "req_1"
            sid = r.headers["x-agentcache-session"]
            sent = fake.requests[-1]
            assert sent.headers["x-api-key"] == ANTHROPIC_KEY  # auth untouched
            assert "x-agentcache-session" not in sent.headers
            wire = sent.json()
            # agentcache placed cache markers; the content is otherwise what the client sent
            assert "cache_control" in json.dumps(wire)
            assert [t["name"] for t in wire["tools"]] == [t["name"] for t in body["tools"]]
            assert wire["system"][0]["text"] == body["system"]  # a marker turns the string into a text block
            orig, planned = canonicalize("anthropic.messages", body), canonicalize("anthropic.messages", wire)
            tools = sum(1 for b in orig.blocks if b.section == "tool")
            assert common_prefix(orig, planned) >= tools
            # second turn extends the first: the same session, diagnosed append-only
            body2 = anthropic_body(conversation(3))
            r2 = await client.post("/v1/messages", json=body2, headers=HEADERS)
            assert r2.headers["x-agentcache-session"] == sid
            report = state.report.to_dict()
            assert report["totals"]["reported"]["requests"] == 2
            assert report["totals"]["reported"]["cache_read_tokens"] > 0
            assert report["sessions"][0]["requests"] == 2
            assert report["breaks"] == []

    run(scenario())


def test_anthropic_stream_relayed_byte_for_byte_and_usage_tapped() -> None:
    async def scenario() -> None:
        async with proxy() as (client, state, _fake):
            body = anthropic_body(conversation(3), stream=True)
            await client.post("/v1/messages", json=anthropic_body(conversation(1)), headers=HEADERS)
            async with client.stream("POST", "/v1/messages", json=body, headers=HEADERS) as r:
                assert r.headers["content-type"] == "text/event-stream"
                raw = b"".join([c async for c in r.aiter_raw()])
            # the fake's own bytes for this request, recomputed
            assert raw.startswith(b"event: message_start\n")
            assert raw.count(b"event: ") == len(anthropic_events({}))
            assert raw.endswith(sse_bytes([("message_stop", {"type": "message_stop"})])[0])
            metrics = state.metrics.render().decode()
            assert (
                'agentcache_prompt_tokens_total{kind="cache_read",model="claude-opus-4-8",provider="anthropic",'
                'source="turn"}' in metrics
            )
            reported = state.report.to_dict()["totals"]["reported"]
            assert reported["requests"] == 2 and reported["cache_read_tokens"] > 0

    run(scenario())


def test_openai_chat_gets_routing_key_and_stream_usage() -> None:
    async def scenario() -> None:
        async with proxy(upstream="openai") as (client, state, fake):
            msgs = [{"role": "user", "content": "I want to change my flight."}]
            r = await client.post(
                "/v1/chat/completions", json=chat_body(msgs), headers={"authorization": "Bearer sk-o"}
            )
            assert r.status_code == 200 and r.json()["object"] == "chat.completion"
            wire = fake.requests[-1].json()
            assert wire["prompt_cache_key"]  # agentcache's lineage key
            assert fake.requests[-1].headers["authorization"] == "Bearer sk-o"
            msgs2 = [*msgs, {"role": "assistant", "content": "Sure."}, {"role": "user", "content": "Flight HAT001."}]
            body = chat_body(msgs2, stream=True, stream_options={"include_usage": True})
            async with client.stream(
                "POST", "/v1/chat/completions", json=body, headers={"authorization": "Bearer sk-o"}
            ) as s:
                text = (await s.aread()).decode()
            assert text.rstrip().endswith("data: [DONE]")
            assert fake.requests[-1].json()["prompt_cache_key"] == wire["prompt_cache_key"]
            assert r.headers["x-agentcache-session"] == s.headers["x-agentcache-session"]
            reported = state.report.to_dict()["totals"]["reported"]
            assert reported["requests"] == 2 and reported["cache_read_tokens"] > 0

    run(scenario())


def test_responses_route_stream_and_not() -> None:
    async def scenario() -> None:
        async with proxy(upstream="openai") as (client, state, _fake):
            body = {"model": "gpt-4o", "instructions": "Be brief.", "input": [{"role": "user", "content": "Hi"}]}
            r = await client.post("/v1/responses", json=body)
            assert r.status_code == 200 and r.json()["object"] == "response"
            async with client.stream("POST", "/v1/responses", json={**body, "stream": True}) as s:
                text = (await s.aread()).decode()
            assert "response.completed" in text
            assert state.report.to_dict()["totals"]["reported"]["requests"] == 2

    run(scenario())


def test_other_paths_pass_through_untouched() -> None:
    async def scenario() -> None:
        async with proxy() as (client, state, fake):
            raw = b'{"model":"claude-opus-4-8",  "messages":[{"role":"user","content":"hi"}]}'
            r = await client.post(
                "/v1/messages/count_tokens?beta=true",
                content=raw,
                headers={**HEADERS, "content-type": "application/json", "x-custom": "1"},
            )
            assert r.status_code == 200 and r.headers["x-upstream"] == "fake"
            seen = fake.requests[-1]
            assert seen.body == raw  # not re-serialised
            assert seen.query == "beta=true"
            assert seen.headers["x-custom"] == "1" and seen.headers["x-api-key"] == ANTHROPIC_KEY
            r = await client.get("/v1/models", headers=HEADERS)
            assert r.json() == {"echo": "/v1/models", "method": "GET", "bytes": 0}
            r = await client.delete("/v1/files/file_1", headers=HEADERS)
            assert r.json()["method"] == "DELETE"
            assert state.store.live() == 0  # no sessions for passthrough traffic

    run(scenario())


def test_unchanged_body_is_forwarded_as_sent() -> None:
    async def scenario() -> None:
        # openai upstream with a client key: nothing to change, so the client's exact bytes go out
        async with proxy(upstream="openai") as (client, _state, fake):
            raw = b'{"model": "gpt-4o",   "prompt_cache_key": "mine", "messages": [{"role": "user", "content": "hi"}]}'
            r = await client.post("/v1/chat/completions", content=raw, headers={"content-type": "application/json"})
            assert r.status_code == 200
            assert fake.requests[-1].body == raw
            assert r.headers["x-agentcache-session"] == "mine"

    run(scenario())


def test_reordered_tools_are_repaired_on_the_wire() -> None:
    async def scenario() -> None:
        async with proxy() as (client, state, fake):
            sid = {"x-agentcache-session": "agent-1", **HEADERS}
            first = anthropic_body(conversation(1))
            await client.post("/v1/messages", json=first, headers=sid)
            second = anthropic_body(conversation(3))
            second["tools"] = list(reversed(second["tools"]))
            r = await client.post("/v1/messages", json=second, headers=sid)
            assert r.status_code == 200
            names = [t["name"] for t in fake.requests[-1].json()["tools"]]
            assert names == [t["name"] for t in first["tools"]]
            rep = state.report.to_dict()
            assert rep["breaks"][0]["cause"] == "tools.reordered" and rep["breaks"][0]["repaired"] is True
            brk = 'agentcache_breaks_total{cause="tools.reordered",provider="anthropic",repaired="true"} 1.0'
            assert brk in state.metrics.render().decode()

    run(scenario())


def test_compressed_request_body_is_relayed_untouched() -> None:
    import gzip

    import httpx

    async def scenario() -> None:
        async with proxy() as (client, state, fake):
            fake.fault = lambda seen: httpx.Response(200, json={"type": "message", "usage": {"input_tokens": 1}})
            raw = gzip.compress(json.dumps(anthropic_body(conversation(1))).encode())
            headers = {**HEADERS, "content-type": "application/json", "content-encoding": "gzip"}
            r = await client.post("/v1/messages", content=raw, headers=headers)
            assert r.status_code == 200
            assert fake.requests[-1].body == raw and fake.requests[-1].headers["content-encoding"] == "gzip"
            assert state.store.live() == 0

    run(scenario())


def test_usage_tap_reads_split_and_compressed_bodies() -> None:
    import gzip

    from agentcache.proxy._forward import UsageTap, request_headers
    from tests.test_proxy_support import chat_chunks, responses_events

    usage = {"input_tokens": 7, "cache_read_input_tokens": 90, "cache_creation_input_tokens": 3}
    raw = b"".join(sse_bytes(anthropic_events(usage)))
    raw = raw.replace(b'"usage": {"output_tokens": 3}', b'"usage": {"output_tokens": 3, "cache_read_input_tokens": 95}')
    tap = UsageTap("anthropic.messages", "text/event-stream; charset=utf-8")
    for i in range(0, len(raw), 7):  # events split at arbitrary byte boundaries
        tap.feed(raw[i : i + 7])
    got = tap.result()
    assert got is not None and (got.cache_read_tokens, got.uncached_tokens, got.output_tokens) == (95, 7, 3)

    chat = {"prompt_tokens": 100, "prompt_tokens_details": {"cached_tokens": 64}}
    tap = UsageTap("openai.chat", "text/event-stream")
    tap.feed(b"".join(sse_bytes(chat_chunks(chat), done=True)))
    got = tap.result()
    assert got is not None and got.cache_read_tokens == 64 and got.prompt_tokens == 100

    tap = UsageTap("openai.responses", "text/event-stream")
    tap.feed(b"".join(sse_bytes(responses_events({"input_tokens": 50, "input_tokens_details": {"cached_tokens": 40}}))))
    assert (got := tap.result()) is not None and got.cache_read_tokens == 40

    body = gzip.compress(json.dumps({"usage": {"input_tokens": 5, "cache_read_input_tokens": 20}}).encode())
    tap = UsageTap("anthropic.messages", "application/json", "gzip")
    tap.feed(body[:10])
    tap.feed(body[10:])
    assert (got := tap.result()) is not None and got.cache_read_tokens == 20 and got.prompt_tokens == 25

    tap = UsageTap("anthropic.messages", "application/json", "br")  # unreadable: no usage, no error
    tap.feed(b"\x00\x01")
    assert tap.result() is None

    headers = request_headers(
        [
            (b"Host", b"proxy"),
            (b"Connection", b"keep-alive"),
            (b"x-api-key", b"k"),
            (b"x-agentcache-session", b"s"),
            (b"Accept-Encoding", b"gzip, br, zstd"),
            (b"content-length", b"10"),
        ],
        pipeline=True,
    )
    assert headers == [(b"x-api-key", b"k"), (b"Accept-Encoding", b"gzip")]


def test_upstream_cookies_never_reach_another_request_and_no_headers_are_added() -> None:
    """An upstream ``Set-Cookie`` goes back to the caller only; later requests (another tenant's) carry no
    cookie the proxy kept, and the proxy adds no ``Accept-Encoding``/``User-Agent`` the caller did not send."""
    import httpx

    async def scenario() -> None:
        async with proxy() as (client, _state, fake):
            fake.fault = lambda seen: httpx.Response(
                200, json={"ok": True}, headers={"set-cookie": "__cf_bm=tenant-a-secret; Path=/"}
            )
            r = await client.get("/v1/models", headers={"x-api-key": "sk-a"})
            assert r.headers["set-cookie"].startswith("__cf_bm=tenant-a-secret")
            fake.fault = None
            client.cookies.clear()  # from here on, another caller (the test client would send it back itself)
            for name in ("accept-encoding", "user-agent", "accept"):
                client.headers.pop(name, None)
            raw = b'{"model":"claude-opus-4-8","max_tokens":8,"messages":[{"role":"user","content":"hi"}]}'
            headers = {"x-api-key": "sk-b", "content-type": "application/json"}
            await client.post("/v1/messages", content=raw, headers=headers)
            await client.get("/v1/models", headers={"x-api-key": "sk-b"})
            assert len(fake.requests) == 3
            for seen in fake.requests[1:]:
                assert "cookie" not in seen.headers
                assert "accept-encoding" not in seen.headers and "user-agent" not in seen.headers
                assert seen.headers["x-api-key"] == "sk-b"

    run(scenario())


def test_env_proxy_is_decided_once_for_the_upstream(monkeypatch: Any) -> None:
    from agentcache.proxy._transport import env_proxy

    for name in ("HTTPS_PROXY", "HTTP_PROXY", "ALL_PROXY", "NO_PROXY"):
        monkeypatch.delenv(name, raising=False)
        monkeypatch.delenv(name.lower(), raising=False)
    assert env_proxy("https://api.anthropic.com") is None
    monkeypatch.setenv("HTTPS_PROXY", "http://corp:3128")
    assert env_proxy("https://api.anthropic.com") == "http://corp:3128"
    monkeypatch.setenv("NO_PROXY", "anthropic.com")
    assert env_proxy("https://api.anthropic.com") is None


def test_health_needs_no_token_and_is_not_relayed() -> None:
    async def scenario() -> None:
        async with proxy(host="0.0.0.0", admin_token="secret") as (client, _state, fake):
            r = await client.get("/agentcache/v1/health")
            assert r.status_code == 200 and r.json() == {"status": "ok", "store": "memory", "store_ok": True}
            assert fake.requests == []  # answered by the proxy itself
            assert (await client.get("/metrics")).status_code == 401  # the admin endpoints still need the token

    run(scenario())


def test_turns_are_parsed_from_the_last_turns_parse_and_sent_the_same() -> None:
    """The proxy parses each turn guided by the previous turn's parse (model/_parsememo); what goes upstream is
    byte for byte what an unguided parse gives."""

    async def scenario() -> list[list[bytes]]:
        sent = []
        for guided in (True, False):
            async with proxy() as (client, state, fake):
                state.parse_memo.smallest = 0 if guided else 1 << 60
                for n in (1, 3, 5, 7):
                    r = await client.post("/v1/messages", json=anthropic_body(conversation(n)), headers=HEADERS)
                    assert r.status_code == 200
                assert (state.parse_memo.guided, state.parse_memo.continued) == ((3, 3) if guided else (0, 0))
                assert len(state.parse_memo) == (1 if guided else 0)
                sent.append([req.body for req in fake.requests])
        return sent

    guided, plain = run(scenario())
    assert guided == plain and len(guided) == 4
