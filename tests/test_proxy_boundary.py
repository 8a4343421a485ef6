"""The pipeline route's one fail-open boundary (issue 25): whichever step of agentcache's own fails, the failure is
counted under that step's label, the upstream still gets the request (the client's own bytes when the failure
came before the send) and the client gets the upstream's answer."""

from __future__ import annotations

import asyncio
import json
from collections.abc import Callable
from typing import Any

import pytest

from agentcache.proxy._state import ProxyState
from agentcache.session import Turn, TurnState
from tests.test_proxy_robust import fail_open, requests_total
from tests.test_proxy_support import ANTHROPIC_KEY, anthropic_body, proxy

HEADERS = {"x-api-key": ANTHROPIC_KEY, "content-type": "application/json"}


def _boom(*args: Any, **kwargs: Any) -> Any:
    raise RuntimeError("boom")


async def _aboom(*args: Any, **kwargs: Any) -> Any:
    raise RuntimeError("boom")


def _break_parse(state: ProxyState, mp: pytest.MonkeyPatch) -> None:
    mp.setattr(state.parse_memo, "loads", _boom)


def _break_prepare(state: ProxyState, mp: pytest.MonkeyPatch) -> None:
    mp.setattr("agentcache.proxy._core.identity_of", _boom)


def _break_coalesce(state: ProxyState, mp: pytest.MonkeyPatch) -> None:
    mp.setattr(state.sessions, "claim", _boom)


def _break_commit(state: ProxyState, mp: pytest.MonkeyPatch) -> None:
    mp.setattr(Turn, "acommit", _aboom)


def _break_respond(state: ProxyState, mp: pytest.MonkeyPatch) -> None:
    mp.setattr("agentcache.proxy._core.UsageTap", _boom)


def _break_report(state: ProxyState, mp: pytest.MonkeyPatch) -> None:
    mp.setattr("agentcache.proxy._finish.count_response", _boom)


BREAKS: dict[str, tuple[Callable[[ProxyState, pytest.MonkeyPatch], None], bool]] = {
    # step: (how to break it, the upstream gets the client's bytes unchanged)
    "parse": (_break_parse, True),
    "prepare": (_break_prepare, True),
    "coalesce": (_break_coalesce, False),
    "commit": (_break_commit, False),
    "respond": (_break_respond, False),
    "report": (_break_report, False),
}


@pytest.mark.parametrize("step", list(BREAKS))
def test_a_failing_step_fails_open_under_its_label(step: str, monkeypatch: pytest.MonkeyPatch) -> None:
    breaks, unchanged = BREAKS[step]
    # A second request of one conversation: agentcache changes the body (markers), so "unchanged" can fail.
    first = anthropic_body([{"role": "user", "content": "question 0"}])
    second = anthropic_body(
        [
            {"role": "user", "content": "question 0"},
            {"role": "assistant", "content": "answer 0"},
            {"role": "user", "content": "question 1"},
        ]
    )
    raw = json.dumps(second).encode()
    turns: list[Turn] = []

    async def scenario() -> None:
        async with proxy() as (client, state, fake):
            assert (await client.post("/v1/messages", json=first, headers=HEADERS)).status_code == 200
            breaks(state, monkeypatch)
            begin = state.sessions.abegin

            async def spy(*args: Any, **kwargs: Any) -> Turn:
                turn = await begin(*args, **kwargs)
                turns.append(turn)
                return turn

            monkeypatch.setattr(state.sessions, "abegin", spy)
            r = await client.post("/v1/messages", content=raw, headers=HEADERS)
            assert r.status_code == 200 and r.json()["type"] == "message"
            assert len(fake.requests) == 2 and (fake.requests[-1].body == raw) is unchanged
            await asyncio.sleep(0.05)  # the after-last-byte step
            assert fail_open(state, step) == 1
            counted = 1 if step == "report" else 2  # the broken report step is the one that counts
            assert requests_total(state, "/v1/messages", "200") == counted

    asyncio.run(scenario())
    if step == "commit":  # a commit that broke leaves the turn uncommitted, and finished
        assert turns and turns[0].state == TurnState.FINISHED and turns[0].committed is False
