"""``agentcache proxy --record DIR`` (issue 21, item 5) against the fake upstream: one line per pipeline request in
the audit's JSONL format, read back by the loader and by ``agentcache audit``; rotation and the total cap; no
credentials written; a recorder that fails, or falls behind, never costs a request."""

from __future__ import annotations

import asyncio
import errno
import json
import os
import threading
import time
from pathlib import Path
from typing import Any

import httpx
import pytest
from typer.testing import CliRunner

from agentcache import _cli as cli
from agentcache._log import capture_logs
from agentcache.loaders import load
from agentcache.loaders._paths import load_paths
from agentcache.model._usage import normalize_usage
from agentcache.proxy import ProxyConfig, ProxyState, _record_files
from agentcache.proxy._caller import tenant_of
from tests.conftest import policy
from tests.test_proxy_support import ANTHROPIC_KEY, anthropic_body, chat_body, conversation, eventually, proxy

ROUTES = {
    "anthropic.messages": "/v1/messages",
    "openai.chat": "/v1/chat/completions",
    "openai.responses": "/v1/responses",
}
IDS = {"anthropic.messages": "msg_1", "openai.chat": "chatcmpl-1", "openai.responses": "resp_1"}


def body_for(api: str, n: int, stream: bool = False, run: int = 0) -> dict[str, Any]:
    """A request of ``api`` holding the first ``n`` messages of a real conversation."""
    messages = conversation(n, run)
    if api == "anthropic.messages":
        return anthropic_body(messages, stream=stream)
    if api == "openai.chat":
        return chat_body(messages, stream=stream)
    items = [{"role": m["role"], "content": m["content"][0]["text"]} for m in messages]
    return {"model": "gpt-4o", "instructions": policy(), "input": items, "stream": stream}


def headers_for(session: str, parent: str | None = None) -> dict[str, str]:
    out = {"x-api-key": ANTHROPIC_KEY, "x-agentcache-session": session}
    return {**out, "x-agentcache-parent": parent} if parent else out


def count(state: ProxyState, outcome: str) -> float:
    """``agentcache_proxy_record_lines_total{outcome}``."""
    value = state.metrics.registry.get_sample_value("agentcache_proxy_record_lines_total", {"outcome": outcome})
    return value or 0.0


def lines_of(directory: Path) -> list[dict[str, Any]]:
    return [json.loads(ln) for f in sorted(directory.iterdir()) for ln in f.read_text().splitlines()]


# (session, parent, messages): two turns of one conversation, then its subagent's first
SCRIPT = (("conv", None, 1), ("conv", None, 3), ("conv/sub", "conv", 1))


@pytest.mark.parametrize("stream", [False, True], ids=["whole", "stream"])
@pytest.mark.parametrize("api", list(ROUTES))
def test_each_request_is_one_line_the_loader_reads_back(tmp_path: Path, api: str, stream: bool) -> None:
    """Body as the client sent it (key order too) and as forwarded, the session and parent the proxy resolved, the
    usage the upstream reported (the tap's, for streams: equal to what the request's log line says), the response
    id, status, timings, route, when it arrived."""
    sent: list[dict[str, Any]] = []

    async def scenario() -> tuple[ProxyState, Any]:
        async with proxy(record_dir=tmp_path / "rec") as (client, state, fake):
            for sid, parent, n in SCRIPT:
                body = body_for(api, n, stream, run=1 if parent else 0)
                r = await client.post(ROUTES[api], json=body, headers=headers_for(sid, parent))
                assert r.status_code == 200, r.text
                sent.append(body)
        return state, fake

    t0 = time.time()
    with capture_logs() as logs:
        state, fake = asyncio.run(scenario())
    t1 = time.time()
    (path,) = (tmp_path / "rec").iterdir()
    result = load(path)
    assert result.format == "jsonl" and result.errors == []
    logged = [line["usage"] for line in logs if line["event"] == "proxy.request"]
    lines = lines_of(tmp_path / "rec")
    rows = zip(result.records, lines, SCRIPT, sent, fake.requests, logged, strict=True)
    for rec, line, (sid, parent, _), body, forwarded, usage in rows:
        assert (rec.session, rec.meta.get("parent")) == (sid, parent or None)
        assert rec.meta["recorded_by"].startswith("agentcache-proxy/")
        assert rec.body == body and list(rec.body) == list(body)
        assert line["sent"] == forwarded.json() and line["sent"] != body  # agentcache's markers / key
        assert (rec.api, line["route"], line["upstream"]) == (
            api,
            ROUTES[api],
            "https://api.anthropic.com" + ROUTES[api],
        )
        assert (line["status"], line["outcome"], line["tenant"]) == (
            200,
            "complete",
            tenant_of(headers_for(sid), "agentcache-tenant-v1"),
        )
        assert rec.at is not None and t0 <= rec.at <= t1
        assert 0 <= line["timings"]["first_byte_s"] <= line["timings"]["total_s"] <= t1 - t0
        assert rec.response is not None and rec.usage == rec.response["usage"]
        assert normalize_usage(rec.response, api).to_dict() == usage
        assert rec.response.get("id") == (
            None if api == "openai.chat" and stream else IDS[api]
        )  # Chat chunks: no id kept
    second = normalize_usage(result.records[1].response, api)
    assert second.cache_read_tokens > 0 and second.output_tokens == 3  # the fake's cache held the first turn
    assert (count(state, "written"), count(state, "failed"), count(state, "dropped")) == (3, 0, 0)


