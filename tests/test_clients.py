"""Real agent CLIs (Claude Code, Codex CLI, opencode) through ``agentcache proxy`` against a scripted fake upstream,
compared with the same CLIs run directly against it (issue 11, "Real clients in CI").

Each client runs five scenarios (``tests/clients/drivers.py``: a fresh run, two continues/resumes of it, a fresh
run with the same opening prompt, a run that spawns a subagent), once directly and once through the proxy. The
traffic is generated here, at test time (these clients' prompts are not ours to commit).

Skipped when a client binary is absent, unless ``AGENTCACHE_REQUIRE_CLIENTS=1`` (CI), where absence fails. The
assertions cover the identity work of issue 11: client markers outrank agentcache's own, client-declared sessions
and parents, inference that never switches conversations, ``role: "system"`` shape kept.
"""

from __future__ import annotations

import json
import os
import tempfile
from collections import defaultdict
from pathlib import Path
from typing import Any
from urllib.parse import unquote

import pytest
from typer.testing import CliRunner

from agentcache import _cli as cli
from tests import needs
from tests.clients.drivers import CLIENTS, SCENARIOS, find_binary
from tests.clients.fake_upstream import unmarked
from tests.clients.harness import (
    Exchange,
    Trace,
    block_at,
    break_is_client_caused,
    is_empty_block,
    marker_order_ok,
    markers,
    masked,
    run_trace,
    write_offline,
)

_HOME = Path(tempfile.mkdtemp(prefix="agentcache-clients-"))


@pytest.fixture(scope="module", params=list(CLIENTS))
def runs(request: pytest.FixtureRequest) -> tuple[Trace, Trace]:
    """(direct, proxied) traces of one client; skipped (or failed under AGENTCACHE_REQUIRE_CLIENTS=1) without it."""
    name: str = request.param
    if find_binary(CLIENTS[name].binary) is None:
        message = needs.agent_cli(CLIENTS[name].binary)
        if os.environ.get("AGENTCACHE_REQUIRE_CLIENTS") == "1":
            pytest.fail(message)
        pytest.skip(message)
    home = _HOME / name  # the same path for both runs: clients embed their working directory in prompts
    return run_trace(name, "direct", home), run_trace(name, "proxy", home, record_dir=_HOME / f"{name}-record")


def _by_label(trace: Trace) -> dict[str, list[Exchange]]:
    out: dict[str, list[Exchange]] = defaultdict(list)
    for ex in trace.exchanges:
        out[ex.label].append(ex)
    return out


def test_runs_complete_with_the_same_outputs(runs: tuple[Trace, Trace]) -> None:
    direct, proxied = runs
    assert set(direct.outputs) == {s for s, _, _ in SCENARIOS}
    for scenario, out in direct.outputs.items():
        assert out.returncode == 0, (scenario, out.stderr[-2000:])
        assert "agentcache-fake answer: directive" in out.stdout, (scenario, out.stdout[-500:])
        through = proxied.outputs[scenario]
        assert through.returncode == 0, (scenario, through.stderr[-2000:])
        assert through.stdout == out.stdout, scenario
    assert "agentcache-fake answer: directive shell, 1 tool result(s)." in direct.outputs["fresh"].stdout
    labels = _by_label(direct)
    # Every conversation looped through one tool call; the subagent really ran (its own requests).
    assert len(labels["fresh:main"]) >= 6 and len(labels["same_prompt:main"]) >= 2
    assert len(labels["subagent:sub"]) >= 2, sorted(labels)


def test_same_requests_as_direct(runs: tuple[Trace, Trace]) -> None:
    direct, proxied = runs
    a, b = _by_label(direct), _by_label(proxied)
    assert {k: len(v) for k, v in a.items()} == {k: len(v) for k, v in b.items()}
    for key, exchanges in a.items():
        for mine, theirs in zip(exchanges, b[key], strict=True):
            assert mine.sent.path == theirs.sent.path
            assert masked(mine.sent.body) == masked(theirs.sent.body), key


def test_forwarded_request_is_the_clients_modulo_documented_edits(runs: tuple[Trace, Trace]) -> None:
    """Only cache markers and the ``messages.shape`` repair (a one-block list for the string it means) change."""
    _, proxied = runs
    assert proxied.exchanges
    for ex in proxied.exchanges:
        assert ex.forwarded is not None
        assert ex.forwarded.path == ex.sent.path
        assert unmarked(ex.forwarded.body) == unmarked(ex.sent.body), ex.label


def test_prompt_cache_key_kept(runs: tuple[Trace, Trace]) -> None:
    _, proxied = runs
    keys = [ex.sent.body.get("prompt_cache_key") for ex in proxied.exchanges]
    for ex in proxied.exchanges:
        assert ex.forwarded is not None
        assert ex.forwarded.body.get("prompt_cache_key") == ex.sent.body.get("prompt_cache_key"), ex.label
    if proxied.client == "codex":  # the one client here that sends its own key
        assert all(isinstance(k, str) and k for k in keys)


def test_client_markers_kept(runs: tuple[Trace, Trace]) -> None:
    _, proxied = runs
    for ex in proxied.exchanges:
        assert ex.forwarded is not None
        lost = set(markers(ex.sent.body)) - set(markers(ex.forwarded.body))
        assert not lost, (ex.label, sorted(lost))


