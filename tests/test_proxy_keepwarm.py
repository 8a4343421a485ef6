"""Keep-warm sending (opt-in): scheduled after a committed Anthropic turn when refreshing is cheaper than
rewriting, the last sent request with ``max_tokens: 0``, cancelled by the session's next request or its close."""

from __future__ import annotations

import asyncio
import time
import types
from collections.abc import AsyncIterator, Awaitable, Callable
from contextlib import asynccontextmanager
from typing import Any

import httpx
import pytest

from agentcache._config import Settings
from agentcache.policies import KeepWarmDecision
from agentcache.proxy import _core
from agentcache.proxy._app import create_app
from agentcache.proxy._config import ProxyConfig
from agentcache.proxy._keepwarm import KeepWarmer
from agentcache.proxy._state import ProxyState
from tests.test_proxy_support import ANTHROPIC_KEY, FakeUpstream, anthropic_body, conversation

HEADERS = {"x-api-key": ANTHROPIC_KEY, "anthropic-version": "2023-06-01", "x-agentcache-session": "kw-1"}


class Clock:
    """Wall-clock seconds the proxy sees (``time.time``), moved by the test."""

    def __init__(self) -> None:
        self.now = 1_000_000.0

    def install(self, monkeypatch: pytest.MonkeyPatch) -> None:
        fake = types.SimpleNamespace(time=lambda: self.now, perf_counter=time.perf_counter)
        monkeypatch.setattr(_core, "time", fake)


@asynccontextmanager
async def served(
    settings: Settings,
    fake: FakeUpstream,
    sleep: Callable[[float], Awaitable[Any]] | None = None,
    config: ProxyConfig | None = None,
) -> AsyncIterator[tuple[httpx.AsyncClient, ProxyState]]:
    """The proxy in-process in front of ``fake``; keep-warm waits go through ``sleep``."""
    app = create_app(config or ProxyConfig(), settings=settings, transport=fake.transport())
    state: ProxyState = app.state.proxy
    if sleep is not None:
        state.keep_warm._sleep = sleep
    transport = httpx.ASGITransport(app=app)
    async with state.running(), httpx.AsyncClient(transport=transport, base_url="http://p") as client:
        yield client, state


async def paused_turns(client: httpx.AsyncClient, clock: Clock, pause: float = 600.0) -> None:
    """Three turns of one conversation (1, 3 and 5 messages), each answered 200, ``pause`` seconds apart on
    ``clock``; a keep-warm scheduled between them runs (its sleeps return at once)."""
    for n in (1, 3, 5):
        r = await client.post("/v1/messages", json=anthropic_body(conversation(n)), headers=HEADERS)
        assert r.status_code == 200
        clock.now += pause
        await asyncio.sleep(0.05)


def _turns(fake: FakeUpstream) -> list[dict[str, Any]]:
    return [s.json() for s in fake.requests if s.path == "/v1/messages"]


def test_keep_warm_sends_the_last_request_prefill_only(monkeypatch: pytest.MonkeyPatch) -> None:
    """Three turns 10 minutes apart with 5m entries: the policy sends 2 refreshes (2 × 0.1 reads beat a
    1.25 rewrite), 270 s apart, each the last sent body with max_tokens 0 and the client's auth."""
    clock = Clock()
    clock.install(monkeypatch)
    delays: list[float] = []

    async def no_wait(seconds: float) -> None:
        delays.append(seconds)

    async def scenario() -> None:
        fake = FakeUpstream()
        async with served(Settings(keep_warm=True, ttl_policy="5m"), fake, no_wait) as (client, state):
            await paused_turns(client, clock)
            sent = _turns(fake)
            # turn 1 has no gap yet; from turn 2 on the median long gap is 600 s: 2 refreshes after each
            assert [b["max_tokens"] for b in sent] == [64, 64, 0, 0, 64, 0, 0]
            for turn, warm in ((sent[1], sent[2:4]), (sent[4], sent[5:7])):
                assert warm == [{**turn, "max_tokens": 0, "stream": False}] * 2
            assert all(s.headers["x-api-key"] == ANTHROPIC_KEY for s in fake.requests[-2:])
            # due 270 s and 540 s after the turn (the fake sleep takes no time: each wait is the full offset)
            assert delays[-2:] == pytest.approx([270.0, 540.0], abs=1.0)
            metrics = state.metrics.render().decode()
            assert 'agentcache_proxy_keep_warm_requests_total{outcome="sent"} 4.0' in metrics
            # keep-warm requests are no turns: their tokens are counted apart (source keep_warm)
            sample = state.metrics.registry.get_sample_value
            labels = {"provider": "anthropic", "model": "claude-opus-4-8", "kind": "cache_read"}
            assert (sample("agentcache_prompt_tokens_total", {**labels, "source": "keep_warm"}) or 0) > 0
            assert sample("agentcache_session_events_total", {"event": "turn"}) == 3
            assert len(state.keep_warm) == 0

    asyncio.run(scenario())


