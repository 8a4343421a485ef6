"""Run a client's scenarios directly against the fake upstream and through ``agentcache proxy``, and keep every
request on both sides of the proxy.

Direct: client -> fake. Proxied: client -> recorder -> proxy -> fake. The recorder is a pass-through that keeps
what the client sent and the proxy's ``x-agentcache-session`` answer, and tags each request with
``x-clients-test-seq`` so the fake's copy (what the proxy forwarded) pairs with it. The proxy runs in-process under
uvicorn, exactly as the proxy tests run it; its ``proxy.request`` log lines give each session's parent.

Both runs use the same home path (emptied in between), so paths the clients embed in their prompts are equal and a
direct request can be compared with its proxied twin after volatile ids are masked (:func:`masked`).
"""

from __future__ import annotations

import json
import re
import shutil
import threading
import time
from collections.abc import AsyncIterator
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any
from urllib.parse import unquote

import httpx
from starlette.applications import Starlette
from starlette.background import BackgroundTask
from starlette.requests import Request
from starlette.responses import Response, StreamingResponse
from starlette.routing import Route

from agentcache._log import capture_logs
from agentcache.model._bodytap import UsageTap
from agentcache.proxy import ProxyConfig, create_app
from tests.clients.drivers import CLIENTS, Client, RunOutput
from tests.clients.fake_upstream import FakeUpstream, Recorded, serve, unmarked
from tests.test_proxy_support import ServerThread, settings

SEQ_HEADER = "x-clients-test-seq"
ADMIN_TOKEN = "clients-test-admin"
_HOP = {"connection", "keep-alive", "transfer-encoding", "content-length", "host", "upgrade", "te", "trailer"}
_GENERATION = ("messages", "responses", "chat")


@dataclass
class Exchange:
    """One generation request as the client sent it, and what the proxy made of it (proxied runs): when the
    recorder in front got it (``at``, unix seconds) and the response it relayed back (``answer``)."""

    scenario: str
    label: str  # the true conversation: "<scenario>:main" | "<scenario>:sub" | "<scenario>:side"
    sent: Recorded
    forwarded: Recorded | None = None
    session: str | None = None  # x-agentcache-session
    seq: int = -1  # the recorder's number
    at: float | None = None
    answer: Answer | None = None


@dataclass
class Answer:
    """A response as the client got it: status, content type, body bytes and its ``date`` headers."""

    status: int
    content_type: str
    body: bytearray
    dates: list[str] = field(default_factory=list)


@dataclass
class Trace:
    """A client's scenarios in one mode (``direct`` or ``proxy``), with the ``build`` and ``version`` driven."""

    client: str
    mode: str
    build: str = "pinned"
    version: str = ""
    outputs: dict[str, RunOutput] = field(default_factory=dict)
    exchanges: list[Exchange] = field(default_factory=list)
    report: dict[str, Any] = field(default_factory=dict)
    parents: dict[str, str | None] = field(default_factory=dict)  # session id -> parent session id
    record_dir: Path | None = None  # the proxy's --record directory


class Recorder:
    """A pass-through in front of the proxy (starlette + httpx, streamed both ways)."""

    def __init__(self, target: str) -> None:
        self.target = target
        self.sent: dict[int, Recorded] = {}
        self.sessions: dict[int, str | None] = {}
        self.at: dict[int, float] = {}
        self.answers: dict[int, Answer] = {}
        self._seq = 0
        self._lock = threading.Lock()
        self.client = httpx.AsyncClient(base_url=target, timeout=httpx.Timeout(120.0))
        self.app = Starlette(
            routes=[Route("/{path:path}", self.handle, methods=["GET", "POST", "PUT", "DELETE", "HEAD"])]
        )

    async def handle(self, request: Request) -> Response:
        at = time.time()
        raw = await request.body()
        with self._lock:
            seq = self._seq
            self._seq += 1
        self.at[seq] = at
        try:
            body = json.loads(raw) if raw else None
        except ValueError:
            body = None
        self.sent[seq] = Recorded(request.method, request.url.path, dict(request.headers), body)
        headers = {k: v for k, v in request.headers.items() if k.lower() not in _HOP}
        headers[SEQ_HEADER] = str(seq)
        upstream = await self.client.send(
            self.client.build_request(request.method, request.url.path, content=raw, headers=headers), stream=True
        )
        self.sessions[seq] = upstream.headers.get("x-agentcache-session")
        out_headers = {k: v for k, v in upstream.headers.items() if k.lower() not in _HOP}

        ctype, dates = upstream.headers.get("content-type", ""), upstream.headers.get_list("date")
        answer = self.answers[seq] = Answer(upstream.status_code, ctype, bytearray(), dates)

        async def body_iter() -> AsyncIterator[bytes]:
            async for chunk in upstream.aiter_raw():
                answer.body += chunk  # kept as it passes: a client may hang up after the terminal event
                yield chunk

        return StreamingResponse(
            body_iter(),
            status_code=upstream.status_code,
            headers=out_headers,
            background=BackgroundTask(upstream.aclose),
        )


