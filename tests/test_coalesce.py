"""Coalescing sibling requests (issue 14): four subagents of one parent, sent at once with a new ~3K-token shared
prefix, through the proxy (uvicorn on a real socket) and through ``wrap()`` around ``AsyncAnthropic``, in front of
a fake upstream (threaded HTTP/1.1, TCP_NODELAY) that takes 0.6 s to its first byte and records when each request
arrives. The first reaches the upstream at once, the other three only after its first byte (within the bound),
and all succeed; then the cases that must never be held, and the fail-open ones."""

from __future__ import annotations

import asyncio
import threading
import time
from collections.abc import Iterator
from typing import Any

import httpx
import pytest
from prometheus_client import CollectorRegistry, generate_latest

from agentcache import PrometheusSink, Sessions, wrap
from agentcache._config import Settings
from agentcache.adapters import canonicalize
from agentcache.proxy import ProxyConfig, create_app
from agentcache.session._coalesce import Coalescer
from tests.test_proxy_support import ServerThread, anthropic_body
from tests.test_wrap_upstream import FakeUpstream, Reply, anthropic_events, anthropic_message

TTFB = 0.6
WARM_UP = "Warm-up agent."
TASKS = [
    "Search the codebase for every caller of reserve_flight and list them.",
    "Read the baggage policy section and summarise the allowance rules.",
    "Find the tests that cover cancellation refunds and report which fail.",
    "Check whether update_reservation_flights validates the cabin class.",
]


class Arrivals:
    """The fake upstream's answers: each request's arrival time recorded, answered after ``delay`` seconds
    (``status`` for the first request, 200 for the others)."""

    def __init__(self, up: FakeUpstream, delay: float = TTFB, first_status: int = 200) -> None:
        self.times: list[float] = []
        self.tasks: list[str] = []
        self._lock = threading.Lock()
        self.delay, self.first_status = delay, first_status
        up.fallback = self.reply

    def reply(self, path: str, body: dict[str, Any]) -> Reply:
        if WARM_UP in str(body.get("system")):
            return Reply(body=anthropic_message())
        with self._lock:
            first = not self.times
            self.times.append(time.monotonic())
            self.tasks.append(str(body["messages"][-1]["content"]))
        if first and self.first_status != 200:
            error = {"type": "error", "error": {"type": "overloaded_error", "message": "Overloaded"}}
            return Reply(self.first_status, error, delay=self.delay)
        if body.get("stream"):
            return Reply(events=anthropic_events(), delay=self.delay)
        return Reply(body=anthropic_message(), delay=self.delay)


def sibling(i: int, model: str = "claude-opus-4-8", stream: bool = True) -> dict[str, Any]:
    """Subagent ``i``: the parent's tools and system (~3.1K tokens, new to the cache) and its own task."""
    return {**anthropic_body([{"role": "user", "content": TASKS[i]}], stream=stream), "model": model}


def _warm_up() -> dict[str, Any]:
    """An unrelated conversation (no tools, another system prompt): loads the tokenizer and opens connections, so
    "at once" measures the hold, not the first request's start-up."""
    hello = [{"role": "user", "content": "hi"}]
    return {"model": "claude-opus-4-8", "max_tokens": 8, "system": WARM_UP, "messages": hello}


@pytest.fixture
def upstream() -> Iterator[FakeUpstream]:
    up = FakeUpstream()
    yield up
    up.close()


def _proxy(up: FakeUpstream, **settings: Any) -> tuple[Any, Any]:
    app = create_app(ProxyConfig(upstream=up.url), settings=Settings(**settings))
    return app, app.state.proxy


async def _send_siblings(url: str, bodies: list[dict[str, Any]]) -> tuple[float, list[httpx.Response]]:
    async with httpx.AsyncClient(base_url=url, timeout=30) as client:

        async def one(i: int, body: dict[str, Any]) -> httpx.Response:
            headers = {"x-agentcache-session": f"parent/agent-{i}", "x-agentcache-parent": "parent"}
            return await client.post("/v1/messages", json=body, headers=headers)

        # Warm up (tokenizer, connection pool) with an unrelated conversation, so "at once" measures the hold.
        await client.post("/v1/messages", json=_warm_up())
        sent = time.monotonic()
        responses = await asyncio.gather(*(one(i, b) for i, b in enumerate(bodies)))
    return sent, list(responses)


