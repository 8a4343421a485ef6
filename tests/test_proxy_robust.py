"""Issue 12, kinds 3, 7, 8 and 9: nothing the upstream answered is lost, agentcache's own namespace and views
are scoped, valid JSON is the upstream's to judge, the body limit holds everywhere, and every request is
counted as what it was."""

from __future__ import annotations

import asyncio
import json
from collections.abc import AsyncIterator, Iterator
from typing import Any
from urllib.parse import quote, unquote

import httpx
import pytest

from agentcache.proxy import ProxyConfig, create_app
from agentcache.proxy._caller import header_value, tenant_of
from agentcache.simulate._openai import partition_key
from tests.test_proxy_live import RawUpstream
from tests.test_proxy_support import (
    ANTHROPIC_KEY,
    OTHER_KEY,
    ServerThread,
    anthropic_body,
    chat_body,
    conversation,
    eventually,
    proxy,
    settings,
)

A = {"x-api-key": ANTHROPIC_KEY}
B = {"x-api-key": OTHER_KEY}
ADMIN = {"x-agentcache-admin-token": "s3cret"}
JSON = {"content-type": "application/json"}
PIPELINE = ["/v1/messages", "/v1/chat/completions", "/v1/responses"]


def run(coro: Any) -> Any:
    return asyncio.run(coro)


def requests_total(state: Any, route: str, status: str, provider: str | None = None) -> float | None:
    """``agentcache_proxy_requests_total`` summed over the labels not given."""
    total = None
    for family in state.metrics.registry.collect():
        for s in family.samples:
            if s.name != "agentcache_proxy_requests_total":
                continue
            labels = s.labels
            wanted = labels["route"] == route and labels["status"] == status
            if wanted and (provider is None or labels["provider"] == provider):
                total = (total or 0.0) + s.value
    return total


def fail_open(state: Any, stage: str) -> float | None:
    return state.metrics.registry.get_sample_value("agentcache_proxy_fail_open_total", {"stage": stage})


# --- 3: answered requests are never lost -------------------------------------------------------------------

ODD_KEYS = ["abc\r\ndef", "nul\u0000", "bell\u0007", "a\ud800b", " padded\t", "100%"]


@pytest.fixture
def live() -> Iterator[tuple[ServerThread, Any]]:
    """The proxy under uvicorn (the server that refused the header) in front of a raw-socket upstream."""
    with RawUpstream() as upstream:
        cfg = ProxyConfig(upstream=f"http://127.0.0.1:{upstream.port}", read_timeout=5.0)
        app = create_app(cfg, settings=settings())
        with ServerThread(app) as server:
            yield server, app.state.proxy


def _odd_body(key: str) -> bytes:
    doc = {"model": "fine", "stream": True, "messages": [{"role": "user", "content": "hi"}], "prompt_cache_key": key}
    return json.dumps(doc).encode()  # ASCII: control characters and the lone surrogate as JSON escapes


def test_header_value_is_a_valid_field_value_that_decodes_back() -> None:
    for key in [*ODD_KEYS, "é/ü?#", "x" * 300, ""]:
        value = header_value(key)
        assert all(0x21 <= b <= 0x7E for b in value)  # visible ASCII only: no SP/HTAB to trim, no controls
        assert unquote(value.decode("ascii"), errors="surrogatepass") == key


def test_odd_session_ids_are_answered_with_an_encoded_header(live: tuple[ServerThread, Any]) -> None:
    server, state = live
    with httpx.Client(base_url=server.url, timeout=30) as client:
        for key in ODD_KEYS:
            r = client.post(
                "/v1/chat/completions", content=_odd_body(key), headers={"content-type": "application/json"}
            )
            assert r.status_code == 200 and r.text.count("event: ping") == 3, key
            sid = r.headers["x-agentcache-session"]
            assert unquote(sid, errors="surrogatepass") == key
        # the id the client got back (decoded) closes its session, percent-encoded in the path
        r = client.post(f"/agentcache/v1/sessions/{quote(ODD_KEYS[0], safe='')}/close")
        assert r.status_code == 200 and r.json() == {"session_id": ODD_KEYS[0], "closed": True, "generation": 0}
    eventually(lambda: requests_total(state, "/v1/chat/completions", "200") == len(ODD_KEYS))
    assert fail_open(state, "report") is None and fail_open(state, "respond") is None
    assert fail_open(state, "response_start") is None