def test_marker_rules(runs: tuple[Trace, Trace]) -> None:
    """At most 4 breakpoints, none on an empty text block, 1h TTLs before 5m ones (Anthropic's prompt caching
    rules: https://docs.anthropic.com/en/docs/build-with-claude/prompt-caching)."""
    _, proxied = runs
    for ex in proxied.exchanges:
        assert ex.forwarded is not None
        body = ex.forwarded.body
        found = markers(body)
        assert len(found) <= 4, (ex.label, sorted(found))
        assert not [p for p in found if is_empty_block(block_at(body, p))], ex.label
        assert marker_order_ok(body), ex.label


def test_role_system_messages_keep_their_shape(runs: tuple[Trace, Trace]) -> None:
    _, proxied = runs
    pairs = [
        (ex, i)
        for ex in proxied.exchanges
        for i, m in enumerate(ex.sent.body.get("messages") or [])
        if isinstance(m, dict) and m.get("role") == "system"
    ]
    if not pairs:
        pytest.skip(f"{needs.NOT_APPLICABLE}: the client sends no role: system messages")
    for ex, i in pairs:
        assert ex.forwarded is not None
        sent, forwarded = ex.sent.body["messages"][i], ex.forwarded.body["messages"][i]
        assert type(forwarded["content"]) is type(sent["content"]), (ex.label, i)


def test_sessions_are_the_true_conversations(runs: tuple[Trace, Trace]) -> None:
    """One session per conversation (fresh + its continues; the same-prompt run; the subagent run; its subagent);
    a side request (a title) never joins another run's session."""
    _, proxied = runs
    sessions: dict[str, set[str | None]] = defaultdict(set)
    for ex in proxied.exchanges:
        sessions[ex.label].add(ex.session)
    conversations = {k: v for k, v in sessions.items() if not k.endswith(":side")}
    assert all(len(v) == 1 and None not in v for v in conversations.values()), conversations
    ids = [next(iter(v)) for v in conversations.values()]
    assert len(set(ids)) == len(ids), conversations
    for key, side in sessions.items():
        if key.endswith(":side"):
            scenario = key.split(":")[0]
            others = {s for k, v in sessions.items() if not k.startswith(scenario + ":") for s in v}
            assert not side & others, (key, side)
            assert len(side) == 1


def test_subagents_are_linked_to_their_parent(runs: tuple[Trace, Trace]) -> None:
    _, proxied = runs
    labels = _by_label(proxied)
    parent = labels["subagent:main"][0].session
    child = labels["subagent:sub"][0].session
    assert parent is not None and child is not None and child != parent
    assert proxied.parents.get(child) == parent


def test_no_break_the_client_did_not_cause(runs: tuple[Trace, Trace]) -> None:
    """Every break the proxy reports is at a request where the client itself changed tools, system or an earlier
    message (markers ignored) against the session's previous request; never at a continuing request."""
    _, proxied = runs
    assert proxied.report["breaks"] is not None
    for brk in proxied.report["breaks"]:
        assert break_is_client_caused(proxied, brk), brk


def _audit_json(paths: list[Path]) -> dict[str, Any]:
    result = CliRunner().invoke(cli.app, ["audit", *map(str, paths), "--json"], catch_exceptions=False)
    assert result.exit_code == 0, result.stderr
    doc: dict[str, Any] = json.loads(result.stdout)
    return doc


def test_recording_audits_as_the_traffic(runs: tuple[Trace, Trace], tmp_path: Path) -> None:
    """``agentcache proxy --record DIR`` (issue 21, item 5): one line per generation request the client sent, side
    requests (titles, quota checks) included, with the body as the client sent it and as the proxy forwarded it;
    ``agentcache audit`` on the recording equals the audit of the same traffic captured in front of the proxy and
    audited offline (every arm's totals, every session, break and miss), sessions and parents as the proxy named
    them."""
    _, proxied = runs
    assert proxied.record_dir is not None
    files = sorted(proxied.record_dir.glob("*.jsonl"))
    lines = [json.loads(ln) for f in files for ln in f.read_text().splitlines()]

    def key(session: str, body: Any) -> tuple[str, str]:
        return session, json.dumps(body, sort_keys=True)

    sent = sorted(key(unquote(ex.session or ""), ex.sent.body) for ex in proxied.exchanges)
    assert sorted(key(ln["session"], ln["body"]) for ln in lines) == sent
    forwarded = sorted(
        key(unquote(ex.session or ""), ex.forwarded.body if ex.forwarded else None) for ex in proxied.exchanges
    )
    assert sorted(key(ln["session"], ln["sent"]) for ln in lines) == forwarded
    assert all(ln["status"] == 200 and ln["outcome"] == "complete" and "usage" in ln for ln in lines)
    sessions = {unquote(ex.session or "") for ex in proxied.exchanges}
    parents = {ln["session"]: ln.get("parent") for ln in lines}
    assert parents == {sid: proxied.parents.get(sid) for sid in sessions} and any(parents.values())

    traffic = tmp_path / "traffic.jsonl"
    assert write_offline(proxied, traffic) == len(lines)
    recorded, offline = _audit_json([proxied.record_dir]), _audit_json([traffic])
    assert recorded["totals"]["as_sent"]["requests"] == len(lines)
    assert recorded["totals"]["reported"]["prompt_tokens"] > 0
    assert {s["session"] for s in recorded["sessions"]} == sessions
    # the offline file's sessions are "traffic/<session>" (no recorded_by): the same once the stem is dropped
    assert json.loads(json.dumps(offline).replace('"traffic/', '"')) == recorded
