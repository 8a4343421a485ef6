"""Log lines a person can read (issue 22): the console form is short (no enum reprs, no float noise), the JSON
form keeps the whole event; every refusal and every upstream failure is logged once with its reason; no API key
or prompt text at info."""

from __future__ import annotations

import asyncio
import json
import re
import socket
from enum import Enum
from typing import Any

import httpx
import pytest

from agentcache._log import capture_logs
from agentcache._log_output import configure_logging
from agentcache._logview import readable, short_form
from agentcache.model._types import TargetKind
from agentcache.proxy import create_app, load_proxy_config
from agentcache.proxy._errors import failure_reason
from tests.test_proxy_support import ANTHROPIC_KEY, FakeUpstream, anthropic_body, conversation, proxy

HEADERS = {"x-api-key": ANTHROPIC_KEY, "anthropic-version": "2023-06-01"}
PROMPT = "the secret prompt text 7f3a"


def _two_turns(fmt: str, capsys: pytest.CaptureFixture[str]) -> list[str]:
    """The info lines of two turns of one conversation (the second streamed) in ``fmt``."""

    async def scenario() -> None:
        async with proxy() as (client, _, _):
            first, second = conversation(1), conversation(3)
            first[0]["content"][0]["text"] = second[0]["content"][0]["text"] = PROMPT
            await client.post("/v1/messages", json=anthropic_body(first), headers=HEADERS)
            await client.post("/v1/messages", json=anthropic_body(second, stream=True), headers=HEADERS)

    configure_logging(fmt, "info")
    asyncio.run(scenario())
    return capsys.readouterr().err.splitlines()


def test_console_request_lines_are_short_and_plain(capsys: pytest.CaptureFixture[str]) -> None:
    lines = [ln for ln in _two_turns("console", capsys) if "proxy.request" in ln]
    assert len(lines) == 2
    for line in lines:
        assert len(line) < 300, line
        assert "<" not in line and "{" not in line and "None" not in line, line  # no reprs, no dicts
        assert "status=200" in line and "outcome=complete" in line and "session=s-" in line, line
    assert "turn=1" in lines[1] and "cache_read=" in lines[1]
    cost = lines[1].split("cost_usd=")[1].split()[0]
    assert len(cost.replace("0.", "", 1).lstrip("0")) <= 4, cost  # four significant digits at most


def test_json_lines_keep_the_whole_event(capsys: pytest.CaptureFixture[str]) -> None:
    events = [json.loads(ln) for ln in _two_turns("json", capsys)]
    request = [e for e in events if e["event"] == "proxy.request"][1]
    assert request["session_signal"]["turn"] == 1 and request["prefix_identity"]["blocks"] > 0
    assert request["usage"]["cache_read_tokens"] > 0 and request["reuse_boundary"]["matched_blocks"] > 0


@pytest.mark.parametrize("fmt", ["console", "json"])
def test_no_api_key_or_prompt_text_at_info(fmt: str, capsys: pytest.CaptureFixture[str]) -> None:
    text = "\n".join(_two_turns(fmt, capsys))
    assert "proxy.request" in text
    assert ANTHROPIC_KEY not in text and PROMPT not in text


def test_readable_values() -> None:
    class Kind(Enum):
        A = "anthropic"

    assert readable(TargetKind.ANTHROPIC) == "anthropic" and readable(Kind.A) == "anthropic"
    assert readable(0.00017500000000000003) == "0.000175" and readable(67.991234) == "67.99"
    assert readable(123456.7) == "123457" and readable(None) == "" and readable([]) == ""
    assert readable(["tools[13]", "system"]) == "tools[13],system" and readable(True) == "true"
    event = {"event": "other.event", "level": "info", "nested": {"kind": TargetKind.OPENAI, "n": None}, "x": 1.0}
    assert short_form(None, "info", event) == {
        "level": "info",
        "event": "other.event",
        "nested.kind": "openai",
        "x": "1",
    }


def _refusals(logs: list[dict[str, Any]]) -> list[tuple[int, str]]:
    return [(e["status"], e["reason"]) for e in logs if e["event"] == "proxy.refused"]


def test_every_refusal_is_logged_once_with_its_reason() -> None:
    async def scenario() -> None:
        async with proxy(max_body_bytes=4096) as (client, _, _):
            r = await client.post("/v1/messages", content=b"{not json", headers=HEADERS)
            assert r.status_code == 400
            r = await client.post("/v1/chat/completions", content=b"x" * 5000)
            assert r.status_code == 413
            r = await client.get("/agentcache/v1/nothing")
            assert r.status_code == 404

    with capture_logs() as logs:
        asyncio.run(scenario())
    assert _refusals(logs) == [
        (400, "request body is not valid JSON: Expecting property name enclosed in double quotes: line 1 column 2 "
         "(char 1)"),
        (413, "request body exceeds 4096 bytes"),
        (404, "no agentcache endpoint at /agentcache/v1/nothing"),
    ]  # fmt: skip


def _closed_port() -> int:
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        port: int = s.getsockname()[1]
    return port  # nothing listens there once the socket is closed


def _through(upstream: str, transport: httpx.AsyncBaseTransport | None = None) -> tuple[httpx.Response, list[Any]]:
    """One Anthropic request through a proxy whose upstream is ``upstream``; the response and the log events."""

    async def scenario() -> httpx.Response:
        app = create_app(load_proxy_config(upstream=upstream), transport=transport)
        client = httpx.AsyncClient(transport=httpx.ASGITransport(app=app), base_url="http://proxy")
        async with app.state.proxy.running(), client:
            return await client.post("/v1/messages", json=anthropic_body(conversation(1)), headers=HEADERS)

    with capture_logs() as logs:
        response = asyncio.run(scenario())
    return response, logs