def test_an_invalid_header_of_ours_is_left_out_not_the_answer(
    live: tuple[ServerThread, Any], monkeypatch: pytest.MonkeyPatch
) -> None:
    """Were a header of ours ever invalid again, uvicorn would refuse the whole response start after the
    upstream answered (it marks the response started first, so there is no second try): such a header is left
    out before the start, the upstream's answer reaches the client, and the header is counted, never silent."""
    server, state = live
    monkeypatch.setattr("agentcache.proxy._core.header_value", lambda text: b"bad\r\nvalue")
    with httpx.Client(base_url=server.url, timeout=30) as client:
        r = client.post("/v1/chat/completions", content=_odd_body("k"), headers=JSON)
    assert r.status_code == 200 and r.text.count("event: ping") == 3
    assert "x-agentcache-session" not in r.headers and r.headers["x-agentcache-generation"] == "0"
    eventually(lambda: requests_total(state, "/v1/chat/completions", "200") == 1)
    assert fail_open(state, "response_header") == 1 and fail_open(state, "response_start") is None


def test_a_response_the_server_refuses_to_start_is_counted_as_an_error(live: tuple[ServerThread, Any]) -> None:
    """The last line of defence: a start the server refuses anyway is counted as ``error``, not as the
    upstream's 200, and logged as ``response_start``."""
    server, state = live
    from agentcache.proxy import _forward

    valid = _forward.UpstreamResponse._valid
    try:
        _forward.UpstreamResponse._valid = lambda self, extra: [(b"x-bad", b"a\r\nb")]  # type: ignore[method-assign]
        with httpx.Client(base_url=server.url, timeout=30) as client, pytest.raises(httpx.RemoteProtocolError):
            client.post("/v1/chat/completions", content=_odd_body("k"), headers=JSON)
    finally:
        _forward.UpstreamResponse._valid = valid  # type: ignore[method-assign]
    eventually(lambda: requests_total(state, "/v1/chat/completions", "error") == 1)
    assert requests_total(state, "/v1/chat/completions", "200") is None
    assert fail_open(state, "response_start") == 1


# --- 8: valid JSON is the upstream's to judge; the body limit holds on every path ---------------------------


@pytest.mark.parametrize("route", PIPELINE)
def test_valid_json_that_is_no_object_is_forwarded_unchanged(route: str) -> None:
    upstream_error = {"error": {"message": "upstream: body must be an object", "type": "invalid_request_error"}}

    async def scenario() -> None:
        async with proxy() as (client, state, fake):
            fake.fault = lambda seen: httpx.Response(400, json=upstream_error)
            for raw in (b"[1,2]", b'"x"', b"5", b"null", b" [ 1 , 2 ] "):
                r = await client.post(route, content=raw, headers={**A, "content-type": "application/json"})
                assert r.status_code == 400 and r.json() == upstream_error
                assert "x-agentcache-error" not in r.headers  # the upstream's answer, not ours
                assert fake.requests[-1].body == raw
            assert len(fake.requests) == 5
            assert requests_total(state, route, "400") == 5
            assert fail_open(state, "prepare") is None

    run(scenario())


@pytest.mark.parametrize(("upstream", "style"), [("anthropic", "anthropic"), ("openai", "openai")])
def test_body_limit_holds_on_relayed_paths(upstream: str, style: str) -> None:
    async def scenario() -> None:
        async with proxy(upstream=upstream, max_body_bytes=1000) as (client, state, fake):
            big = b"x" * 1001

            async def chunks() -> AsyncIterator[bytes]:  # no content-length: counted while streaming
                for _ in range(12):
                    yield b"y" * 250

            for content in (big, chunks()):
                r = await client.post("/v1/files", content=content)
                assert r.status_code == 413 and r.headers["x-agentcache-error"] == "1"
                doc = r.json()
                if style == "anthropic":
                    assert doc["type"] == "error" and doc["error"]["type"] == "request_too_large"
                else:
                    assert doc["error"]["code"] == "request_too_large"
            assert fake.requests == []  # no complete oversized request reached the upstream
            ok = await client.post("/v1/files", content=b"z" * 1000)
            assert ok.status_code == 200 and ok.json() == {"echo": "/v1/files", "method": "POST", "bytes": 1000}
            assert requests_total(state, "passthrough", "413") == 2
            assert requests_total(state, "passthrough", "200") == 1

    run(scenario())