def _metric(text: str, name: str) -> float:
    total = 0.0
    for line in text.splitlines():
        if line.startswith(name) and not line.startswith("#"):
            total += float(line.rsplit(" ", 1)[1])
    return total


def test_proxy_holds_three_siblings_until_the_first_ones_first_byte(upstream: FakeUpstream) -> None:
    arrivals = Arrivals(upstream)
    app, state = _proxy(upstream)
    with ServerThread(app) as server:
        sent, responses = asyncio.run(_send_siblings(server.url, [sibling(i) for i in range(4)]))
    assert [r.status_code for r in responses] == [200] * 4
    assert all(b"message_stop" in r.content for r in responses)
    times = sorted(t - sent for t in arrivals.times)
    assert len(times) == 4
    # The first goes at once: it is not among the three held (the hold metrics below); no wall-clock bound on it,
    # which a loaded machine breaks.
    first_byte = times[0] + TTFB
    for t in times[1:]:  # the others after the first's first byte, well within the 3 s bound
        assert first_byte - 0.05 <= t < times[0] + 3.0
    metrics = state.metrics.render().decode()
    assert _metric(metrics, 'agentcache_coalesce_held_requests_total{outcome="released"}') == 3
    assert _metric(metrics, 'agentcache_coalesce_held_requests_total{outcome="timeout"}') == 0
    assert _metric(metrics, "agentcache_coalesce_hold_seconds_count") == 3
    assert 3 * (TTFB - 0.1) <= _metric(metrics, "agentcache_coalesce_hold_seconds_sum") <= 3 * 3.0
    # Each held sibling reads the tools + system entry (~3.1K tokens) instead of writing it again.
    saved = _metric(metrics, "agentcache_coalesce_saved_write_tokens_total")
    assert 3 * 3000 <= saved <= 3 * 3300


def test_proxy_off_switch_and_below_minimum_send_at_once(upstream: FakeUpstream) -> None:
    arrivals = Arrivals(upstream)
    app, _ = _proxy(upstream, coalesce=False)
    with ServerThread(app) as server:
        sent, responses = asyncio.run(_send_siblings(server.url, [sibling(i) for i in range(4)]))
    assert [r.status_code for r in responses] == [200] * 4
    assert max(arrivals.times) - sent < TTFB - 0.1  # nobody waited for a first byte

    # claude-haiku-4-5 caches from 4096 tokens: a ~3.1K prefix caches nothing, so nothing is worth a hold.
    arrivals.times.clear()
    app, state = _proxy(upstream)
    with ServerThread(app) as server:
        sent, responses = asyncio.run(
            _send_siblings(server.url, [sibling(i, model="claude-haiku-4-5") for i in range(4)])
        )
    assert [r.status_code for r in responses] == [200] * 4
    assert max(arrivals.times) - sent < TTFB - 0.1
    assert _metric(state.metrics.render().decode(), "agentcache_coalesce_hold_seconds_count") == 0


def test_proxy_never_holds_a_prefix_already_cached(upstream: FakeUpstream) -> None:
    arrivals = Arrivals(upstream)
    app, state = _proxy(upstream)
    with ServerThread(app) as server:
        asyncio.run(_send_siblings(server.url, [sibling(0)]))  # writes the shared entry
        arrivals.times.clear()
        sent, responses = asyncio.run(_send_siblings(server.url, [sibling(i) for i in range(1, 4)]))
    assert [r.status_code for r in responses] == [200] * 3
    assert max(arrivals.times) - sent < TTFB - 0.1  # all three read the live entry: no hold
    assert _metric(state.metrics.render().decode(), "agentcache_coalesce_hold_seconds_count") == 0


def test_proxy_hold_is_bounded_and_fails_open(upstream: FakeUpstream) -> None:
    arrivals = Arrivals(upstream, delay=1.5)
    app, state = _proxy(upstream, coalesce_timeout=0.4)
    with ServerThread(app) as server:
        sent, responses = asyncio.run(_send_siblings(server.url, [sibling(i) for i in range(3)]))
    assert [r.status_code for r in responses] == [200] * 3
    times = sorted(t - sent for t in arrivals.times)
    assert times[0] < 0.3
    for t in times[1:]:  # released by the bound, long before the first byte at +1.5 s
        assert 0.35 <= t < 1.2
    metrics = state.metrics.render().decode()
    assert _metric(metrics, 'agentcache_coalesce_held_requests_total{outcome="timeout"}') == 2
    assert _metric(metrics, "agentcache_coalesce_saved_write_tokens_total") == 0