def _upstream_errors(logs: list[dict[str, Any]]) -> list[tuple[int, str, str]]:
    return [(e["status"], e["upstream"], e["reason"]) for e in logs if e["event"] == "proxy.upstream_error"]


def test_an_unreachable_upstream_is_named_with_the_reason() -> None:
    port = _closed_port()
    response, logs = _through(f"http://127.0.0.1:{port}")
    assert response.status_code == 502
    assert response.json()["error"]["message"] == "upstream unavailable (connection refused)"
    assert _upstream_errors(logs) == [(502, f"http://127.0.0.1:{port}", "connection refused")]


def test_a_name_that_does_not_resolve_says_dns() -> None:
    response, logs = _through("http://agentcache-test.invalid")  # .invalid never resolves (RFC 6761)
    assert response.status_code == 502
    [(status, upstream, reason)] = _upstream_errors(logs)
    assert (status, upstream) == (502, "http://agentcache-test.invalid") and reason.startswith("DNS lookup failed ("), (
        reason
    )


def test_an_upstream_timeout_says_which_timeout() -> None:
    def slow(seen: Any) -> None:
        raise httpx.ReadTimeout("timed out")

    fake = FakeUpstream(fault=slow)
    response, logs = _through("http://127.0.0.1:9", transport=fake.transport())
    assert response.status_code == 504 and response.json()["error"]["message"] == "upstream timed out (read timeout)"
    assert _upstream_errors(logs) == [(504, "http://127.0.0.1:9", "read timeout")]


def test_failure_reason_reads_the_cause_chain() -> None:
    reset = httpx.RemoteProtocolError("peer closed")
    reset.__cause__ = ConnectionResetError(104, "Connection reset by peer")
    assert failure_reason(reset) == "connection reset by the upstream"
    assert failure_reason(httpx.PoolTimeout("x")) == "pool timeout: no free upstream connection"
    assert failure_reason(httpx.RemoteProtocolError("Server disconnected\nwithout sending a response.")) == (
        "RemoteProtocolError: Server disconnected without sending a response."
    )


def test_the_start_line_names_only_the_settings_that_differ(
    monkeypatch: pytest.MonkeyPatch, capsys: pytest.CaptureFixture[str]
) -> None:
    import uvicorn

    from agentcache._config import load_settings
    from agentcache.proxy import serve

    monkeypatch.setattr(uvicorn.Server, "run", lambda self, sockets=None: None)
    configure_logging("console", "info")
    serve(load_proxy_config(port=0, upstream="http://127.0.0.1:9"), load_settings(coalesce=False, markers="own"))
    [start] = [ln for ln in capsys.readouterr().err.splitlines() if "proxy.start" in ln]
    port = re.search(r" port=(\d+) ", start)
    assert port is not None, start
    assert start.endswith(
        " upstream=http://127.0.0.1:9 engine=none store=memory"
        f" live_page=http://127.0.0.1:{port.group(1)}/agentcache/ settings.markers=own settings.coalesce=false"
    )


def test_the_line_carries_a_subagents_scope_wide_miss(capsys: pytest.CaptureFixture[str]) -> None:
    """A subagent's first call whose tools are its parent's less the last: it shares the tools the parent sent but
        ends before the parent's marked entry. No break (its session had sent nothing), but a miss on what agentcache
        sent, which the live report finds in the scope-wide cache: the log line carries it, as the report has it. Its
    sibling reads the whole shared prefix from the helper's entries: no miss."""

    async def scenario() -> list[Any]:
        async with proxy() as (client, state, _):
            msgs = conversation(3)
            main = {**HEADERS, "x-agentcache-session": "main"}
            for n in (1, 3):
                await client.post("/v1/messages", json=anthropic_body(msgs[:n]), headers=main)
            for run, name in ((1, "helper"), (2, "sibling")):  # the sibling reads the helper's entries
                body = anthropic_body(conversation(1, run=run))
                body["tools"] = body["tools"][:-1]
                body["system"] = "You are a helper subagent. " + str(body["system"])
                sub = {**HEADERS, "x-agentcache-session": name, "x-agentcache-parent": "main"}
                await client.post("/v1/messages", json=body, headers=sub)
            return [m for m in state.report.report().misses if m.arm == "agentcache"]

    configure_logging("json", "info")
    (miss,) = asyncio.run(scenario())
    events = [json.loads(ln) for ln in capsys.readouterr().err.splitlines()]
    lines = [e for e in events if e["event"] == "proxy.request"]
    assert [ln.get("miss") for ln in lines[:2]] == [None, None]
    helper = lines[2]
    assert helper["session_signal"]["session_id"] == "helper" and helper["reuse_boundary"]["cause"] is None
    assert miss.session.endswith("/helper") and miss.request == 0
    assert helper["miss"] == {"cause": "markers.missing", "tokens_lost": miss.tokens_lost, "where": miss.where}
    assert miss.tokens_lost > 1000 and miss.where == "tools[12]"
    assert lines[3]["session_signal"]["session_id"] == "sibling" and "miss" not in lines[3]  # docs/policies.md
    console = short_form(None, "info", helper)
    assert console["miss"] == "markers.missing" and console["miss_tokens"] == f"{miss.tokens_lost:,}".replace(",", "")