# --- 9: every request counted as what it was ---------------------------------------------------------------


def test_own_errors_are_counted() -> None:
    async def scenario() -> None:
        async with proxy(max_body_bytes=2000) as (client, state, fake):
            r = await client.post("/v1/messages", content=b'{"model": "x", "messages": [', headers=A)
            assert r.status_code == 400
            r = await client.post("/v1/chat/completions", content=b"{" * 10, headers=A)
            assert r.status_code == 400
            big = json.dumps(anthropic_body(conversation(1))).encode()
            r = await client.post("/v1/messages", content=big, headers=A)
            assert r.status_code == 413
            assert requests_total(state, "/v1/messages", "400", "anthropic") == 1
            assert requests_total(state, "/v1/chat/completions", "400", "openai") == 1
            assert requests_total(state, "/v1/messages", "413", "anthropic") == 1
            assert fake.requests == []

    run(scenario())


def test_an_own_bug_before_the_response_is_a_counted_500_in_the_callers_format() -> None:
    async def scenario() -> None:
        async with proxy() as (client, state, fake):

            def bug(seen: Any) -> None:
                raise RuntimeError("a bug of ours")

            fake.fault = bug
            r = await client.post("/v1/chat/completions", json=chat_body([{"role": "user", "content": "hi"}]))
            assert r.status_code == 500 and r.headers["x-agentcache-error"] == "1"
            assert r.json()["error"]["type"] == "server_error"
            assert requests_total(state, "/v1/chat/completions", "500") == 1
            assert fail_open(state, "unhandled") == 1
            fake.fault = None  # and the proxy goes on serving
            r = await client.post("/v1/chat/completions", json=chat_body([{"role": "user", "content": "hi"}]))
            assert r.status_code == 200

    with pytest.raises(RuntimeError, match="a bug of ours"):  # starlette re-raises after answering: logged
        run(scenario())


@pytest.mark.parametrize("key", [["a", "b"], {"k": 1}, 7])
def test_a_non_string_prompt_cache_key_is_reported_and_closed(key: Any) -> None:
    async def scenario() -> None:
        async with proxy() as (client, state, _):
            body = chat_body([{"role": "user", "content": "I want to change my flight."}], prompt_cache_key=key)
            r = await client.post("/v1/chat/completions", json=body, headers={**A, "x-agentcache-close": "true"})
            assert r.status_code == 200
            sid = unquote(r.headers["x-agentcache-session"])
            assert fail_open(state, "report") is None
            doc = (await client.get("/agentcache/v1/report", headers=A)).json()
            assert [s["session"].split("/", 1)[1] for s in doc["sessions"]] == [sid]
            assert doc["totals"]["reported"]["requests"] == 1
            closed = await client.post(f"/agentcache/v1/sessions/{quote(sid, safe='')}/close", headers=A)
            assert closed.status_code == 404  # x-agentcache-close already closed it
            assert requests_total(state, "/v1/chat/completions", "200") == 1

    run(scenario())


def test_the_simulator_partitions_by_any_key_value() -> None:
    assert partition_key(None) == "" and partition_key("k") == "k"
    assert partition_key(["a", "b"]) == '["a", "b"]' and partition_key({"b": 1, "a": 2}) == '{"a": 2, "b": 1}'
    assert partition_key(["a"]) != partition_key("a")


# --- 7: admin scope and agentcache's namespace -------------------------------------------------------------


