"""Real agent CLIs through ``agentcache proxy`` against a scripted fake upstream (issue 11, "Real clients in CI";
issue 23, real clients as they ship): Claude Code, Codex CLI and opencode at the versions CI pins, each also run
directly against the fake and compared; and every client at the newest version npm/PyPI serves (a release that
breaks a session shows up the day it ships), Qwen Code (OpenAI Chat mode; Anthropic mode with its 1-hour cache tier
and global scope) and aider (OpenAI and Anthropic modes, ``--cache-prompts``), through the proxy only.

Each client runs its scenarios (``tests/clients/drivers.py``: a fresh run, continues/resumes of it, a fresh run with
the same opening prompt, a run that spawns a subagent). The traffic is generated here, at test time (these clients'
prompts are not ours to commit); each client's traces once per module.

Skipped when a client binary is absent, unless ``AGENTCACHE_REQUIRE_CLIENTS=1`` (CI), where absence fails; a newest
build that is the pinned version is skipped. The assertions: one session per conversation (a continue joins it),
subagents linked where the client declares its parent, every client marker kept by value (TTL, scope), at most 4
markers, agentcache's arm never above the client's own traffic (``as_sent``), one ``date`` header,
``role: "system"`` shapes kept (on Anthropic, a repair may re-send the block form the client itself sent before).
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
from tests.clients.drivers import BUILDS, CLIENTS, PINNED, find_binary
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
#: (client, build) pairs: every client at both builds (aider from PyPI: newest only).
RUNS = [(name, build) for name in CLIENTS for build in (("newest",) if name.startswith("aider") else BUILDS)]


def _require(name: str, build: str) -> None:
    """Skip (fail under ``AGENTCACHE_REQUIRE_CLIENTS=1``) when the build is not installed; skip a newest build that
    is the pinned version (it was just tested)."""
    binary = CLIENTS[name].binary
    if find_binary(binary, build) is None:
        message = needs.agent_cli(binary, build)
        if os.environ.get("AGENTCACHE_REQUIRE_CLIENTS") == "1":
            pytest.fail(message)
        pytest.skip(message)
    if build == "newest" and (name, "pinned") in RUNS and find_binary(binary, "pinned") is not None:
        home = _HOME / "versions"
        pinned, newest = (CLIENTS[name](home, b).version() for b in BUILDS)
        if pinned == newest:
            pytest.skip(f"{needs.NOT_APPLICABLE}: the newest {binary} is the pinned version")


@pytest.fixture(scope="module", params=RUNS, ids=[f"{n}-{b}" for n, b in RUNS])
def runs(request: pytest.FixtureRequest) -> tuple[Trace | None, Trace]:
    """(direct, proxied) traces of one client build; direct only for the pinned builds of issue 11's clients."""
    name, build = request.param
    _require(name, build)
    home = _HOME / f"{name}-{build}"  # the same path for both runs: clients embed their working directory in prompts
    direct = run_trace(name, "direct", home, build=build) if build == "pinned" and name in PINNED else None
    record = _HOME / f"{name}-{build}-record"
    return direct, run_trace(name, "proxy", home, record_dir=record, build=build)


def _direct(runs: tuple[Trace | None, Trace]) -> tuple[Trace, Trace]:
    direct, proxied = runs
    if direct is None:
        pytest.skip(f"{needs.NOT_APPLICABLE}: this client build runs through the proxy only")
    return direct, proxied


def _by_label(trace: Trace) -> dict[str, list[Exchange]]:
    out: dict[str, list[Exchange]] = defaultdict(list)
    for ex in trace.exchanges:
        out[ex.label].append(ex)
    return out


def test_proxied_runs_complete(runs: tuple[Trace | None, Trace]) -> None:
    _, proxied = runs
    assert set(proxied.outputs) == {s for s, _, _ in CLIENTS[proxied.client].scenarios}
    for scenario, out in proxied.outputs.items():
        assert out.returncode == 0, (proxied.version, scenario, out.stderr[-2000:])
        assert "agentcache-fake answer: directive" in out.stdout, (scenario, out.stdout[-500:])
    assert proxied.exchanges and all(ex.forwarded is not None for ex in proxied.exchanges)


