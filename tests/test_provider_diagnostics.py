"""Provider-reported miss reasons (setting ``provider_diagnostics``): agentcache asks the provider why a request
missed (Anthropic cache diagnostics, OpenAI prompt cache diagnostics), reads the answer, and records it beside its
own cause with their agreement, through the proxy and through ``wrap()``, in ``/metrics`` and in the audit report.

The fake upstream implements the documented fields (platform.claude.com/docs/en/build-with-claude/cache-diagnostics;
anthropic SDK ``types/diagnostics.py``): it keeps a fingerprint (model, tools, system, messages) per response id of
every request that carries ``diagnostics``, and answers ``diagnostics.cache_miss_reason`` for the first divergence
from the request named by ``previous_message_id`` (``null`` when there is none).
"""

from __future__ import annotations

import asyncio
import json
from collections.abc import Iterator
from pathlib import Path
from typing import Any

import anthropic
import httpx
import httpx2
import pytest

import agentcache
from agentcache import Sessions
from agentcache._audit import audit
from agentcache._config import Settings
from agentcache.loaders import load
from agentcache.model._provider import compare, expected_reasons, read_diagnosis
from agentcache.proxy._app import create_app
from agentcache.proxy._config import ProxyConfig
from tests.conftest import anthropic_messages, anthropic_tools, policy

BETA = "cache-diagnosis-2026-04-07"
HEADERS = {"x-api-key": "sk-ant-test", "anthropic-version": "2023-06-01"}


def _unmarked(value: Any) -> Any:
    if isinstance(value, dict):
        return {k: _unmarked(v) for k, v in value.items() if k != "cache_control"}
    if isinstance(value, list):
        return [_unmarked(v) for v in value]
    return value


def _text(value: Any) -> Any:
    """A system prompt or message content as its text blocks (a string and a one-block list are the same prompt)."""
    value = _unmarked(value)
    return [{"type": "text", "text": value}] if isinstance(value, str) else value


class DiagnosingUpstream:
    """Anthropic Messages with cache diagnostics, as documented (see the module docstring)."""

    def __init__(self) -> None:
        self.fingerprints: dict[str, dict[str, Any]] = {}
        self.requests: list[tuple[dict[str, str], dict[str, Any]]] = []

    def answer(self, headers: dict[str, str], body: dict[str, Any]) -> dict[str, Any]:
        self.requests.append((headers, body))
        rid = f"msg_{len(self.requests)}"
        usage = {
            "input_tokens": 100,
            "cache_read_input_tokens": 0,
            "cache_creation_input_tokens": 0,
            "output_tokens": 2,
        }
        out: dict[str, Any] = {
            "id": rid,
            "type": "message",
            "role": "assistant",
            "model": body.get("model"),
            "content": [{"type": "text", "text": "ok"}],
            "stop_reason": "end_turn",
            "stop_sequence": None,
            "usage": usage,
        }
        if "diagnostics" not in body:
            return out
        print_ = {
            "model": body.get("model"),
            "tools": _unmarked(body.get("tools") or []),
            "system": _text(body.get("system") or []),
            "messages": [{"role": m["role"], "content": _text(m["content"])} for m in body["messages"]],
        }
        self.fingerprints[rid] = print_
        prev_id = body["diagnostics"].get("previous_message_id")
        out["diagnostics"] = None if prev_id is None else self._compare(self.fingerprints.get(prev_id), print_)
        return out

    @staticmethod
    def _compare(prev: dict[str, Any] | None, cur: dict[str, Any]) -> dict[str, Any] | None:
        if prev is None:
            return {"cache_miss_reason": {"type": "previous_message_not_found"}}
        missed = {"cache_missed_input_tokens": 1234}
        for part, reason in (("model", "model_changed"), ("tools", "tools_changed"), ("system", "system_changed")):
            if prev[part] != cur[part]:
                return {"cache_miss_reason": {"type": reason, **missed}}
        if cur["messages"][: len(prev["messages"])] != prev["messages"]:
            return {"cache_miss_reason": {"type": "messages_changed", **missed}}
        return None  # appended only: no divergence

    async def handle(self, request: httpx.Request) -> httpx.Response:
        body = json.loads(await request.aread())
        return httpx.Response(200, json=self.answer(dict(request.headers), body))

    def handle_sync(self, request: Any) -> Any:
        """The same for the anthropic SDK's own HTTP client (``httpx2``)."""
        return httpx2.Response(200, json=self.answer(dict(request.headers), json.loads(request.read())))