def test_the_report_shows_the_callers_own_tenant() -> None:
    async def scenario() -> None:
        async with proxy(admin_token="s3cret") as (client, state, _):
            for n in (1, 3):
                await client.post("/v1/messages", json=anthropic_body(conversation(n)), headers=A)
            await client.post("/v1/messages", json=anthropic_body(conversation(1, run=1)), headers=B)
            mine, theirs = tenant_of(A, state.config.tenant_salt), tenant_of(B, state.config.tenant_salt)
            r = await client.get("/agentcache/v1/report", headers=A)
            assert r.status_code == 200 and r.headers["x-agentcache-tenant"] == mine
            assert {s["session"].split("/")[0] for s in r.json()["sessions"]} == {mine}
            assert r.json()["totals"]["reported"]["requests"] == 2
            r = await client.get("/agentcache/v1/report", headers=A, params={"tenant": mine})
            assert r.status_code == 200 and r.json()["totals"]["reported"]["requests"] == 2
            # another tenant's view, or all of them, need the admin token
            r = await client.get("/agentcache/v1/report", headers=A, params={"tenant": theirs})
            assert r.status_code == 403 and r.json()["error"]["type"] == "permission_error"
            r = await client.get("/agentcache/v1/report", headers={**A, "x-agentcache-admin-token": "nope"})
            assert r.status_code == 401
            r = await client.get("/agentcache/v1/report", headers=ADMIN)
            assert r.headers["x-agentcache-tenant"] == "*"
            assert {s["session"].split("/")[0] for s in r.json()["sessions"]} == {mine, theirs}
            r = await client.get(
                "/agentcache/v1/report", headers={"authorization": "Bearer s3cret"}, params={"tenant": theirs}
            )
            assert r.status_code == 200 and r.json()["totals"]["reported"]["requests"] == 1
            # a caller without a key is the anonymous tenant: nothing of A's or B's
            r = await client.get("/agentcache/v1/report")
            assert r.headers["x-agentcache-tenant"] == "anonymous" and r.json()["sessions"] == []
            # /metrics: the token is required once one is configured
            assert (await client.get("/metrics", headers=A)).status_code == 401
            assert (await client.get("/metrics", headers=ADMIN)).status_code == 200
            assert requests_total(state, "agentcache", "401") == 2
            assert requests_total(state, "agentcache", "403") == 1

    run(scenario())


def test_without_an_admin_token_no_caller_sees_other_tenants() -> None:
    async def scenario() -> None:
        async with proxy() as (client, state, _):
            await client.post("/v1/messages", json=anthropic_body(conversation(1)), headers=B)
            theirs = tenant_of(B, state.config.tenant_salt)
            r = await client.get("/agentcache/v1/report", headers=A, params={"tenant": theirs})
            assert r.status_code == 403
            r = await client.get("/agentcache/v1/report", headers=A)
            assert r.status_code == 200 and r.json()["sessions"] == []
            assert (await client.get("/metrics")).status_code == 200  # loopback bind, no token configured

    run(scenario())


def test_agentcache_namespace_is_never_relayed() -> None:
    async def scenario() -> None:
        async with proxy() as (client, state, fake):
            r = await client.get("/agentcache/v1/sessions/abc/close", headers=A)
            assert r.status_code == 405 and r.headers["allow"] == "POST"
            assert r.json()["type"] == "error"  # Anthropic's format: an Anthropic upstream and key
            r = await client.post("/agentcache/v1/nothing", headers={"authorization": "Bearer sk-o"})
            assert r.status_code == 404 and r.json()["error"]["type"] == "not_found_error"
            r = await client.delete("/agentcache/v1/report", headers=A)
            assert r.status_code == 405 and "GET" in r.headers["allow"]
            r = await client.post("/metrics", headers=A)
            assert r.status_code == 405
            assert (await client.get("/agentcache/v2/x", headers=A)).status_code == 404
            assert (await client.get("/agentcache", headers=A)).headers["location"] == "/agentcache/"  # the page
            page = await client.get("/agentcache/", headers=A)  # the live page
            assert page.status_code == 200 and page.headers["content-type"].startswith("text/html")
            assert fake.requests == []  # nothing went upstream with the caller's credentials
            assert requests_total(state, "agentcache", "405") == 3
            assert requests_total(state, "agentcache", "404") == 2

    run(scenario())


