"""Shared state in a real ``redis-server``: two proxy instances serve one session alternately with consistent
state (sessions, prefix index, generations), and the proxy keeps forwarding when Redis is down.

Tests that need the server skip when ``redis-server`` is not installed (``apt-get install -y redis-server``),
except under CI (``$CI`` set), where ``.ci/run`` installs it and a missing one fails.
"""

from __future__ import annotations

import asyncio
import contextlib
import os
import shutil
import socket
import subprocess
import time
import uuid
from collections.abc import AsyncIterator, Iterator
from typing import Any

import httpx
import pytest

from agentcache._log import capture_logs
from tests import needs
from tests.test_proxy_support import ANTHROPIC_KEY, FakeUpstream, anthropic_body, conversation, proxy

REDIS = shutil.which("redis-server")
A = {"x-api-key": ANTHROPIC_KEY}


def _free_port() -> int:
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        port: int = s.getsockname()[1]
        return port


@pytest.fixture(scope="module")
def redis_url() -> Iterator[str]:
    if REDIS is None:
        if os.environ.get("CI"):  # in CI the Redis tests must run: .ci/run installs redis-server
            pytest.fail("CI without redis-server; see .ci/run")
        pytest.skip(needs.REDIS)
    port = _free_port()
    proc = subprocess.Popen(
        [REDIS, "--port", str(port), "--bind", "127.0.0.1", "--save", "", "--appendonly", "no"],
        stdout=subprocess.DEVNULL,
        stderr=subprocess.DEVNULL,
    )
    try:
        deadline = time.monotonic() + 10
        while True:
            try:
                with socket.create_connection(("127.0.0.1", port), timeout=0.2) as conn:
                    conn.sendall(b"PING\r\n")
                    if conn.recv(16).startswith(b"+PONG"):
                        break
            except OSError:
                pass
            if time.monotonic() > deadline:
                raise RuntimeError("redis-server did not start")
            time.sleep(0.05)
        yield f"redis://127.0.0.1:{port}/0"
    finally:
        proc.terminate()
        proc.wait(timeout=10)


def run(coro: Any) -> Any:
    return asyncio.run(coro)


@contextlib.asynccontextmanager
async def replicas(fake: FakeUpstream, url: str) -> AsyncIterator[tuple[tuple[Any, Any], tuple[Any, Any]]]:
    """Two proxies in front of ``fake`` sharing the Redis at ``url`` under a key prefix of their own:
    ``((client, state), (client, state))``."""
    prefix = "t-" + uuid.uuid4().hex[:8]
    async with (
        proxy(fake, redis_url=url, redis_prefix=prefix) as (one, state1, _),
        proxy(fake, redis_url=url, redis_prefix=prefix) as (two, state2, _),
    ):
        yield (one, state1), (two, state2)


def test_two_replicas_serve_one_inferred_session_alternately(redis_url: str) -> None:
    async def scenario() -> None:
        fake = FakeUpstream()
        async with replicas(fake, redis_url) as ((one, state1), (two, state2)):
            first = anthropic_body(conversation(1))
            sids = []
            with capture_logs() as logs:
                for i, n in enumerate((1, 3, 5, 7)):
                    body = anthropic_body(conversation(n))
                    if n == 5:  # replica one repairs a tool order it only knows from replica two's commit
                        body["tools"] = list(reversed(body["tools"]))
                    client = one if i % 2 == 0 else two
                    r = await client.post("/v1/messages", json=body, headers=A)
                    assert r.status_code == 200
                    sids.append((r.headers["x-agentcache-session"], r.headers["x-agentcache-generation"]))
            assert len(set(sids)) == 1 and sids[0][1] == "0"
            assert [t["name"] for t in fake.requests[2].json()["tools"]] == [t["name"] for t in first["tools"]]
            turns = [e["session_signal"]["turn"] for e in logs if e["event"] == "proxy.request"]
            assert turns == [0, 1, 2, 3]
            assert [e["reason"] for e in logs if e["event"] == "session.open"] == ["new"]
            breaks = state1.report.to_dict()["breaks"]
            assert [(b["cause"], b["repaired"]) for b in breaks] == [("tools.reordered", True)]
            # both replicas now hold the session at the same version
            (k1, s1), (k2, s2) = next(iter(state1.store._local.items())), next(iter(state2.store._local.items()))  # type: ignore[attr-defined]
            assert k1 == k2 and s1.version == 3 and s2.version == 4 and s2.turns == 4

    run(scenario())