def body(messages: list[dict[str, Any]], system: str | None = None, tools: Any = None) -> dict[str, Any]:
    return {
        "model": "claude-opus-4-8",
        "max_tokens": 64,
        "system": system if system is not None else policy(),
        "tools": tools if tools is not None else anthropic_tools(),
        "messages": messages,
    }


def script() -> list[dict[str, Any]]:
    """Five turns of one conversation: appended, appended, system edited, tools reordered, history edited."""
    edited = anthropic_messages(7)
    edited[0] = {**edited[0], "content": "A different first question."}
    return [
        body(anthropic_messages(1)),
        body(anthropic_messages(3)),
        body(anthropic_messages(5), system=policy() + "\nNew rule: be brief."),
        body(anthropic_messages(7), system=policy() + "\nNew rule: be brief.", tools=anthropic_tools()[::-1]),
        body(edited, system=policy() + "\nNew rule: be brief.", tools=anthropic_tools()[::-1]),
    ]


def check_wire(fake: DiagnosingUpstream) -> None:
    """Every request asked (beta header, previous response id), and the provider saw what the doc promises."""
    ids = [None, "msg_1", "msg_2", "msg_3", "msg_4"]
    assert [b["diagnostics"] for _, b in fake.requests] == [{"previous_message_id": i} for i in ids]
    assert all(BETA in h.get("anthropic-beta", "").split(",") for h, _ in fake.requests)


EXPECTED = [
    # (provider reason, agentcache's cause for what was sent, agrees)
    ("none", None, True),  # turn 2 extends turn 1
    ("system_changed", "system.changed", True),
    ("none", None, True),  # the tool reorder was repaired: the provider saw the same tools
    ("messages_changed", "messages.edited", True),
]


def test_through_the_proxy_metrics_and_report() -> None:
    fake = DiagnosingUpstream()

    async def scenario() -> str:
        app = create_app(
            ProxyConfig(), settings=Settings(provider_diagnostics=True), transport=httpx.MockTransport(fake.handle)
        )
        async with app.state.proxy.running():
            transport = httpx.ASGITransport(app=app)
            async with httpx.AsyncClient(transport=transport, base_url="http://proxy") as client:
                for b in script():
                    r = await client.post("/v1/messages", json=b, headers={**HEADERS, "x-agentcache-session": "s"})
                    assert r.status_code == 200
                    assert r.json()["content"][0]["text"] == "ok"  # the answer relayed untouched
                return (await client.get("/metrics")).text

    text = asyncio.run(scenario())
    check_wire(fake)
    for reason, _, agrees in EXPECTED:
        labels = f'agrees="{str(agrees).lower()}",provider="anthropic",reason="{reason}"'
        line = f"agentcache_provider_miss_reasons_total{{{labels}}}"
        assert line in text, reason
    counts = {
        ln.split("{")[1].split("}")[0]: float(ln.rsplit(" ", 1)[1])
        for ln in text.splitlines()
        if ln.startswith("agentcache_provider_miss_reasons_total{")
    }
    assert counts == {
        'agrees="true",provider="anthropic",reason="none"': 2.0,
        'agrees="true",provider="anthropic",reason="system_changed"': 1.0,
        'agrees="true",provider="anthropic",reason="messages_changed"': 1.0,
    }


