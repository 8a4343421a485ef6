"""A replica continues another replica's session and plans exactly as the first would have: the session's whole
state (the forms sent, tool memory, learned client habits, routing key, times) travels through Redis as the
pipeline's snapshot, written after each commit.

Real traffic: SWE-agent's trajectory (a client that rewrites old tool outputs, so the pipeline learns where the
next rewrite comes and places a ``rewrite`` breakpoint) sent as Anthropic Messages with tau-bench's airline tools
reshuffled per turn (so the first-seen tool order must travel too). Reference: one proxy with the in-memory
store. Then replica A serves the first turns and replica B the rest, through one ``redis-server``: B's upstream
bodies and turn reports equal the reference's, and B's learned client habits equal the reference's.
"""

from __future__ import annotations

import asyncio
import copy
import random
import uuid
from typing import Any

from agentcache._log import capture_logs
from agentcache.loaders import load
from agentcache.replay import convert

from .conftest import DATA, anthropic_tools
from .test_proxy_redis import redis_url  # noqa: F401  (the fixture)
from .test_proxy_support import FakeUpstream, proxy

H = {"x-api-key": "sk-ant-continuation", "x-agentcache-session": "swe-1"}
SPLIT = 6


def bodies() -> list[dict[str, Any]]:
    out = []
    for i, r in enumerate(
        load(DATA / "swe-agent" / "marshmallow-code__marshmallow-1867.function_calling.traj").records
    ):
        body = convert(r.api, r.body, "anthropic.messages")
        body.setdefault("max_tokens", 64)
        body["tools"] = anthropic_tools()  # the trajectory carries no schemas: the airline tools, reshuffled
        random.Random(i).shuffle(body["tools"])
        out.append(body)
    return out


def _turns(logs: list[dict[str, Any]]) -> list[tuple[Any, ...]]:
    return [
        (e["session_signal"]["turn"], e["reuse_boundary"]["cause"], tuple(e["repairs"]), tuple(e["markers"]))
        for e in logs
        if e["event"] == "proxy.request"
    ]


def test_replica_b_continues_replica_a_exactly(redis_url: str) -> None:  # noqa: F811
    seq = bodies()

    async def reference() -> tuple[list[Any], list[Any], Any]:
        fake = FakeUpstream()
        async with proxy(fake) as (client, state, _):
            with capture_logs() as logs:
                for body in seq:
                    assert (await client.post("/v1/messages", json=copy.deepcopy(body), headers=H)).status_code == 200
            learned = next(iter(state.store._live.values())).pipeline.state.learned
        return [s.json() for s in fake.requests], _turns(logs), learned

    async def replicas() -> tuple[list[Any], list[Any], Any]:
        fake = FakeUpstream()
        prefix = "c-" + uuid.uuid4().hex[:8]
        async with (
            proxy(fake, redis_url=redis_url, redis_prefix=prefix) as (a, _sa, _),
            proxy(fake, redis_url=redis_url, redis_prefix=prefix) as (b, sb, _),
        ):
            with capture_logs() as logs:
                for i, body in enumerate(seq):
                    client = a if i < SPLIT else b
                    assert (await client.post("/v1/messages", json=copy.deepcopy(body), headers=H)).status_code == 200
            learned = next(iter(sb.store._local.values())).pipeline.state.learned
        return [s.json() for s in fake.requests], _turns(logs), learned

    ref_bodies, ref_turns, ref_learned = asyncio.run(reference())
    got_bodies, got_turns, got_learned = asyncio.run(replicas())
    assert got_bodies == ref_bodies  # every upstream body, B's included, byte-for-byte in meaning
    assert got_turns == ref_turns
    assert got_learned == ref_learned and got_learned.rewrite_at is not None and got_learned.edit_points
    assert any("rewrite" in str(t) or len(t[3]) > 1 for t in got_turns[SPLIT:])  # B plans with A's lessons