def test_a_continuing_turn_reads_only_its_deepest_heads(redis_url: str) -> None:
    """``find`` reads the keyed heads of a request's deepest items first: a turn that continues its session (on
    either replica) makes one script call of at most FIND_WINDOW fields; a new conversation and a changed tool list
    (no head under the new prefix) fall back to every checkpoint, and still find what they continue; the turn after
    finds its head under that prefix again."""
    from agentcache.session._redis import FIND_WINDOW

    async def scenario() -> None:
        fake = FakeUpstream()
        async with replicas(fake, redis_url) as ((one, state1), (two, state2)):
            calls: list[int] = []
            for state in (state1, state2):
                hits = state.store._hits  # type: ignore[attr-defined]

                async def counting(tenant: str, lookups: Any, hits: Any = hits) -> Any:
                    lookups = list(lookups)
                    calls.append(len(lookups))
                    return await hits(tenant, lookups)

                state.store._hits = counting  # type: ignore[attr-defined]
            per_turn, sids = [], set()
            for i, n in enumerate((21, 23, 25, 27, 29)):
                body = anthropic_body(conversation(n))
                if n >= 27:
                    body["tools"] = list(reversed(body["tools"]))
                calls.clear()
                r = await (one if i % 2 == 0 else two).post("/v1/messages", json=body, headers=A)
                assert r.status_code == 200
                per_turn.append(list(calls))
                sids.add(r.headers["x-agentcache-session"])
            assert len(sids) == 1
            window = [FIND_WINDOW]
            assert per_turn[1] == per_turn[2] == per_turn[4] == window
            assert per_turn[0][0] == FIND_WINDOW and per_turn[0][1] > 3 * 20  # new: every checkpoint, second call
            assert per_turn[3][0] == FIND_WINDOW and per_turn[3][1] > 3 * 26  # a new prefix: the chain, second call

    run(scenario())


def test_close_on_one_replica_ends_the_generation_everywhere(redis_url: str) -> None:
    async def scenario() -> None:
        fake = FakeUpstream(gate=asyncio.Event())
        fake.gate.set()  # type: ignore[union-attr]
        prefix = "t-" + uuid.uuid4().hex[:8]
        async with (
            proxy(fake, redis_url=redis_url, redis_prefix=prefix) as (one, s1, _),
            proxy(fake, redis_url=redis_url, redis_prefix=prefix) as (two, s2, _),
        ):
            h = {**A, "x-agentcache-session": "job"}
            await one.post("/v1/messages", json=anthropic_body(conversation(1)), headers=h)
            # replica two starts a request; while the upstream answers, replica one closes the session
            fake.gate.clear()  # type: ignore[union-attr]
            pending = asyncio.create_task(two.post("/v1/messages", json=anthropic_body(conversation(3)), headers=h))
            while len(fake.requests) < 2:
                await asyncio.sleep(0.01)
            r = await one.post("/agentcache/v1/sessions/job/close", headers=A)
            assert r.json() == {"session_id": "job", "closed": True, "generation": 0}
            assert (await two.post("/agentcache/v1/sessions/job/close", headers=A)).status_code == 404  # once only
            fake.gate.set()  # type: ignore[union-attr]
            assert (await pending).status_code == 200
            assert "agentcache_proxy_stale_commits_total 1.0" in s2.metrics.render().decode()
            r = await two.post("/v1/messages", json=anthropic_body(conversation(5)), headers=h)
            assert r.headers["x-agentcache-generation"] == "1"
            r = await one.post("/v1/messages", json=anthropic_body(conversation(7)), headers=h)
            assert r.headers["x-agentcache-generation"] == "1"
            assert s1.report.to_dict()["breaks"] == []

    run(scenario())