def test_a_session_id_with_a_slash_is_closable() -> None:
    async def scenario() -> None:
        async with proxy() as (client, _, fake):
            for sid in ("a/b", "team/agent/7"):
                body = anthropic_body(conversation(1))
                r = await client.post("/v1/messages", json=body, headers={**A, "x-agentcache-session": sid})
                assert r.headers["x-agentcache-session"] == header_value(sid).decode() == sid
                r = await client.post(f"/agentcache/v1/sessions/{quote(sid, safe='')}/close", headers=A)
                assert r.status_code == 200 and r.json()["session_id"] == sid and r.json()["closed"] is True
            assert [s.path for s in fake.requests] == ["/v1/messages", "/v1/messages"]

    run(scenario())


def test_the_live_report_names_each_tenants_models() -> None:
    async def scenario() -> None:
        async with proxy(admin_token="s3cret") as (client, _state, _):
            await client.post("/v1/messages", json=anthropic_body(conversation(1)), headers=A)
            await client.post(
                "/v1/messages", json={**anthropic_body(conversation(1, run=1)), "model": "claude-nova-9"}, headers=B
            )
            mine = (await client.get("/agentcache/v1/report", headers=A)).json()["models"]
            assert [(m["model"], m["known"], m["requests"]) for m in mine] == [("claude-opus-4-8", True, 1)]
            every = (await client.get("/agentcache/v1/report", headers=ADMIN)).json()["models"]
            assert {(m["model"], m["known"], m["priced_as"]) for m in every} == {
                ("claude-opus-4-8", True, "claude-opus-4-8"),
                ("claude-nova-9", False, "claude-opus-4-8"),
            }

    asyncio.run(scenario())


def test_every_field_of_a_tenant_s_report_is_its_own() -> None:
    """Issue 24, item 4: a tenant's report is, field by field, the report of a proxy that saw only its traffic; a
    tenant with no traffic reads nothing of the others' (not the model name of another's fine-tune)."""
    secret = "acme-secret-finetune-7"
    sid, sid2 = {"x-agentcache-session": "a1"}, {"x-agentcache-session": "a2"}

    async def mine(client: httpx.AsyncClient) -> None:
        for n in (1, 3):
            await client.post("/v1/messages", json=anthropic_body(conversation(n)), headers={**A, **sid})
        await client.post("/v1/chat/completions", json=chat_body(conversation(1, run=2)), headers={**A, **sid2})

    async def scenario() -> None:
        async with proxy() as (client, _, _):
            await mine(client)
            alone = (await client.get("/agentcache/v1/report", headers=A)).json()
        async with proxy(admin_token="s3cret") as (client, state, _):
            await client.post(
                "/v1/messages", json={**anthropic_body(conversation(2, run=1)), "model": secret}, headers=B
            )
            await mine(client)
            await client.post("/v1/chat/completions", json=chat_body(conversation(2), model=secret), headers=B)
            mixed = (await client.get("/agentcache/v1/report", headers=A)).json()
            assert mixed == alone
            assert mixed["provider"] == "mixed" and mixed["model"] == "mixed"  # its own two: anthropic and openai
            empty = await client.get("/agentcache/v1/report", headers={"x-api-key": "sk-ant-nobody"})
            doc = empty.json()
            assert secret not in empty.text and doc["provider"] == doc["model"] == "none"
            assert doc["sessions"] == doc["breaks"] == doc["misses"] == doc["models"] == []
            assert all(arm["requests"] == 0 for arm in doc["totals"].values())
            theirs = tenant_of(B, state.config.tenant_salt)
            b = (await client.get("/agentcache/v1/report", headers=ADMIN, params={"tenant": theirs})).json()
            assert b["model"] == secret and b["provider"] == "mixed"
            assert secret not in (await client.get("/agentcache/v1/report", headers=A)).text

    run(scenario())