def test_proxy_writer_error_releases_the_held_siblings(upstream: FakeUpstream) -> None:
    arrivals = Arrivals(upstream, delay=0.4, first_status=529)
    app, state = _proxy(upstream)
    with ServerThread(app) as server:
        sent, responses = asyncio.run(_send_siblings(server.url, [sibling(i) for i in range(3)]))
    assert sorted(r.status_code for r in responses) == [200, 200, 529]
    times = sorted(t - sent for t in arrivals.times)
    assert times[0] < 0.3 and all(0.35 <= t < 1.5 for t in times[1:])
    metrics = state.metrics.render().decode()
    assert _metric(metrics, 'agentcache_coalesce_held_requests_total{outcome="writer_failed"}') == 2


def test_wrap_async_client_holds_siblings_until_the_first_byte(upstream: FakeUpstream) -> None:
    import anthropic

    arrivals = Arrivals(upstream)
    registry = CollectorRegistry()
    sessions = Sessions(sinks=[PrometheusSink(registry=registry)])
    parent = sessions.session("parent")

    async def run() -> tuple[float, list[Any]]:
        client = anthropic.AsyncAnthropic(base_url=upstream.url, api_key="sk-test", max_retries=0)
        subs = [wrap(client, parent.fork(f"agent-{i}")) for i in range(4)]

        async def one(i: int) -> str:
            body = sibling(i)
            body.pop("stream")
            stream = await subs[i].messages.create(**body, stream=True)
            text = ""
            async for event in stream:
                if event.type == "content_block_delta":
                    text += event.delta.text
            return text

        await wrap(client, sessions.session("warm-up")).messages.create(**_warm_up())
        sent = time.monotonic()
        out = await asyncio.gather(*(one(i) for i in range(4)))
        await client.close()
        return sent, list(out)

    sent, texts = asyncio.run(run())
    assert texts == ["Hello."] * 4
    times = sorted(t - sent for t in arrivals.times)
    assert times[0] < 0.3
    for t in times[1:]:
        assert times[0] + TTFB - 0.05 <= t < times[0] + 3.0
    metrics = generate_latest(registry).decode()
    assert _metric(metrics, 'agentcache_coalesce_held_requests_total{outcome="released"}') == 3
    assert _metric(metrics, "agentcache_coalesce_saved_write_tokens_total") >= 3 * 3000


def test_coalescer_rules_without_a_network() -> None:
    """The decision alone: an engine is never held, a short prompt is never held, a sibling of a writer is."""

    async def run() -> None:
        co = Coalescer()
        from agentcache.session._pipeline import SessionPipeline

        planned = [SessionPipeline("anthropic").prepare("anthropic.messages", sibling(i)).planned for i in range(3)]
        assert co.claim("t", planned[0], provider="anthropic", engine=True) is None
        first = co.claim("t", planned[0], provider="anthropic")
        assert first is not None and not first.held and co.pending >= 1
        second = co.claim("t", planned[1], provider="anthropic")
        assert second is not None and second.held and second.saved_tokens > 3000
        other = co.claim("other-tenant", planned[1], provider="anthropic")  # another cache scope: its own writer
        assert other is not None and not other.held
        other.release()
        waiter = asyncio.ensure_future(second.wait())
        await asyncio.sleep(0.01)
        assert not waiter.done()
        first.first_byte()
        hold = await waiter
        assert hold is not None and hold.outcome == "released" and hold.saved_tokens == second.saved_tokens
        third = co.claim("t", planned[2], provider="anthropic")  # the entry is live now: read, not held
        assert third is not None and not third.held
        short = canonicalize(
            "anthropic.messages",
            {"model": "claude-opus-4-8", "max_tokens": 8, "messages": [{"role": "user", "content": "hi"}]},
        )
        assert co.claim("t", short, provider="anthropic") is None

        # A writer that never reports back (a stream nobody reads) is forgotten after the bound.
        clock = [0.0]
        co2 = Coalescer(timeout=3.0, clock=lambda: clock[0])
        silent = co2.claim("t", planned[0], provider="anthropic")
        assert silent is not None and co2.claim("t", planned[1], provider="anthropic").held  # type: ignore[union-attr]
        clock[0] = 3.5
        late = co2.claim("t", planned[2], provider="anthropic")
        assert late is not None and not late.held

    asyncio.run(run())