def test_off_by_default_nothing_is_added() -> None:
    fake = DiagnosingUpstream()

    async def scenario() -> None:
        app = create_app(ProxyConfig(), settings=Settings(), transport=httpx.MockTransport(fake.handle))
        async with app.state.proxy.running():
            transport = httpx.ASGITransport(app=app)
            async with httpx.AsyncClient(transport=transport, base_url="http://proxy") as client:
                for b in script()[:2]:
                    await client.post("/v1/messages", json=b, headers=HEADERS)

    asyncio.run(scenario())
    assert all("diagnostics" not in b and "anthropic-beta" not in h for h, b in fake.requests)


def test_through_wrap_turn_reports_carry_both_causes() -> None:
    fake = DiagnosingUpstream()
    sessions = Sessions(settings=Settings(provider_diagnostics=True))
    http = httpx2.Client(transport=httpx2.MockTransport(fake.handle_sync))
    client = agentcache.wrap(anthropic.Anthropic(api_key="sk-ant-test", http_client=http), sessions=sessions)
    reports = []
    for b in script():
        msg = client.messages.create(**b, extra_headers={"anthropic-beta": "some-other-beta"})
        assert msg.content[0].text == "ok"  # type: ignore[union-attr]
        reports.append(client.agentcache_session.last_report)
    check_wire(fake)
    # the client's own beta header is kept, the diagnostics one joins it
    assert fake.requests[0][0]["anthropic-beta"].split(",") == ["some-other-beta", BETA]
    assert reports[0] is not None and reports[0].provider_miss is None  # the opt-in first request compares nothing
    got = [
        (r.provider_miss.reason, r.provider_miss.ours, r.provider_miss.agrees)
        for r in reports[1:]
        if r and r.provider_miss
    ]
    assert got == EXPECTED
    assert reports[2] is not None and reports[2].provider_miss is not None
    assert reports[2].provider_miss.missed_tokens == 1234
    assert reports[3] is not None and "tools.reordered" in reports[3].repairs


def test_audit_reads_recorded_diagnostics(tmp_path: Path) -> None:
    """Recorded traffic carrying the provider's answers: the audit lists each miss beside its own cause (the
    client's request against its previous one, as recorded) and the agreement."""
    fake = DiagnosingUpstream()
    lines = []
    prev: str | None = None
    for i, b in enumerate(script()):
        sent = {**b, "diagnostics": {"previous_message_id": prev}}
        response = fake.answer({}, sent)
        prev = response["id"]
        lines.append(
            json.dumps(
                {"session": "s", "api": "anthropic.messages", "at": 10.0 * i, "body": sent, "response": response}
            )
        )
    path = tmp_path / "recorded.jsonl"
    path.write_text("\n".join(lines) + "\n")
    report = audit(load(path).records).to_dict()
    pd = report["provider_diagnostics"]
    got = [(m["request"], m["reason"], m["ours"], m["agrees"]) for m in pd["misses"]]
    # as recorded, the tools really were reordered at request 3: both name the tools
    assert got == [
        (2, "system_changed", "system.changed", True),
        (3, "tools_changed", "tools.reordered", True),
        (4, "messages_changed", "messages.edited", True),
    ]
    assert (pd["compared"], pd["agree"], pd["agreement"]) == (3, 3, 1.0)
    assert pd["misses"][0]["missed_tokens"] == 1234
    assert report["models"] == [
        {
            "provider": "anthropic",
            "model": "claude-opus-4-8",
            "known": True,
            "priced_as": "claude-opus-4-8",
            "requests": 5,
        }
    ]