def test_idle_sweep_closes_once_across_replicas(redis_url: str) -> None:
    async def scenario() -> None:
        prefix = "t-" + uuid.uuid4().hex[:8]
        fake = FakeUpstream()
        async with (
            proxy(fake, redis_url=redis_url, redis_prefix=prefix, idle_timeout=0.2) as (one, s1, _),
            proxy(fake, redis_url=redis_url, redis_prefix=prefix, idle_timeout=0.2) as (_, s2, _),
        ):
            await one.post("/v1/messages", json=anthropic_body(conversation(1)), headers=A)
            assert await s1.sweep() == [] and await s2.sweep() == []
            await asyncio.sleep(0.3)
            closed = [*await s2.sweep(), *await s1.sweep()]
            assert len(closed) == 1 and closed[0].turns == 1

    run(scenario())


def test_redis_down_keeps_forwarding() -> None:
    async def scenario() -> None:
        dead = f"redis://127.0.0.1:{_free_port()}/0"
        with capture_logs() as logs:
            async with proxy(redis_url=dead, redis_timeout=0.2):
                pass
        assert [e["event"] for e in logs if e["log_level"] == "warning"] == ["store.unreachable"]  # said at start
        async with proxy(redis_url=dead, redis_timeout=0.2) as (client, state, fake):
            started = time.monotonic()
            for n in (1, 3, 5):
                raw = httpx.Request("POST", "/", json=anthropic_body(conversation(n))).read()
                r = await client.post("/v1/messages", content=raw, headers={**A, "content-type": "application/json"})
                assert r.status_code == 200
                assert fake.requests[-1].body == raw  # sent unchanged
            assert time.monotonic() - started < 2.0  # the breaker stops waiting on a dead server
            metrics = state.metrics.render().decode()
            assert 'agentcache_proxy_store_errors_total{op="find"} 3.0' in metrics
            assert 'agentcache_proxy_fail_open_total{stage="prepare"} 3.0' in metrics
            health = await client.get("/agentcache/v1/health")  # still serving: degraded, not down
            assert health.status_code == 200
            assert health.json() == {"status": "degraded", "store": "redis", "store_ok": False}

    run(scenario())


def test_health_with_a_live_redis(redis_url: str) -> None:
    async def scenario() -> None:
        async with proxy(redis_url=redis_url) as (client, _state, _fake):
            r = await client.get("/agentcache/v1/health")
            assert r.json() == {"status": "ok", "store": "redis", "store_ok": True}

    run(scenario())


def test_an_outage_is_two_lines_a_warning_and_when_it_answers_again() -> None:
    """A store that fails is marked down for ``retry_after`` s (one warning per failed call); the first call that
    succeeds afterwards says so once (``store.available``, with how long it was out)."""
    from agentcache.session._redis import RedisStore
    from agentcache.session._store import StoreUnavailable

    class Script:
        def __init__(self) -> None:
            self.fail = True

        def register_script(self, text: str) -> Any:
            async def call(**kwargs: Any) -> Any:
                if self.fail:
                    raise ConnectionError("refused")
                return []

            return call

    client = Script()
    store = RedisStore(client, retry_after=0.0)

    async def scenario() -> list[dict[str, Any]]:
        with capture_logs() as logs:
            with pytest.raises(StoreUnavailable):
                await store._call("find", lambda: store._find(keys=["k"], args=[""]))
            client.fail = False
            for _ in range(2):
                assert await store._call("find", lambda: store._find(keys=["k"], args=[""])) == []
        return logs

    events = [(e["event"], e.get("op")) for e in run(scenario())]
    assert events == [("store.unavailable", "find"), ("store.available", "find")]