def test_cli_proxy_flags_and_env_set_coalescing(monkeypatch: pytest.MonkeyPatch) -> None:
    from typer.testing import CliRunner

    from agentcache import _cli
    from agentcache._config import reset_settings
    from agentcache._log_output import reset_logging

    seen: list[Settings] = []
    monkeypatch.setattr("agentcache.proxy.serve", lambda config, settings=None: seen.append(settings))
    monkeypatch.setenv("AGENTCACHE_COALESCE_TIMEOUT", "1.5")
    try:
        flags = CliRunner().invoke(_cli.app, ["proxy", "--port", "0", "--no-coalesce", "--coalesce-timeout", "0.5"])
        env = CliRunner().invoke(_cli.app, ["proxy", "--port", "0"])
    finally:
        reset_logging()
        reset_settings()
    assert flags.exit_code == 0 and env.exit_code == 0, flags.output + env.output
    assert (seen[0].coalesce, seen[0].coalesce_timeout) == (False, 0.5)
    assert (seen[1].coalesce, seen[1].coalesce_timeout) == (True, 1.5)


def test_proxy_siblings_sharing_a_task_context_read_one_write_of_it(upstream: FakeUpstream) -> None:
    """claude-code#82739 through the proxy: siblings whose prompts share the parent's task context and differ in a
    few words. The second sibling gets the ``sibling`` marker at the end of the shared context and the later ones
    wait for its first byte instead of writing the context again."""
    from tests.conftest import policy

    arrivals = Arrivals(upstream)
    context = policy()[:4000]

    def body(i: int) -> dict[str, Any]:
        blocks = [
            {"type": "text", "text": context},
            {"type": "text", "text": TASKS[i]},
            {"type": "text", "text": "<env>cwd: /work</env>", "cache_control": {"type": "ephemeral"}},
        ]
        return {**sibling(i), "messages": [{"role": "user", "content": blocks}]}

    app, state = _proxy(upstream)
    with ServerThread(app) as server:
        sent, responses = asyncio.run(_send_siblings(server.url, [body(i) for i in range(4)]))
    assert [r.status_code for r in responses] == [200] * 4
    marked = [
        [b.get("cache_control") is not None for b in s.body["messages"][0]["content"]]
        for s in upstream.seen
        if WARM_UP not in str(s.body.get("system"))
    ]
    # every sibling after the first: the context's end marked (and the task before the client's own env marker,
    # the block the next turn resends should the client drop its env block)
    assert sum(m == [True, True, True] for m in marked) == 3 and all(m[2] for m in marked)
    times = sorted(t - sent for t in arrivals.times)
    assert times[0] < 0.3 and all(t >= times[0] + TTFB - 0.05 for t in times[1:]) and times[-1] < 3.0
    metrics = state.metrics.render().decode()
    assert _metric(metrics, 'agentcache_coalesce_held_requests_total{outcome="released"}') == 3


def test_coalescer_holds_openai_siblings_on_their_shared_messages() -> None:
    """OpenAI's automatic prefix cache: a request's entries end at its head and at each message; siblings sharing
    the system message (~2.5K tokens) with a writer in flight wait for it."""
    from agentcache.session._pipeline import SessionPipeline
    from tests.test_proxy_support import chat_body

    async def run() -> None:
        co = Coalescer()
        planned = [
            SessionPipeline("openai").prepare("openai.chat", chat_body([{"role": "user", "content": t}])).planned
            for t in TASKS[:2]
        ]
        first = co.claim("t", planned[0], provider="openai")
        second = co.claim("t", planned[1], provider="openai")
        assert first is not None and second is not None and not first.held and second.held
        assert second.saved_tokens > 2000
        first.release()  # the writer failed: the sibling goes at once, nothing saved
        hold = await second.wait()
        assert hold is not None and hold.outcome == "writer_failed" and hold.saved_tokens == 0

    asyncio.run(run())