def test_runs_complete_with_the_same_outputs(runs: tuple[Trace | None, Trace]) -> None:
    direct, proxied = _direct(runs)
    assert set(direct.outputs) == {s for s, _, _ in CLIENTS[direct.client].scenarios}
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


def test_same_requests_as_direct(runs: tuple[Trace | None, Trace]) -> None:
    direct, proxied = _direct(runs)
    a, b = _by_label(direct), _by_label(proxied)
    assert {k: len(v) for k, v in a.items()} == {k: len(v) for k, v in b.items()}
    for key, exchanges in a.items():
        for mine, theirs in zip(exchanges, b[key], strict=True):
            assert mine.sent.path == theirs.sent.path
            assert masked(mine.sent.body) == masked(theirs.sent.body), key


def _own_key(body: dict[str, Any]) -> dict[str, Any]:
    """``body`` without a ``prompt_cache_key`` of agentcache's own (``ac-...``, added where the client sent none)."""
    key = body.get("prompt_cache_key")
    return {k: v for k, v in body.items() if k != "prompt_cache_key"} if str(key).startswith("ac-") else body


def test_forwarded_request_is_the_clients_modulo_documented_edits(runs: tuple[Trace | None, Trace]) -> None:
    """Only cache markers, the ``messages.shape`` repair (a one-block list for the string it means) and an OpenAI
    routing key where the client sent none change."""
    _, proxied = runs
    assert proxied.exchanges
    for ex in proxied.exchanges:
        assert ex.forwarded is not None
        assert ex.forwarded.path == ex.sent.path
        assert unmarked(_own_key(ex.forwarded.body)) == unmarked(ex.sent.body), ex.label


def test_prompt_cache_key_kept(runs: tuple[Trace | None, Trace]) -> None:
    """The client's own ``prompt_cache_key`` goes out as sent; where it sends none on an OpenAI route, agentcache's
    routing key, one per session for good."""
    _, proxied = runs
    keys = [ex.sent.body.get("prompt_cache_key") for ex in proxied.exchanges]
    ours: dict[str | None, set[str]] = defaultdict(set)
    for ex in proxied.exchanges:
        assert ex.forwarded is not None
        sent, forwarded = ex.sent.body.get("prompt_cache_key"), ex.forwarded.body.get("prompt_cache_key")
        if sent is not None or ex.forwarded.route == "messages":
            assert forwarded == sent, ex.label
        else:
            assert isinstance(forwarded, str) and forwarded.startswith("ac-"), ex.label
            ours[ex.session].add(forwarded)
    assert all(len(k) == 1 for k in ours.values()), ours
    if proxied.client == "codex":  # the one client here that sends its own key
        assert all(isinstance(k, str) and k for k in keys)


def test_client_markers_kept_by_value(runs: tuple[Trace | None, Trace]) -> None:
    """Markers in = markers out (docs/design.md, round 3): every marker the client set is on the same block in the
    forwarded request, with the same value (``ttl``, ``scope``, anything else in it)."""
    _, proxied = runs
    for ex in proxied.exchanges:
        assert ex.forwarded is not None
        forwarded = markers(ex.forwarded.body)
        changed = {p: (m, forwarded.get(p)) for p, m in markers(ex.sent.body).items() if forwarded.get(p) != m}
        assert not changed, (ex.label, changed)


def test_marker_rules(runs: tuple[Trace | None, Trace]) -> None:
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


def test_role_system_messages_keep_their_shape(runs: tuple[Trace | None, Trace]) -> None:
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
        if type(forwarded["content"]) is not type(sent["content"]):
            # Only the messages.shape repair on Anthropic, whose Messages API takes blocks on a role: "system"
            # message (SDK MessageParam): the one-block list this session's client itself sent for that string.
            assert ex.forwarded.route == "messages" and isinstance(sent["content"], str), (ex.label, i)
            assert unmarked(forwarded["content"]) == [{"type": "text", "text": sent["content"]}], (ex.label, i)
            same = [e for e in proxied.exchanges if e.session == ex.session and e.seq < ex.seq]
            assert any(isinstance(e.sent.body["messages"][i].get("content"), list) for e in same), (ex.label, i)


def test_sessions_are_the_true_conversations(runs: tuple[Trace | None, Trace]) -> None:
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