def label(driver: Client, scenario: str, rec: Recorded) -> str:
    """The true conversation of a request: the scenario's main loop, its subagent, or a side request (a title)."""
    role = driver.role(rec)
    # A continue/resume goes on with the fresh run's conversation.
    return f"{'fresh' if scenario.startswith('continue') and role == 'main' else scenario}:{role}"


def _generation(recs: list[Recorded]) -> list[Recorded]:
    return [r for r in recs if r.route in _GENERATION or r.path.endswith(("/messages", "/responses", "/completions"))]


def run_trace(
    client: str, mode: str, home: Path, record_dir: Path | None = None, build: str = "pinned", realistic: bool = False
) -> Trace:
    """Run the scenarios of ``client`` (its ``build``) in ``mode`` with a fresh ``home`` (emptied first); a proxied
    run records its traffic in ``record_dir`` (``agentcache proxy --record``, emptied first) when given. The proxy
    is served as ``agentcache proxy`` serves it (:func:`~agentcache.proxy._server.uvicorn_config`); ``realistic``:
    the fake answers with a provider's cache accounting (:class:`FakeUpstream`)."""
    shutil.rmtree(home, ignore_errors=True)
    home.mkdir(parents=True)
    driver = CLIENTS[client](home, build)
    trace = Trace(client, mode, build, driver.version(), record_dir=record_dir)
    with serve(FakeUpstream(realistic=realistic)) as (fake, fake_url):
        if mode == "direct":
            for scenario, prompt, resume in driver.scenarios:
                start = len(fake.requests)
                trace.outputs[scenario] = driver.run(fake_url, prompt, resume)
                for rec in _generation(fake.requests[start:]):
                    trace.exchanges.append(Exchange(scenario, label(driver, scenario, rec), rec))
            return trace
        if record_dir is not None:
            shutil.rmtree(record_dir, ignore_errors=True)
        config = ProxyConfig(upstream=fake_url, record_dir=record_dir, admin_token=ADMIN_TOKEN)
        app = create_app(config, settings=settings())
        with capture_logs() as logs, ServerThread(app, proxy=config) as proxy:
            recorder = Recorder(proxy.url)
            with ServerThread(recorder.app) as front:
                for scenario, prompt, resume in driver.scenarios:
                    start = recorder._seq
                    trace.outputs[scenario] = driver.run(front.url, prompt, resume)
                    forwarded = {int(r.headers.get(SEQ_HEADER, -1)): r for r in fake.requests}
                    for seq in range(start, recorder._seq):
                        sent = recorder.sent[seq]
                        fwd = forwarded.get(seq)
                        if fwd is None or fwd.route not in _GENERATION:
                            continue
                        ex = Exchange(
                            scenario, label(driver, scenario, sent), sent, fwd, recorder.sessions.get(seq), seq=seq
                        )
                        trace.exchanges.append(ex)
                # every tenant's report (the client's API key is its tenant): the admin's view
                admin = {"x-agentcache-admin-token": ADMIN_TOKEN}
                trace.report = httpx.get(f"{proxy.url}/agentcache/v1/report", headers=admin, timeout=30).json()
            for ex in trace.exchanges:  # the front server is stopped: every response was relayed in full
                ex.at, ex.answer = recorder.at[ex.seq], recorder.answers.get(ex.seq)
        for line in logs:
            if line.get("event") == "proxy.request" and isinstance(line.get("session_signal"), dict):
                sig = line["session_signal"]
                trace.parents[sig["session_id"]] = sig.get("parent")
    return trace


_APIS = {"messages": "anthropic.messages", "responses": "openai.responses", "chat": "openai.chat"}


def write_offline(trace: Trace, path: Path) -> int:
    """A proxied run's generation requests as audit JSONL, from the recorder in front of the proxy: each request as
    the client sent it, when the recorder got it, the session the proxy named (``x-agentcache-session``) and its
    parent (the proxy's log), and the usage of the response the client got. No ``recorded_by``: the loader names
    its sessions ``<stem>/<session>``. Returns the number of lines."""
    lines = []
    for ex in trace.exchanges:
        assert ex.forwarded is not None and ex.session is not None
        sid = unquote(ex.session, errors="surrogatepass")
        api = _APIS[ex.forwarded.route]
        line: dict[str, Any] = {"session": sid, "api": api, "at": ex.at, "body": ex.sent.body}
        if parent := trace.parents.get(sid):
            line["parent"] = parent
        if ex.answer is not None and 200 <= ex.answer.status < 300:
            tap = UsageTap(api, ex.answer.content_type)
            tap.feed(ex.answer.body)
            if tap.result() is not None and (wire := tap.wire()) is not None:
                line["response"] = wire
        lines.append(json.dumps(line) + "\n")
    path.write_text("".join(lines))
    return len(lines)


