"""A loss the upstream reported on traffic the client's own requests could have read (its entry evicted early, a
fake clock past its TTL): the core's one diagnosis (a ``reported`` miss, :func:`agentcache.analysis._inferred.
provider_loss`) and every door that renders it — the recording audit's text, JSON and HTML, the proxy's live page
and its JSON report, and /metrics. Never "No cache misses" beside a bill that rewrote the prefix."""

from __future__ import annotations

import asyncio
import json
from pathlib import Path
from typing import Any

import httpx
import pytest
from typer.testing import CliRunner

from agentcache import audit
from agentcache._cli import app
from agentcache.loaders import load
from tests.test_proxy_support import ANTHROPIC_KEY, FakeUpstream, anthropic_body, anthropic_message, conversation, proxy

runner = CliRunner()

#: The client's three requests (top-level automatic marker): prompt tokens as the simulator estimates them, which
#: the scripted upstream reports back, so the readable prefix needs no scaling.
PROMPTS = (3175, 3217, 3384)


def _usages(drop_last: bool) -> list[dict[str, Any]]:
    """Turn 1 writes everything, turn 2 reads it; turn 3 reads nothing (``drop_last``: the entry was gone) or
    what it could."""
    out = [
        {"input_tokens": 0, "cache_creation_input_tokens": PROMPTS[0], "cache_read_input_tokens": 0},
        {"input_tokens": 0, "cache_creation_input_tokens": 42, "cache_read_input_tokens": PROMPTS[0]},
    ]
    read = 0 if drop_last else PROMPTS[1]
    out.append({"input_tokens": 0, "cache_creation_input_tokens": PROMPTS[2] - read, "cache_read_input_tokens": read})
    return out


def _bodies() -> list[dict[str, Any]]:
    msgs = conversation(6)
    return [anthropic_body(msgs[:n], cache_control={"type": "ephemeral"}) for n in (1, 3, 5)]


def _recording(tmp_path: Path, drop_last: bool) -> Path:
    lines = []
    for i, (body, usage) in enumerate(zip(_bodies(), _usages(drop_last), strict=True)):
        lines.append(
            json.dumps({"session": "s", "api": "anthropic.messages", "at": 10.0 * i, "body": body, "usage": usage})
        )
    path = tmp_path / "rec.jsonl"
    path.write_text("\n".join(lines) + "\n")
    return path


def test_reported_loss_is_a_miss_with_tokens_cost_and_evidence(tmp_path: Path) -> None:
    report = audit(load(_recording(tmp_path, True)).records)
    turns = {t.request: t for t in report.turns}
    assert [turns[i].arms["as_sent"].prompt_tokens for i in range(3)] == list(PROMPTS)
    assert turns[2].arms["as_sent"].cache_read_tokens == PROMPTS[1]  # the client's own traffic could read it
    [miss] = report.misses
    assert (miss.arm, miss.cause, miss.request, miss.tokens_lost, miss.inferred) == (
        "reported",
        "unexplained",
        2,
        3217,
        True,
    )
    assert miss.detail is not None and miss.detail.startswith("reads stopped at 0 of 3,384 tokens")
    # a write costs 1.25x the base input price and a read 0.1x: what the loss cost beyond reading it
    written = turns[0].arms["reported"]
    base = written.cost_usd / (1.25 * PROMPTS[0])
    assert miss.usd_lost == pytest.approx(3217 * base * 1.15)
    doc = report.to_dict()
    assert doc["misses"] == [miss.to_dict()] and doc["misses"][0]["usd_lost"] == round(miss.usd_lost, 6)


def test_no_reported_miss_when_the_upstream_read_what_it_could(tmp_path: Path) -> None:
    path = _recording(tmp_path, False)
    assert audit(load(path).records).misses == []
    out = runner.invoke(app, ["audit", str(path)])
    assert out.exit_code == 0 and "No cache misses." in out.output and "lost by the upstream" not in out.output


def test_every_recording_door_names_the_loss(tmp_path: Path) -> None:
    path = _recording(tmp_path, True)
    usd = f"{audit(load(path).records).misses[0].usd_lost:.4f}"
    out = runner.invoke(app, ["audit", str(path), "--html", str(tmp_path / "r.html")])
    assert out.exit_code == 0, out.output
    text = " ".join(out.output.split())
    assert "No cache misses" not in text and "Reuse lost by the upstream (reported usage" in text
    assert "Misses by arm and cause (simulated arms; reported: the upstream's usage)" in text
    row = text.split("Reuse lost by the upstream")[1]
    assert "s 2 unexplained 3,217" in " ".join(row.replace("│", " ").split()) and usd in row
    assert "reads stopped at 0 of 3,384" in row
    html = (tmp_path / "r.html").read_text()
    table = html.split('id="upstream-losses"')[1].split("</table>")[0]
    assert "<code>unexplained</code>" in table and ">3,217<" in table and usd in table
    doc = json.loads(runner.invoke(app, ["audit", str(path), "--json"]).output)
    assert [(m["arm"], m["tokens_lost"]) for m in doc["misses"]] == [("reported", 3217)]


def test_live_page_json_and_metrics_name_the_loss() -> None:
    asyncio.run(_live())


async def _live() -> None:
    usages = iter(_usages(True))

    def answer(seen: Any) -> httpx.Response | None:
        if seen.path != "/v1/messages":
            return None
        return httpx.Response(200, json=anthropic_message(next(usages)))

    async with proxy(FakeUpstream(fault=answer)) as (client, state, _fake):
        headers = {"x-api-key": ANTHROPIC_KEY, "x-agentcache-session": "main"}
        for body in _bodies():
            assert (await client.post("/v1/messages", json=body, headers=headers)).status_code == 200
        doc = state.report.to_dict()
        reported = [m for m in doc["misses"] if m["arm"] == "reported"]
        assert [(m["request"], m["cause"]) for m in reported] == [(2, "unexplained")]
        assert reported[0]["tokens_lost"] > 1024 and reported[0]["usd_lost"] > 0
        html = (await client.get("/agentcache/", headers={"x-api-key": ANTHROPIC_KEY})).text
        causes = html.split('<table id="causes">')[1].split("</table>")[0]
        assert "<td>reported miss</td><td><code>unexplained</code></td>" in causes
        assert f">{reported[0]['tokens_lost']:,}<" in causes and "None: every request" not in html
        assert "3 turns · reported (as the upstream reported it) ·" in html  # the bars: reported, not simulated
        assert f"turn 2: reported miss unexplained: {reported[0]['tokens_lost']:,} tokens lost" in html
        metrics = (await client.get("/metrics")).text
        assert 'arm="reported",cause="unexplained"' in metrics