def test_subagents_are_linked_to_their_parent(runs: tuple[Trace | None, Trace]) -> None:
    _, proxied = runs
    labels = _by_label(proxied)
    if "subagent:sub" not in labels or not CLIENTS[proxied.client].declares:
        pytest.skip(f"{needs.NOT_APPLICABLE}: the client runs no subagent here, or declares no parent")
    parent = labels["subagent:main"][0].session
    child = labels["subagent:sub"][0].session
    assert parent is not None and child is not None and child != parent
    assert proxied.parents.get(child) == parent


def test_no_break_the_client_did_not_cause(runs: tuple[Trace | None, Trace]) -> None:
    """Every break the proxy reports is at a request where the client itself changed tools, system or an earlier
    message (markers ignored) against the session's previous request; never at a continuing request."""
    _, proxied = runs
    assert proxied.report["breaks"] is not None
    for brk in proxied.report["breaks"]:
        assert break_is_client_caused(proxied, brk), brk


def _reports_usage(api: str, body: dict[str, Any]) -> bool:
    """Whether the upstream reports usage for ``body``: always, but for a Chat Completions stream that did not ask
    for it (``stream_options.include_usage``; aider, through litellm, does not)."""
    asked = bool((body.get("stream_options") or {}).get("include_usage"))
    return api != "openai.chat" or not body.get("stream") or asked


def _audit_json(paths: list[Path]) -> dict[str, Any]:
    result = CliRunner().invoke(cli.app, ["audit", *map(str, paths), "--json"], catch_exceptions=False)
    assert result.exit_code == 0, result.stderr
    doc: dict[str, Any] = json.loads(result.stdout)
    return doc


def test_recording_audits_as_the_traffic(runs: tuple[Trace | None, Trace], tmp_path: Path) -> None:
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
    assert all(ln["status"] == 200 and ln["outcome"] == "complete" for ln in lines)
    assert all(("usage" in ln) is _reports_usage(ln["api"], ln["body"]) for ln in lines)
    sessions = {unquote(ex.session or "") for ex in proxied.exchanges}
    parents = {ln["session"]: ln.get("parent") for ln in lines}
    assert parents == {sid: proxied.parents.get(sid) for sid in sessions}
    linked = CLIENTS[proxied.client].declares and "subagent:sub" in _by_label(proxied)
    assert any(parents.values()) is linked

    traffic = tmp_path / "traffic.jsonl"
    assert write_offline(proxied, traffic) == len(lines)
    recorded, offline = _audit_json([proxied.record_dir]), _audit_json([traffic])
    assert recorded["totals"]["as_sent"]["requests"] == len(lines)
    if any("usage" in ln for ln in lines):
        assert recorded["totals"]["reported"]["prompt_tokens"] > 0
    assert {s["session"] for s in recorded["sessions"]} == sessions
    # the offline file's sessions are "traffic/<session>" (no recorded_by): the same once the stem is dropped
    assert json.loads(json.dumps(offline).replace('"traffic/', '"')) == recorded


def test_agentcache_never_costs_more_than_the_client(runs: tuple[Trace | None, Trace]) -> None:
    """Never cost more than the client alone (docs/design.md, round 3): the proxy's live report simulates the
    client's own requests (``as_sent``) and the ones agentcache sent (``agentcache``) through one cache per tenant and
    target; on every client's trace agentcache's costs no more, request for request (every request counted)."""
    _, proxied = runs
    totals = proxied.report["totals"]
    assert totals["as_sent"]["requests"] == totals["agentcache"]["requests"] == len(proxied.exchanges)
    assert totals["as_sent"]["prompt_tokens"] == totals["agentcache"]["prompt_tokens"] > 0
    assert totals["agentcache"]["cost_usd"] <= totals["as_sent"]["cost_usd"] * (1 + 1e-9), totals


def test_one_date_header(runs: tuple[Trace | None, Trace]) -> None:
    """Response headers as the upstream sent them: one ``date`` (the proxy's server adds none)."""
    _, proxied = runs
    for ex in proxied.exchanges:
        assert ex.answer is not None and len(ex.answer.dates) == 1, (ex.label, ex.answer.dates if ex.answer else None)