def _audit(*paths: Path) -> dict[str, Any]:
    result = CliRunner().invoke(cli.app, ["audit", *map(str, paths), "--json"], catch_exceptions=False)
    assert result.exit_code == 0, result.stderr
    doc: dict[str, Any] = json.loads(result.stdout)
    return doc


def test_audit_of_the_recording_equals_the_audit_of_the_traffic(tmp_path: Path) -> None:
    """A conversation whose client edits its system prompt on turn 3, and a subagent: ``agentcache audit`` on the
    recording gives what auditing the same requests (as the client sent them, with their responses) gives."""
    traffic: list[dict[str, Any]] = []

    async def scenario() -> None:
        async with proxy(record_dir=tmp_path / "rec") as (client, _state, _fake):
            for sid, parent, n in (*SCRIPT, ("conv", None, 5), ("conv/sub", "conv", 3), ("conv", None, 7)):
                body = body_for("anthropic.messages", n, run=1 if parent else 0)
                if sid == "conv" and n >= 5:
                    body["system"] = policy() + " Today is Tuesday."
                at = time.time()
                r = await client.post("/v1/messages", json=body, headers=headers_for(sid, parent))
                line = {"session": sid, "api": "anthropic.messages", "at": at, "body": body, "response": r.json()}
                traffic.append({**line, "parent": parent} if parent else line)

    asyncio.run(scenario())
    offline = tmp_path / "traffic.jsonl"
    offline.write_text("".join(json.dumps(line) + "\n" for line in traffic))
    recorded = _audit(tmp_path / "rec")  # the directory, as a user runs it
    assert recorded["totals"]["as_sent"]["requests"] == len(traffic) == 6
    assert recorded["totals"]["reported"]["cache_read_tokens"] > 0
    assert {(b["session"], b["request"], b["cause"]) for b in recorded["breaks"]} == {("conv", 2, "system.changed")}
    assert {s["session"] for s in recorded["sessions"]} == {"conv", "conv/sub"}
    assert json.loads(json.dumps(_audit(offline)).replace('"traffic/', '"')) == recorded


def test_rotation_keeps_one_session_across_files_and_the_total_under_its_cap(tmp_path: Path) -> None:
    config = {"record_dir": tmp_path, "record_max_mb": 0.1, "record_max_total_mb": 0.25}  # lines: 30-52 KB

    async def scenario() -> ProxyState:
        async with proxy(**config) as (client, state, _fake):
            for n in range(1, 24, 2):
                r = await client.post("/v1/messages", json=body_for("anthropic.messages", n), headers=headers_for("c"))
                assert r.status_code == 200
        return state

    state = asyncio.run(scenario())
    files = sorted(tmp_path.iterdir())
    sizes = [f.stat().st_size for f in files]
    lines = [f.read_text().splitlines() for f in files]
    assert len(files) >= 3 and sum(sizes) <= 0.25 * 2**20
    assert all(size <= 0.1 * 2**20 or len(ls) == 1 for size, ls in zip(sizes, lines, strict=True))
    assert count(state, "written") == 12
    records = [r for f in files for r in load(f).records]
    assert {r.session for r in records} == {"c"}  # one session, whatever file it is in
    assert load_paths([tmp_path]).records == records  # the directory, as `agentcache audit DIR` reads it
    kept = [len(r.body["messages"]) for r in records]
    assert kept == list(range(23 - 2 * (len(kept) - 1), 24, 2))  # the newest requests, in order: the oldest went
    assert all(f.name.startswith("agentcache-proxy-") and f.suffix == ".jsonl" for f in files)