# --- comparing requests ---

_VOLATILE = [
    re.compile(r"[0-9a-f]{8}-[0-9a-f]{4}-[0-9a-f]{4}-[0-9a-f]{4}-[0-9a-f]{12}"),  # uuids (session, thread, turn)
    re.compile(r"ses_[0-9A-Za-z]{20,}"),  # opencode session ids
    re.compile(r"\b[0-9a-f]{16,64}\b"),  # hex ids (device id, agent id)
    re.compile(r"\b1[6-9]\d{11}\b"),  # unix milliseconds
    re.compile(r"(?<=duration_ms: )\d+"),  # Claude Code's subagent result footer
    re.compile(r"(?<=Chunk ID: )[0-9a-f]+|(?<=Wall time: )[0-9.]+"),  # Codex's exec_command output header
]
_RANDOM_KEYS = {"nickname"}  # Codex names each spawned agent at random


def masked(value: Any) -> Any:
    """``value`` with volatile ids and timestamps replaced by ``<id>`` (JSON strings inside strings parsed first)."""
    if isinstance(value, dict):
        return {masked(k): "<id>" if k in _RANDOM_KEYS else masked(v) for k, v in value.items()}
    if isinstance(value, list):
        return [masked(v) for v in value]
    if isinstance(value, int) and value > 1_600_000_000_000:  # unix milliseconds
        return "<id>"
    if isinstance(value, str):
        if value[:1] == "{" and value[-1:] == "}":
            try:
                return masked(json.loads(value))
            except ValueError:
                pass
        for pattern in _VOLATILE:
            value = pattern.sub("<id>", value)
    return value


def markers(body: Any, path: str = "") -> dict[str, dict[str, Any]]:
    """Every ``cache_control`` in ``body``: JSON path of the marked block -> the marker."""
    out: dict[str, dict[str, Any]] = {}
    if isinstance(body, dict):
        cc = body.get("cache_control")
        if isinstance(cc, dict):
            out[path] = cc
        for k, v in body.items():
            if k != "cache_control":
                out.update(markers(v, f"{path}.{k}" if path else k))
    elif isinstance(body, list):
        for i, v in enumerate(body):
            out.update(markers(v, f"{path}[{i}]"))
    return out


def block_at(body: Any, path: str) -> Any:
    """The value at a :func:`markers` path."""
    node = body
    for part in re.findall(r"[^.\[\]]+|\[\d+\]", path):
        node = node[int(part[1:-1])] if part.startswith("[") else node[part]
    return node


def is_empty_block(block: Any) -> bool:
    """A text block with no text (Anthropic rejects a marker there)."""
    return isinstance(block, dict) and block.get("type") == "text" and not str(block.get("text", "")).strip()


def marker_order_ok(body: dict[str, Any]) -> bool:
    """Anthropic's rule: 1h-TTL markers all come before 5m ones in prefix order (tools, system, messages)."""
    order = [k for k in ("tools", "system", "messages") if k in body]
    seen_5m = False
    for key in order:
        for _, cc in markers(body.get(key), key).items():
            ttl = cc.get("ttl", "5m")
            if ttl == "5m":
                seen_5m = True
            elif ttl == "1h" and seen_5m:
                return False
    return True


def client_changed(prev: dict[str, Any], cur: dict[str, Any], route: str) -> bool:
    """Whether the client's own request ``cur`` is not a plain extension of ``prev`` (markers ignored): a change
    in tools, system/instructions or an earlier message, which a provider's prefix cache would see as a miss."""
    a, b = unmarked(prev, shapes=False), unmarked(cur, shapes=False)
    items = "input" if route == "responses" else "messages"
    for key in ("tools", "system", "instructions"):
        if a.get(key) != b.get(key):
            return True
    old, new = a.get(items) or [], b.get(items) or []
    return not isinstance(old, list) or not isinstance(new, list) or new[: len(old)] != old


def break_is_client_caused(trace: Trace, brk: dict[str, Any]) -> bool:
    """Whether a reported break sits where the client itself changed its conversation: the session's request
    ``brk["request"]`` continues the same true conversation as the one before it and :func:`client_changed` holds
    between them. A break between two different conversations merged into one session is never the client's."""
    sid = brk["session"].split("/", 1)[1]
    seq = [ex for ex in trace.exchanges if ex.session == sid]
    i = brk["request"]
    if not 0 < i < len(seq) or seq[i - 1].label != seq[i].label:
        return False
    route = "responses" if trace.client == "codex" else "messages"
    return client_changed(seq[i - 1].sent.body, seq[i].sent.body, route)