def test_next_request_and_close_cancel_pending_keep_warm(monkeypatch: pytest.MonkeyPatch) -> None:
    clock = Clock()
    clock.install(monkeypatch)
    release = asyncio.Event()

    async def wait_forever(seconds: float) -> None:
        await release.wait()

    async def scenario() -> None:
        fake = FakeUpstream()
        async with served(Settings(keep_warm=True, ttl_policy="5m"), fake, wait_forever) as (client, state):
            for n in (1, 3):
                await client.post("/v1/messages", json=anthropic_body(conversation(n)), headers=HEADERS)
                clock.now += 600
            assert len(state.keep_warm) == 1  # pending after turn 2
            await client.post("/v1/messages", json=anthropic_body(conversation(5)), headers=HEADERS)
            assert len(state.keep_warm) == 1  # turn 3 replaced it
            r = await client.post("/agentcache/v1/sessions/kw-1/close", headers=HEADERS)
            assert r.json()["closed"] is True
            await asyncio.sleep(0)
            assert len(state.keep_warm) == 0
            release.set()
            await asyncio.sleep(0.05)
            assert len(_turns(fake)) == 3  # nothing was sent for a moved-on or closed session

    asyncio.run(scenario())


def test_keep_warm_is_off_by_default(monkeypatch: pytest.MonkeyPatch) -> None:
    clock = Clock()
    clock.install(monkeypatch)

    async def scenario() -> None:
        fake = FakeUpstream()
        async with served(Settings(ttl_policy="5m"), fake) as (client, state):
            for n in (1, 3, 5):
                await client.post("/v1/messages", json=anthropic_body(conversation(n)), headers=HEADERS)
                clock.now += 600
            assert len(state.keep_warm) == 0 and len(_turns(fake)) == 3

    asyncio.run(scenario())


def test_no_keep_warm_in_front_of_a_local_engine(monkeypatch: pytest.MonkeyPatch) -> None:
    """``--engine llama``/``sglang``: the engine has no TTL to bridge, so nothing is scheduled."""
    clock = Clock()
    clock.install(monkeypatch)

    async def scenario() -> None:
        fake = FakeUpstream()
        settings = Settings(keep_warm=True, ttl_policy="5m")
        async with served(settings, fake, config=ProxyConfig(engine="llama")) as (client, state):
            for n in (1, 3, 5):
                await client.post("/v1/messages", json=anthropic_body(conversation(n)), headers=HEADERS)
                clock.now += 600
            assert len(state.keep_warm) == 0 and len(_turns(fake)) == 3

    asyncio.run(scenario())


def test_keeper_stops_after_a_refused_refresh_and_drops_a_stale_session() -> None:
    answers = [httpx.Response(200, json={"usage": {"input_tokens": 3, "cache_read_input_tokens": 5000}}),
               httpx.Response(429, json={"type": "error"})]  # fmt: skip
    seen: list[httpx.Request] = []

    def handle(request: httpx.Request) -> httpx.Response:
        seen.append(request)
        return answers[len(seen) - 1]

    outcomes: list[tuple[str, int | None]] = []

    async def no_wait(seconds: float) -> None:
        return None

    async def scenario() -> None:
        async with httpx.AsyncClient(transport=httpx.MockTransport(handle)) as client:
            keeper = KeepWarmer(
                lambda: client,
                lambda outcome, usage, model: outcomes.append((outcome, usage and usage.cache_read_tokens)),
                no_wait,
            )
            decision = KeepWarmDecision(True, 1.0, 1.0, 3, 0.0, 0.0, "test")
            body = {"model": "claude-opus-4-8", "max_tokens": 0, "messages": []}
            assert keeper.schedule("t/s", decision, "http://up/v1/messages", [(b"x-api-key", b"k")], body, lambda: True)
            await asyncio.sleep(0.05)
            assert outcomes == [("sent", 5000), ("failed", None)]  # the third is not tried after a refusal
            assert seen[0].headers["x-api-key"] == "k"
            outcomes.clear()
            assert keeper.schedule("t/s", decision, "http://up/v1/messages", [], body, lambda: False)
            await asyncio.sleep(0.05)
            assert outcomes == [("dropped", None)]
            assert not keeper.schedule("t/s", KeepWarmDecision(False, 0, 270, 0, 0, 0, "no"), "u", [], body, bool)
            await keeper.aclose()

    asyncio.run(scenario())


def test_keep_warm_body_skips_thinking_and_structured_output() -> None:
    from agentcache.session._pipeline import SessionPipeline

    pipe = SessionPipeline("anthropic")
    cases = [({}, True), ({"thinking": {"type": "enabled", "budget_tokens": 2048}}, False),
             ({"thinking": {"type": "disabled"}}, True), ({"output_format": {"type": "json"}}, False)]  # fmt: skip
    for extra, expect in cases:
        body = anthropic_body(conversation(1), **extra)
        pipe.commit(pipe.prepare("anthropic.messages", body))
        warm = pipe.keep_warm_body()
        assert (warm is not None) is expect
        if warm is not None:
            assert warm == {**(pipe.sent_body or {}), "max_tokens": 0, "stream": False}