def test_openai_diagnostics_read_from_responses_and_asked_on_gpt_5_6() -> None:
    """OpenAI Responses: ``prompt_cache_options.comparison_response_id`` (gpt-5.6 and later) asked once a previous
    response is known, beside the client's own options; ``prompt_cache_diagnostics`` read from the answer."""
    seen: list[dict[str, Any]] = []

    def handle(request: httpx.Request) -> httpx.Response:
        b = json.loads(request.read())
        seen.append(b)
        n = len(seen)
        diag = (
            {"type": "cache_hit"}
            if n == 2
            else {"type": "cache_miss", "reason": "tools_changed", "cache_missed_tokens": 900}
        )
        return httpx.Response(
            200,
            json={
                "id": f"resp_{n}",
                "object": "response",
                "created_at": 0,
                "model": b["model"],
                "status": "completed",
                "output": [],
                "parallel_tool_calls": True,
                "tool_choice": "auto",
                "tools": [],
                "usage": {
                    "input_tokens": 2000,
                    "input_tokens_details": {"cached_tokens": 0},
                    "output_tokens": 1,
                    "output_tokens_details": {"reasoning_tokens": 0},
                    "total_tokens": 2001,
                },
                "prompt_cache_diagnostics": diag if n > 1 else None,
            },
        )

    import openai

    sessions = Sessions(settings=Settings(provider_diagnostics=True))
    http = httpx.Client(transport=httpx.MockTransport(handle))
    client = agentcache.wrap(openai.OpenAI(api_key="sk-test", http_client=http), sessions=sessions)
    tools = [
        {"type": "function", "name": n, "description": "d", "parameters": {"type": "object", "properties": {}}}
        for n in ("a", "b")
    ]
    inputs = [[{"role": "user", "content": policy()}]]
    inputs.append([*inputs[0], {"role": "user", "content": "more"}])
    reports = []
    for i, (inp, tl) in enumerate(
        ((inputs[0], tools), (inputs[1], tools), (inputs[1], [*tools, {**tools[0], "name": "c"}]))
    ):
        extra: dict[str, Any] = {"prompt_cache_options": {"mode": "implicit"}} if i == 2 else {}
        client.responses.create(model="gpt-5.6", input=inp, tools=tl, **extra)  # type: ignore[arg-type]
        reports.append(client.agentcache_session.last_report)
    assert "prompt_cache_options" not in seen[0]  # no previous response yet: nothing to compare with
    assert seen[1]["prompt_cache_options"]["comparison_response_id"] == "resp_1"
    assert seen[2]["prompt_cache_options"] == {"mode": "implicit", "comparison_response_id": "resp_2"}
    misses = [r.provider_miss for r in reports]
    assert misses[0] is None
    assert misses[1] is not None and (misses[1].reason, misses[1].ours, misses[1].agrees) == ("cache_hit", None, True)
    assert misses[2] is not None and (misses[2].reason, misses[2].ours, misses[2].agrees) == (
        "tools_changed",
        "tools.added",
        True,
    )
    assert misses[2].missed_tokens == 900


def test_mapping_of_causes_and_uninformative_answers() -> None:
    assert expected_reasons("anthropic", "tools.removed") == {"tools_changed"}
    assert expected_reasons("anthropic", "options.thinking") == {"unavailable"}
    assert expected_reasons("openai", "messages.compacted") == {"input_changed", "context_compacted"}
    lost = read_diagnosis({"diagnostics": {"cache_miss_reason": {"type": "previous_message_not_found"}}})
    assert lost is not None and compare(lost, "system.changed").agrees is None  # could not compare
    pending = read_diagnosis({"diagnostics": {"cache_miss_reason": None}})
    assert pending is not None and pending.reason == "pending" and compare(pending, None).agrees is None
    wrong = read_diagnosis(
        {"diagnostics": {"cache_miss_reason": {"type": "tools_changed", "cache_missed_input_tokens": 5}}}
    )
    assert wrong is not None and compare(wrong, "messages.edited").agrees is False
    assert read_diagnosis({"diagnostics": None}, requested=True) is not None
    assert read_diagnosis({"diagnostics": None}) is None


@pytest.fixture(autouse=True)
def _settings() -> Iterator[None]:
    yield
    agentcache._config.reset_settings()