def test_a_turn_whose_planned_body_cannot_be_written_commits_the_original() -> None:
    """Issue 24, item 8: a top-level string agentcache must encode again holds a lone surrogate (valid JSON escape,
    no UTF-8): the planned body (with agentcache's routing key) cannot be written, so the client's bytes go upstream,
    and the session, the report and the next turn know that body, not the planned one."""

    async def scenario() -> None:
        async with proxy(upstream="openai") as (client, state, fake):
            sid = {"authorization": "Bearer sk-o", "x-agentcache-session": "s", **JSON}
            body = chat_body(conversation(1), user="u\ud800")
            raw = json.dumps(body).encode()
            r = await client.post("/v1/chat/completions", content=raw, headers=sid)
            assert r.status_code == 200 and fake.requests[-1].body == raw  # fail open: the client's bytes
            sess = state.store.get(tenant_of({"authorization": "Bearer sk-o"}, state.config.tenant_salt), "s")
            assert sess is not None and sess.turns == 1  # committed ...
            assert sess.pipeline.sent_body == body and sess.pipeline.sent.cache_key is None  # ... as sent
            line = state.report.to_dict()["sessions"][0]
            assert line["requests"] == 1
            # the next turn: planned from what went out, so the routing key it now gets is no "repair"
            nxt = chat_body(conversation(3))
            r = await client.post("/v1/chat/completions", json=nxt, headers=sid)
            assert r.status_code == 200 and "prompt_cache_key" in fake.requests[-1].json()

    run(scenario())


def test_one_date_header_the_upstreams_or_the_proxys_own() -> None:
    """Under uvicorn as ``agentcache proxy`` runs it: a relayed response carries the upstream's headers as sent
    (one ``date``, the upstream's; issue 23 found two), and the proxy's own answers one ``date`` of their own."""
    from tests.clients.fake_upstream import FakeUpstream as ScriptedUpstream

    stamp = "Tue, 01 Dec 2026 10:00:00 GMT"

    async def dated(scope: Any, receive: Any, send: Any) -> None:
        async def with_date(message: Any) -> None:
            if message["type"] == "http.response.start":
                headers = [(k, v) for k, v in message["headers"] if k.lower() != b"date"]
                message = {**message, "headers": [*headers, (b"date", stamp.encode())]}
            await send(message)

        await fake.app(scope, receive, with_date)

    fake = ScriptedUpstream()
    with ServerThread(dated, date_header=False) as upstream:  # its one date: the stamp
        config = ProxyConfig(upstream=upstream.url)
        app = create_app(config, settings=settings())
        with ServerThread(app, proxy=config) as server, httpx.Client(base_url=server.url, timeout=30) as client:
            body = {"model": "claude-opus-4-8", "max_tokens": 8, "messages": [{"role": "user", "content": "hi"}]}
            for stream in (False, True):
                r = client.post("/v1/messages", json={**body, "stream": stream}, headers={"x-api-key": "sk-ant-x"})
                assert r.status_code == 200 and r.headers.get_list("date") == [stamp], stream
                assert len(r.headers.get_list("server")) <= 1
            own = client.get("/agentcache/v1/health")
            assert own.status_code == 200 and len(own.headers.get_list("date")) == 1
            assert own.headers["date"].endswith(" GMT")


def test_a_keyless_browser_of_a_loopback_proxy_without_a_token_sees_every_tenant() -> None:
    """The live page's first use: ``agentcache proxy`` on loopback with no admin token, agents sending their keys, a
    browser sending none. The browser is the person at the machine and sees every tenant (as ``/metrics`` is served
    there); a caller with a key still sees only its own; bound beyond loopback, or with a token configured, the
    keyless caller is the ``anonymous`` tenant and sees nothing of the others'."""

    async def scenario(expect_all: bool, **config: Any) -> None:
        async with proxy(**config) as (client, state, _):
            await client.post("/v1/messages", json=anthropic_body(conversation(1)), headers=A)
            await client.post("/v1/messages", json=anthropic_body(conversation(1, run=1)), headers=B)
            mine = tenant_of(A, state.config.tenant_salt)
            r = await client.get("/agentcache/v1/report")
            seen = {s["session"].split("/")[0] for s in r.json()["sessions"]}
            page = await client.get("/agentcache/", params={"fragment": "1"})
            if expect_all:
                theirs = tenant_of(B, state.config.tenant_salt)
                assert r.headers["x-agentcache-tenant"] == "*" and seen == {mine, theirs}
                assert page.status_code == 200 and page.headers["x-agentcache-tenant"] == "*"
            else:
                assert r.headers["x-agentcache-tenant"] == "anonymous" and seen == set()
            own = await client.get("/agentcache/v1/report", headers=A)
            assert {s["session"].split("/")[0] for s in own.json()["sessions"]} == {mine}

    run(scenario(True))
    run(scenario(False, host="0.0.0.0"))
    run(scenario(False, admin_token="s3cret"))
