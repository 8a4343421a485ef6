"""OpenTelemetry export (setting ``otel``): spans exported by the standard SDK and OTLP/HTTP exporter, configured by
the ``OTEL_*`` variables alone, decoded by a minimal OTLP/HTTP receiver here (``ExportTraceServiceRequest`` from
``opentelemetry-proto``). The proxy's turns (an uncached one, a cached one, a break) carry the GenAI semantic
conventions' usage and agentcache's own attributes, continue the client's ``traceparent``, and never carry prompt
text or the API key; a relayed request gets its span; ``wrap()`` exports the same span through the same sink; an
exporter that cannot reach its endpoint never touches a request."""

from __future__ import annotations

import asyncio
import gzip
import threading
from collections.abc import Iterator
from http.server import BaseHTTPRequestHandler, ThreadingHTTPServer
from typing import Any

import httpx
import pytest

from agentcache._config import Settings
from agentcache.proxy import ProxyConfig, create_app
from agentcache.proxy._trace import tracing_sink
from tests import needs
from tests.test_proxy_support import ANTHROPIC_KEY, FakeUpstream, anthropic_body, anthropic_message, conversation

trace_service_pb2 = pytest.importorskip(
    "opentelemetry.proto.collector.trace.v1.trace_service_pb2", reason=needs.extra("dev")
)
pytest.importorskip("opentelemetry.exporter.otlp.proto.http", reason=needs.extra("otel"))

TRACE_ID, PARENT_ID = "4bf92f3577b34da6a3ce929d0e0e4736", "00f067aa0ba902b7"


class Receiver:
    """A minimal OTLP/HTTP trace receiver on a loopback port: every ``POST /v1/traces`` body decoded."""

    def __init__(self) -> None:
        self.bodies: list[bytes] = []
        self.spans: list[Any] = []
        outer = self

        class Handler(BaseHTTPRequestHandler):
            def do_POST(self) -> None:
                body = self.rfile.read(int(self.headers["content-length"]))
                if self.headers.get("content-encoding") == "gzip":
                    body = gzip.decompress(body)
                outer.bodies.append(body)
                request = trace_service_pb2.ExportTraceServiceRequest()
                request.ParseFromString(body)
                for resource in request.resource_spans:
                    for scope in resource.scope_spans:
                        outer.spans.extend(scope.spans)
                self.send_response(200)
                self.send_header("content-type", "application/x-protobuf")
                self.send_header("content-length", "0")
                self.end_headers()

            def log_message(self, *args: Any) -> None:
                pass

        self.server = ThreadingHTTPServer(("127.0.0.1", 0), Handler)
        self.thread = threading.Thread(target=self.server.serve_forever, daemon=True)

    @property
    def url(self) -> str:
        return f"http://127.0.0.1:{self.server.server_address[1]}/v1/traces"

    def named(self, name: str) -> list[Any]:
        return [s for s in self.spans if s.name == name]


@pytest.fixture
def receiver(monkeypatch: pytest.MonkeyPatch) -> Iterator[Receiver]:
    r = Receiver()
    r.thread.start()
    monkeypatch.setenv("OTEL_EXPORTER_OTLP_TRACES_ENDPOINT", r.url)
    monkeypatch.setenv("OTEL_SERVICE_NAME", "agentcache-test")
    yield r
    r.server.shutdown()


def attributes(span: Any) -> dict[str, Any]:
    out: dict[str, Any] = {}
    for kv in span.attributes:
        v = kv.value
        kind = v.WhichOneof("value")
        out[kv.key] = list(x.string_value for x in v.array_value.values) if kind == "array_value" else getattr(v, kind)
    return out


def _refuse_seven(seen: Any) -> httpx.Response | None:
    """The fake upstream's fault: a request asking for 7 tokens is refused (503)."""
    if seen.path == "/v1/messages" and seen.json().get("max_tokens") == 7:
        return httpx.Response(503, json={"type": "error", "error": {"type": "overloaded_error", "message": "busy"}})
    return None


def _run_proxy(fake: FakeUpstream) -> tuple[list[dict[str, Any]], list[dict[str, Any]]]:
    """Five requests through the proxy with otel on: two turns (the first with a traceparent), a break, a relay, and
    a request the upstream refuses."""
    fake.fault = _refuse_seven
    msgs = conversation(6)

    async def scenario() -> tuple[list[dict[str, Any]], list[dict[str, Any]]]:
        app = create_app(ProxyConfig(), settings=Settings(otel=True), transport=fake.transport())
        state = app.state.proxy
        sent, usages = [], []
        async with state.running():
            transport = httpx.ASGITransport(app=app)
            async with httpx.AsyncClient(transport=transport, base_url="http://proxy") as client:
                main = {"x-api-key": ANTHROPIC_KEY, "x-agentcache-session": "otel-main"}
                traced = {**main, "traceparent": f"00-{TRACE_ID}-{PARENT_ID}-01"}
                changed = anthropic_body(msgs[:5])
                changed["system"] = "A new day. " + str(changed["system"])
                for body, headers in ((anthropic_body(msgs[:1]), traced), (anthropic_body(msgs[:3]), main)):
                    r = await client.post("/v1/messages", json=body, headers=headers)
                    sent.append(body)
                    usages.append(r.json()["usage"])
                r = await client.post("/v1/messages", json=changed, headers=main)
                sent.append(changed)
                usages.append(r.json()["usage"])
                assert (await client.get("/v1/models", headers=main)).status_code == 200
                failing = {"x-api-key": ANTHROPIC_KEY, "x-agentcache-session": "otel-fail"}
                r = await client.post("/v1/messages", json=anthropic_body(msgs[:1], max_tokens=7), headers=failing)
                assert r.status_code == 503
            sink = tracing_sink(state.sessions.sinks)
            assert sink is not None
            sink.flush()
        return sent, usages

    return asyncio.run(scenario())


