"""Responses without usage (aider through LiteLLM streams OpenAI Chat without ``stream_options.include_usage``):
every door says "usage not reported by the upstream for N of M requests" instead of a 0% hit rate and $0 that
read as real — the proxy's live page and JSON report, /metrics, and the recording audit's text, JSON and HTML."""

from __future__ import annotations

import asyncio
import json
from pathlib import Path
from typing import Any

import httpx
from typer.testing import CliRunner

from agentcache._cli import app
from tests.test_proxy_support import chat_body, chat_chunks, conversation, proxy, sse_response

runner = CliRunner()
HEADERS = {"authorization": "Bearer sk-test-openai", "x-agentcache-session": "aider"}
USAGE = {"prompt_tokens": 3000, "completion_tokens": 3, "prompt_tokens_details": {"cached_tokens": 2048}}


def _messages(n: int) -> list[dict[str, Any]]:
    return [{"role": m["role"], "content": m["content"]} for m in conversation(n)]


def test_live_page_json_and_metrics_say_usage_was_not_reported() -> None:
    asyncio.run(_live(reported=False))


def test_live_counts_only_the_requests_without_usage() -> None:
    asyncio.run(_live(reported=True))


async def _live(reported: bool) -> None:
    calls = iter(range(3))

    def answer(seen: Any) -> httpx.Response | None:
        if seen.path != "/v1/chat/completions":
            return None
        last = next(calls) == 2
        return sse_response(chat_chunks(USAGE)[: 3 if reported and last else 2], done=True)

    from tests.test_proxy_support import FakeUpstream

    async with proxy(FakeUpstream(fault=answer)) as (client, state, _fake):
        for n in (1, 3, 5):
            r = await client.post("/v1/chat/completions", json=chat_body(_messages(n), stream=True), headers=HEADERS)
            assert r.status_code == 200 and "Hello" in r.text
        missing = 2 if reported else 3
        assert state.report.to_dict()["usage_not_reported"] == {"requests": missing, "of": 3}
        html = (await client.get("/agentcache/", headers=HEADERS)).text
        assert f"not reported by the upstream for {missing} of 3 requests" in html
        if not reported:  # nothing reported: no 0.0% hit rate and $0.0000 that read as real
            assert "<dt>hit rate (reported)</dt><dd>—</dd>" in html and "<dt>spent (reported)</dt><dd>—</dd>" in html
            assert "0.0%" not in html.split('id="session-tree"')[1].split("</table>")[0]
            assert "3 of 3 requests: no reported figures" in html and "cover the other" not in html
        else:
            assert "<dt>hit rate (reported)</dt><dd>68.3%</dd>" in html  # 2,048 of 3,000: only the reported one
            assert "2 of 3 requests: spent and hit rate cover the other 1" in html
        metrics = (await client.get("/metrics")).text
        assert f'agentcache_usage_unreported_total{{provider="openai"}} {missing}.0' in metrics


def test_recording_audit_says_usage_was_not_reported(tmp_path: Path) -> None:
    lines = []
    for i, n in enumerate((1, 3, 5)):
        obj: dict[str, Any] = {"session": "s", "api": "openai.chat", "at": 10.0 * i, "body": chat_body(_messages(n))}
        if i == 2:
            obj["usage"] = USAGE
        lines.append(json.dumps(obj))
    path = tmp_path / "rec.jsonl"
    path.write_text("\n".join(lines) + "\n")
    out = runner.invoke(app, ["audit", str(path), "--html", str(tmp_path / "r.html")])
    assert out.exit_code == 0, out.output
    assert "usage not reported by the upstream for 2 of 3 requests" in " ".join(out.output.split())
    doc = json.loads(runner.invoke(app, ["audit", str(path), "--json"]).output)
    assert doc["usage_not_reported"] == {"requests": 2, "of": 3} and doc["totals"]["reported"]["requests"] == 1
    assert doc["totals"]["reported"]["hit_rate"] == round(2048 / 3000, 6)
    html = (tmp_path / "r.html").read_text()
    assert "Usage not reported by the upstream for 2 of 3 requests" in html