def test_no_api_key_or_auth_header_is_written(tmp_path: Path) -> None:
    secrets = {
        "x-api-key": "sk-ant-SECRET-ONE",
        "authorization": "Bearer sk-SECRET-TWO",
        "api-key": "SECRET-THREE",
        "proxy-authorization": "Basic U0VDUkVULUZPVVI=",
        "cookie": "session=SECRET-FIVE",
        "x-goog-api-key": "SECRET-SIX",
        "anthropic-beta": "prompt-caching-2024-07-31",
        "anthropic-version": "2023-06-01",
    }

    async def scenario() -> None:
        async with proxy(record_dir=tmp_path / "rec") as (client, _state, _fake):
            for stream in (False, True):
                body = body_for("anthropic.messages", 3, stream)
                r = await client.post("/v1/messages?key=SECRET-SEVEN", json=body, headers=secrets)
                assert r.status_code == 200

    asyncio.run(scenario())
    directory = tmp_path / "rec"
    (path,) = directory.iterdir()
    raw = path.read_bytes()
    for needle in (b"SECRET", b"U0VDUkVULUZPVVI", b"sk-ant"):
        assert needle not in raw
    for line in lines_of(directory):
        assert line["headers"] == {
            "anthropic-beta": "prompt-caching-2024-07-31",
            "anthropic-version": "2023-06-01",
            "user-agent": f"python-httpx/{httpx.__version__}",
        }
        assert line["upstream"] == "https://api.anthropic.com/v1/messages"  # no query string
    assert (directory.stat().st_mode & 0o777, path.stat().st_mode & 0o777) == (0o700, 0o600)


def test_an_unwritable_directory_costs_no_request_and_is_counted_and_logged_once(tmp_path: Path) -> None:
    blocker = tmp_path / "a-file"
    blocker.write_text("not a directory")  # mkdir under it fails, root or not

    async def scenario() -> ProxyState:
        async with proxy(record_dir=blocker / "rec") as (client, state, fake):
            for n in (1, 3, 5, 7):
                r = await client.post("/v1/messages", json=body_for("anthropic.messages", n), headers=headers_for("c"))
                assert r.status_code == 200 and r.json()["content"][0]["text"] == "Hello there."
            eventually(lambda: count(state, "failed") == 4)
            assert len(fake.requests) == 4
        return state

    with capture_logs() as logs:
        state = asyncio.run(scenario())
    assert (count(state, "written"), count(state, "failed")) == (0, 4)
    warned = [line for line in logs if line["event"] == "proxy.record_failed"]
    assert len(warned) == 1 and warned[0]["log_level"] == "warning" and warned[0]["error"] == "NotADirectoryError"
    assert not any(line["event"] == "proxy.fail_open" for line in logs)  # the request path never saw it