def test_proxy_turns_become_spans_with_genai_and_agentcache_attributes(receiver: Receiver) -> None:
    fake = FakeUpstream()
    sent, usages = _run_proxy(fake)
    turns = receiver.named("chat claude-opus-4-8")
    assert len(turns) == 3
    first, cached, broken = (attributes(s) for s in sorted(turns, key=lambda s: s.start_time_unix_nano))
    for attrs, usage in zip((first, cached, broken), usages, strict=True):
        assert attrs["gen_ai.operation.name"] == "chat" and attrs["gen_ai.provider.name"] == "anthropic"
        assert attrs["gen_ai.request.model"] == "claude-opus-4-8" and attrs["agentcache.session"] == "otel-main"
        assert attrs["gen_ai.response.model"] == "claude-opus-4-8"  # the fake's response names it
        read, written = usage["cache_read_input_tokens"], usage["cache_creation_input_tokens"]
        assert attrs["gen_ai.usage.cache_read.input_tokens"] == read
        assert attrs["gen_ai.usage.cache_creation.input_tokens"] == written
        assert attrs["gen_ai.usage.input_tokens"] == usage["input_tokens"] + read + written  # cached included
        assert attrs["gen_ai.usage.output_tokens"] == usage["output_tokens"]
        assert attrs["agentcache.generation"] == 0 and attrs["agentcache.cost_usd"] > 0
    assert first["gen_ai.usage.cache_read.input_tokens"] == 0 and first["agentcache.turn"] == 0
    assert "agentcache.cause" not in first and first["agentcache.tokens_lost"] == 0
    assert cached["gen_ai.usage.cache_read.input_tokens"] > 0 and cached["agentcache.turn"] == 1
    assert broken["agentcache.cause"] == "system.changed" and broken["agentcache.repaired"] is False
    assert broken["agentcache.tokens_lost"] > 0 and broken["agentcache.usd_lost"] > 0

    by_start = sorted(turns, key=lambda s: s.start_time_unix_nano)
    assert by_start[0].trace_id.hex() == TRACE_ID and by_start[0].parent_span_id.hex() == PARENT_ID
    assert by_start[1].trace_id.hex() != TRACE_ID and by_start[1].parent_span_id == b""  # no traceparent: a root
    assert all(s.kind == s.SPAN_KIND_CLIENT and s.end_time_unix_nano > s.start_time_unix_nano for s in turns)

    (retry,) = receiver.named("retry")
    assert retry.status.code == retry.status.STATUS_CODE_ERROR and retry.status.message == "http_503"
    assert attributes(retry)["agentcache.session"] == "otel-fail" and attributes(retry)["agentcache.attempt"] == 1
    relayed = receiver.named("GET relay")
    assert len(relayed) == 1 and attributes(relayed[0])["http.response.status_code"] == 200
    exported = b"".join(receiver.bodies)
    assert b"agentcache-test" in exported  # the resource from OTEL_SERVICE_NAME
    assert ANTHROPIC_KEY.encode() not in exported
    for body in sent:  # no prompt text: not the system prompt, not a message
        assert str(body["system"])[:60].encode() not in exported
        for m in body["messages"]:
            text = m["content"] if isinstance(m["content"], str) else str(m["content"])
            assert text[:40].encode() not in exported


def test_wrap_exports_the_same_span(receiver: Receiver) -> None:
    anthropic = pytest.importorskip("anthropic", reason=needs.extra("sdk"))
    httpx2 = pytest.importorskip("httpx2", reason=needs.extra("sdk"))
    import agentcache

    usage = {"input_tokens": 40, "cache_read_input_tokens": 1200, "cache_creation_input_tokens": 30}

    def handler(request: Any) -> Any:
        return httpx2.Response(200, json={**anthropic_message(usage), "model": "claude-opus-4-8-20261201"})

    http = httpx2.Client(transport=httpx2.MockTransport(handler))
    sessions = agentcache.Sessions(settings=Settings(otel=True))
    client = agentcache.wrap(anthropic.Anthropic(api_key=ANTHROPIC_KEY, http_client=http), sessions=sessions)
    client.messages.create(**anthropic_body(conversation(1)))
    sink = tracing_sink(sessions.sinks)
    assert sink is not None
    sink.flush()
    (span,) = receiver.named("chat claude-opus-4-8")
    attrs = attributes(span)
    assert attrs["gen_ai.provider.name"] == "anthropic" and attrs["gen_ai.usage.input_tokens"] == 1270
    assert attrs["gen_ai.usage.cache_read.input_tokens"] == 1200
    assert attrs["gen_ai.usage.cache_creation.input_tokens"] == 30
    assert attrs["agentcache.session"] == client.agentcache_session.session_id
    assert attrs["gen_ai.request.model"] == "claude-opus-4-8"  # what was asked for
    assert attrs["gen_ai.response.model"] == "claude-opus-4-8-20261201"  # what answered


def test_an_unreachable_exporter_never_touches_a_request(monkeypatch: pytest.MonkeyPatch) -> None:
    monkeypatch.setenv("OTEL_EXPORTER_OTLP_TRACES_ENDPOINT", "http://127.0.0.1:9/v1/traces")  # discard: refused
    monkeypatch.setenv("OTEL_EXPORTER_OTLP_TRACES_TIMEOUT", "1")
    fake = FakeUpstream()
    _sent, usages = _run_proxy(fake)
    assert len(usages) == 3 and all(u["input_tokens"] >= 0 for u in usages) and len(fake.requests) == 5