def test_a_full_disk_loses_those_lines_only_and_leaves_no_partial_line(tmp_path: Path, monkeypatch: Any) -> None:
    """The second and third lines meet a full disk mid-write: they are cut off and counted; the run of failures is
    logged at its start and its end; the lines before and after are whole."""
    calls = [0]
    real = _record_files._write_all

    def disk(fd: int, data: bytes) -> None:
        calls[0] += 1
        if calls[0] in (2, 3):
            os.write(fd, data[: len(data) // 2])
            raise OSError(errno.ENOSPC, "No space left on device")
        real(fd, data)

    monkeypatch.setattr(_record_files, "_write_all", disk)

    async def scenario() -> ProxyState:
        async with proxy(record_dir=tmp_path) as (client, state, _fake):
            for n in (1, 3, 5, 7, 9):
                r = await client.post("/v1/messages", json=body_for("anthropic.messages", n), headers=headers_for("c"))
                assert r.status_code == 200
                done = (n + 1) // 2
                eventually(lambda done=done: count(state, "written") + count(state, "failed") == done)
        return state

    with capture_logs() as logs:
        state = asyncio.run(scenario())
    assert (count(state, "written"), count(state, "failed")) == (3, 2)
    records = [r for f in sorted(tmp_path.iterdir()) for r in load(f).records]
    assert [len(r.body["messages"]) for r in records] == [1, 7, 9]
    assert all(load(f).errors == [] for f in tmp_path.iterdir())
    events = [(ln["event"], ln.get("lost")) for ln in logs if ln["event"].startswith("proxy.record")]
    assert events == [("proxy.recording", None), ("proxy.record_failed", None), ("proxy.record_resumed", 2)]


def test_a_stuck_disk_never_holds_a_response_and_a_full_queue_drops(tmp_path: Path) -> None:
    """The writer hangs on the first line: the requests are answered all the same, the lines beyond the queue's
    bound are dropped and counted (one warning), and writing resumes once the disk does."""
    gate = threading.Event()

    async def scenario() -> ProxyState:
        async with proxy(record_dir=tmp_path) as (client, state, _fake):
            recorder = state.recorder
            assert recorder is not None
            recorder.queue_items = 2
            write = recorder.files.write

            def stuck(line: bytes) -> None:
                gate.wait(30)
                write(line)

            recorder.files.write = stuck  # type: ignore[method-assign]
            for n in (1, 3, 5, 7, 9):
                r = await client.post("/v1/messages", json=body_for("anthropic.messages", n), headers=headers_for("c"))
                assert r.status_code == 200
            assert count(state, "dropped") == 3 and count(state, "written") == 0
            gate.set()
            eventually(lambda: count(state, "written") == 2)
            r = await client.post("/v1/messages", json=body_for("anthropic.messages", 11), headers=headers_for("c"))
        return state

    with capture_logs() as logs:
        state = asyncio.run(scenario())
    assert (count(state, "written"), count(state, "dropped")) == (3, 3)
    assert [len(r.body["messages"]) for r in load(next(tmp_path.iterdir())).records] == [1, 3, 11]
    events = [(ln["event"], ln.get("lost")) for ln in logs if ln["event"].startswith("proxy.record")]
    assert events == [("proxy.recording", None), ("proxy.record_queue_full", None), ("proxy.record_resumed", 3)]


def test_requests_the_upstream_refused_are_not_recorded(tmp_path: Path) -> None:
    async def scenario() -> ProxyState:
        async with proxy(record_dir=tmp_path) as (client, state, fake):
            fake.fault = lambda seen: httpx.Response(429, json={"type": "error"}) if len(fake.requests) == 1 else None
            for n in (1, 3):
                r = await client.post("/v1/messages", json=body_for("anthropic.messages", n), headers=headers_for("c"))
                assert r.status_code == (429 if n == 1 else 200)
        return state

    state = asyncio.run(scenario())
    assert (count(state, "skipped"), count(state, "written")) == (1, 1)
    assert [len(line["body"]["messages"]) for line in lines_of(tmp_path)] == [3]


def test_the_clients_bytes_are_kept_on_one_line(tmp_path: Path) -> None:
    """A pretty-printed body with non-ASCII text and a U+2028 inside a string: the line holds the client's bytes
    (its line breaks as spaces), and reads back equal."""
    body = body_for("anthropic.messages", 1)
    body["messages"][0]["content"][0]["text"] = "Réservez un vol\u2028pour Zürich 🛫"
    raw = json.dumps(body, indent=2, ensure_ascii=False).replace("\n", "\r\n").encode()

    async def scenario() -> None:
        async with proxy(record_dir=tmp_path) as (client, _state, _fake):
            headers = {**headers_for("c"), "content-type": "application/json"}
            assert (await client.post("/v1/messages", content=raw, headers=headers)).status_code == 200

    asyncio.run(scenario())
    (path,) = tmp_path.iterdir()
    text = path.read_bytes()
    assert text.count(b"\n") == 1 and raw.replace(b"\r\n", b"  ") in text
    assert load(path).records[0].body == body


def test_the_command_line_names_an_unusable_record_directory(tmp_path: Path, monkeypatch: Any) -> None:
    blocker = tmp_path / "a-file"
    blocker.write_text("")
    result = CliRunner().invoke(cli.app, ["proxy", "--record", str(blocker), "--port", "0"])
    assert result.exit_code == 2
    assert result.stderr.strip().splitlines() == [
        f"agentcache: error: --record {blocker}: cannot create the directory: File exists"
    ]
    result = CliRunner().invoke(
        cli.app, ["proxy", "--record", str(tmp_path), "--record-max-mb", "8", "--record-max-total-mb", "4"]
    )
    assert (
        result.exit_code == 2
        and "record_max_total_mb=4" in result.stderr
        and "at least record_max_mb (8)" in result.stderr
    )
    monkeypatch.setenv("AGENTCACHE_PROXY_RECORD_DIR", str(tmp_path / "from-env"))
    monkeypatch.setenv("AGENTCACHE_PROXY_RECORD_MAX_MB", "16")
    config = ProxyConfig()
    assert (config.record_dir, config.record_max_mb, config.record_max_total_mb) == (tmp_path / "from-env", 16, 1024)
