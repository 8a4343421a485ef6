"""The Claude Code readers on logs the real CLI writes (issue 21): transcripts (``claude-code``) and raw body dumps
(``claude-code-bodies``), generated here at test time by Claude Code 2.1.197 (the version CI pins) and 2.1.332 (the
newest tried) against the realistic fake upstream (``tests/clients/claude_logs.py``: a fresh run, ``--continue``, a
model switch, ``/compact``, a run after it, a subagent, a ``--resume`` after a 10-minute pause). The fake's own
usage log is the truth: each call the transcripts hold is counted once with exactly that usage, and the calls they do
not hold are named. Skipped when a version is absent, unless ``AGENTCACHE_REQUIRE_CLIENTS=1``.
"""

from __future__ import annotations

import json
import os
import tempfile
from collections import Counter
from pathlib import Path
from typing import Any

import pytest

from agentcache.loaders import detect_format
from agentcache.loaders._claude_code import _Transcript
from agentcache.loaders._claude_code_bodies import join_transcript
from agentcache.loaders._paths import Inputs, load_paths
from agentcache.loaders._record import UsageRecord
from tests.clients.claude_logs import PAUSE, Generated, binaries, find, generate

#: The calls Claude Code makes but writes to no transcript, per version: the session-title call (2.1.197) and the
#: compaction call (2.1.332 asks twice: the fake's first summary lacks the ``<summary>`` tags it wants).
SIDE_CALLS = {"2.1.197": {"title": 1, "compaction": 1}, "2.1.332": {"compaction": 2}}
DEFAULT_MODEL = {"2.1.197": "claude-opus-4-8", "2.1.332": "claude-opus-5-5"}
_HOME = Path(tempfile.mkdtemp(prefix="agentcache-claude-logs-"))


@pytest.fixture(scope="module", params=sorted(binaries()))
def gen(request: pytest.FixtureRequest) -> Generated:
    version: str = request.param
    binary = find(version)
    if binary is None:
        message = f"Claude Code {version} not installed at {binaries()[version]} (.ci/run installs it from npm)"
        if os.environ.get("AGENTCACHE_REQUIRE_CLIENTS") == "1":
            pytest.fail(message)
        pytest.skip(message)
    return generate(binary, _HOME / version, version)


@pytest.fixture(scope="module")
def transcripts(gen: Generated) -> Inputs:
    return load_paths([gen.projects])


def _truth(gen: Generated) -> dict[str, dict[str, Any]]:
    return {f"msg_{u['id']}": u for u in gen.usage_log}


def _side(body: dict[str, Any]) -> str | None:
    """What a call the transcripts do not hold was for (title or compaction), from the body the fake got."""
    fmt = (body.get("output_config") or {}).get("format") or {}
    if "title" in json.dumps(fmt.get("schema") or {}):
        return "title"
    last = body["messages"][-1]["content"]
    text = last if isinstance(last, str) else " ".join(b.get("text", "") for b in last if isinstance(b, dict))
    return "compaction" if "<summary>" in text else None


def _numbers(usage: dict[str, Any]) -> tuple[int, ...]:
    keys = ("input_tokens", "cache_read_input_tokens", "cache_creation_input_tokens", "output_tokens")
    return tuple(usage[k] for k in keys)


def _by_id(inputs: Inputs) -> dict[str, UsageRecord]:
    return {u.usage.response_id or "": u for u in inputs.usage_records}


def test_every_run_completes(gen: Generated) -> None:
    for name, (code, tail) in gen.outputs.items():
        assert code == 0, (gen.version, name, tail)
    assert all(gen.runs[name] for name in gen.runs), gen.runs


def test_each_call_once_with_the_upstreams_usage(gen: Generated, transcripts: Inputs) -> None:
    truth = _truth(gen)
    ids = [u.usage.response_id for u in transcripts.usage_records]
    assert len(ids) == len(set(ids)) and transcripts.duplicates == 0
    assert all(f.errors == [] and f.error is None for f in transcripts.files)
    assert set(ids) <= set(truth)
    missing = [rid for rid in truth if rid not in set(ids)]
    assert Counter(_side(gen.body_of(rid)) for rid in missing) == SIDE_CALLS[gen.version]
    assert len(ids) == len(truth) - sum(SIDE_CALLS[gen.version].values())  # 14 of 16 (2.1.197), 15 of 17 (2.1.332)
    for u in transcripts.usage_records:
        t = truth[u.usage.response_id or ""]["usage"]
        assert (u.usage.cache_read_tokens, u.usage.cache_write_tokens) == (
            t["cache_read_input_tokens"],
            t["cache_creation_input_tokens"],
        )
        assert u.usage.uncached_tokens == t["input_tokens"] and u.usage.output_tokens == t["output_tokens"]
        assert u.usage.cache_write_1h_tokens == t["cache_creation"]["ephemeral_1h_input_tokens"]
        assert u.call_id == f"{u.usage.response_id}/{truth[u.usage.response_id or '']['request_id']}"
    held = [truth[rid]["usage"] for rid in ids]
    assert sum(u.usage.prompt_tokens for u in transcripts.usage_records) == sum(
        t["input_tokens"] + t["cache_read_input_tokens"] + t["cache_creation_input_tokens"] for t in held
    )


def test_subagent_is_its_own_session_linked_to_its_parent(gen: Generated, transcripts: Inputs) -> None:
    sessions = Counter((u.session, u.parent, u.kind) for u in transcripts.usage_records)
    subagents = [key for key in sessions if key[2] == "subagent"]
    assert len(subagents) == 1 and sessions[subagents[0]] == 2, sessions
    session, parent, _ = subagents[0]
    assert parent == gen.session and session.startswith(f"{gen.session}/a")
    assert {key for key in sessions if key[2] != "subagent"} == {(gen.session, None, "main")}
    by_id = _by_id(transcripts)
    assert [by_id[rid].kind for rid in gen.runs["subagent"] if rid in by_id].count("subagent") == 2
    assert all(u.project == str(gen.home / "work") for u in transcripts.usage_records)


def test_compaction_and_resume_on_the_right_calls(gen: Generated, transcripts: Inputs) -> None:
    by_id = _by_id(transcripts)
    main = [u for u in transcripts.usage_records if u.kind == "main"]
    compacted = [u.usage.response_id for u in main if "compacted" in u.events]
    assert compacted == [gen.runs["after_compact"][0]]
    firsts = [next(r for r in gen.runs[name] if r in by_id) for name in gen.runs if name not in ("fresh", "compact")]
    assert [u.usage.response_id for u in main if "resumed" in u.events] == firsts
    assert all(u.events == () for u in transcripts.usage_records if u.kind == "subagent")


def test_models_and_the_pause(gen: Generated, transcripts: Inputs) -> None:
    truth = _truth(gen)
    by_id = _by_id(transcripts)
    assert all(u.model == truth[rid]["model"] for rid, u in by_id.items())
    early = [r for r in gen.runs["fresh"] + gen.runs["continue"] if r in by_id]
    assert {by_id[r].model for r in early} == {DEFAULT_MODEL[gen.version]}
    later = [r for name in ("model", "after_compact", "subagent", "resume") for r in gen.runs[name] if r in by_id]
    assert {by_id[r].model for r in later} == {"claude-sonnet-4-6"}
    main = [u for u in transcripts.usage_records if u.kind == "main"]
    back = next(i for i, u in enumerate(main) if u.usage.response_id == gen.runs["resume"][0])
    gap = (main[back].at or 0) - (main[back - 1].at or 0)
    assert PAUSE <= gap < PAUSE + 60  # the user's pause, as the rewritten timestamps say
    assert main[back].usage.cache_read_tokens == 0 and main[back].usage.cache_write_tokens > 0  # entries expired


def test_exact_bodies_rebuilt_from_the_transcript(gen: Generated, transcripts: Inputs) -> None:
    if gen.version == "2.1.197":
        assert transcripts.records == []  # 2.1.197 records no request
        return
    calls = {u.call_id: u for u in transcripts.usage_records}
    assert len(transcripts.records) == len(calls) == 15  # every call the transcripts hold: 15 of 15
    for rec in transcripts.records:
        assert rec.response is not None
        sent = gen.body_of(rec.response["id"])
        assert json.dumps(rec.body) == json.dumps(sent)  # byte for byte, key order included
        assert rec.meta["exact"] is True and rec.api == "anthropic.messages"
        u = calls[rec.meta["call_id"]]
        assert (rec.session, rec.meta["parent"], rec.meta["kind"]) == (u.session, u.parent, u.kind)
        assert rec.response is not None and rec.usage == rec.response["usage"]
        assert rec.at is not None and u.at is not None and 0 <= u.at - rec.at < 30


def test_body_dumps_hold_every_call(gen: Generated, transcripts: Inputs) -> None:
    dumps = load_paths([gen.dumps])
    truth = _truth(gen)
    # Claude Code does not wait for its dump writes: a process may exit before its last one lands (the reader's
    # docstring), leaving a response file empty. Every request written is read; all but such a one with its answer.
    answered = [rec for rec in dumps.records if rec.response is not None]
    assert len(dumps.records) == len(list(gen.dumps.glob("*.request.json"))) == len(truth)
    assert len(answered) >= len(truth) - 1 and sum(f.truncated for f in dumps.files) == len(truth) - len(answered)
    assert all(f.errors == [] and f.error is None for f in dumps.files)
    for rec in dumps.records:
        assert rec.meta["call_id"].split("/")[0] in truth
        assert json.dumps(rec.body) == json.dumps(gen.body_of(rec.meta["call_id"].split("/")[0]))
    for rec in answered:
        assert rec.response is not None and rec.usage is not None
        assert _numbers(rec.usage) == _numbers(truth[rec.response["id"]]["usage"])
    kinds = Counter(rec.meta["kind"] for rec in dumps.records)
    joined = join_transcript(dumps.records + transcripts.records, transcripts.usage_records)
    calls = {r.meta["call_id"] for r in dumps.records} | {r.meta["call_id"] for r in transcripts.records}
    assert len({r.meta["call_id"] for r in joined}) == len(joined) == len(calls)  # each call once
    known = {u.call_id: u for u in transcripts.usage_records}
    for rec in joined:
        if rec.meta["call_id"] in known:
            assert rec.session == known[rec.meta["call_id"]].session
    subagent = [r for r in joined if r.meta["kind"] == "subagent"]
    assert len(subagent) == kinds["subagent"] == 2 and {r.meta["parent"] for r in subagent} == {gen.session}


def test_detection(gen: Generated) -> None:
    files = sorted(gen.projects.rglob("*.jsonl"))
    assert len(files) == 2 and {detect_format(f) for f in files} == {"claude-code"}
    dumps = sorted(gen.dumps.iterdir())
    assert {detect_format(f) for f in dumps} == {"claude-code-bodies"}
    assert (gen.dumps / "index.jsonl").exists() == (gen.version == "2.1.332")


def test_skipping_unparsed_lines_changes_nothing(gen: Generated, monkeypatch: pytest.MonkeyPatch) -> None:
    from agentcache.loaders._claude_code import read

    files = sorted(gen.projects.rglob("*.jsonl"))
    fast = [read(f) for f in files]
    monkeypatch.setattr(_Transcript, "skip", lambda self, raw: False)
    slow = [read(f) for f in files]
    for a, b in zip(fast, slow, strict=True):
        assert a.usage_records == b.usage_records and (a.lines, a.ignored) == (b.lines, b.ignored)
        assert [r.body for r in a.records] == [r.body for r in b.records]


def _audit_json(*args: str | Path) -> dict[str, Any]:
    from typer.testing import CliRunner

    from agentcache._cli import app

    done = CliRunner().invoke(app, ["audit", *map(str, args), "--json"], catch_exceptions=False)
    assert done.exit_code == 0, done.stderr
    doc: dict[str, Any] = json.loads(done.stdout)
    return doc


def test_agentcache_audit_on_the_transcripts(gen: Generated, transcripts: Inputs) -> None:
    """``agentcache audit <projects> --json``, the door a user runs: every call the transcripts hold once, priced,
    with the upstream's own usage; the pause, the compaction and the model switch named. 2.1.332's transcripts hold
    the requests, so their causes come from the bodies (not inferred); 2.1.197's are inferred, and with its body
    dumps beside them they come from the bodies too."""
    truth = _truth(gen)
    held = [truth[r.call_id.split("/")[0]] for r in transcripts.usage_records]
    doc = _audit_json(gen.projects)
    reported = doc["totals"]["reported"]
    assert doc["mode"] == "reported" and reported["requests"] == len(held) == len(transcripts.usage_records)
    assert reported["cache_read_tokens"] == sum(u["usage"]["cache_read_input_tokens"] for u in held)
    assert reported["cache_write_tokens"] == sum(u["usage"]["cache_creation_input_tokens"] for u in held)
    (source,) = [s for s in doc["sources"] if s["client"] == "Claude Code"]
    assert source["calls"] == reported["requests"]  # each call once, 2.1.332's recorded request too
    misses = [m for m in doc["misses"] if m["arm"] == "reported"]
    causes = {m["cause"] for m in misses}
    assert {"ttl.expired", "options.model"} <= causes, causes
    ttl = next(m for m in misses if m["cause"] == "ttl.expired")
    assert ttl["tokens_lost"] > 0 and ttl["usd_lost"] > 0
    subagent = [s for s in doc["sessions"] if s.get("parent")]
    assert len(subagent) == 1 and subagent[0]["parent"] == gen.session
    if gen.version == "2.1.197":
        assert all(m["inferred"] for m in misses) and "messages.compacted" in causes
        assert "session.resumed" in causes or "ttl.expired" in causes
        with_dumps = _audit_json(gen.projects, gen.dumps)
        exact = [m for m in with_dumps["misses"] if m["arm"] == "reported"]
        # Most are explained by the bodies now (a pause's evidence is time: this test shifts the transcript's times,
        # not the dumps'; a dump Claude Code did not finish writing leaves its call inferred).
        from_bodies = [m for m in exact if not m["inferred"]]
        assert len(from_bodies) >= 3 and len(exact) - len(from_bodies) < len(misses)
        assert all("the request body" in m["detail"] for m in from_bodies)
        assert with_dumps["totals"]["reported"] == reported  # the same calls, counted once
    else:
        assert misses and not any(m["inferred"] for m in misses), [
            (m["request"], m["cause"], m["inferred"], m["detail"]) for m in misses
        ]
        assert all("the request body" in m["detail"] for m in misses)
        assert doc["simulated"]["totals"]["reported"]["requests"] == len(held)  # every request rebuilt


def test_html_page_of_the_transcripts(gen: Generated, tmp_path: Path) -> None:
    """``agentcache audit <projects> --html``: the logs' page, and when the transcripts hold the requests (2.1.332)
    the replayed bodies as its last section, with the same numbers ``--json`` prints."""
    from typer.testing import CliRunner

    from agentcache._cli import app

    page = tmp_path / "audit.html"
    done = CliRunner().invoke(app, ["audit", str(gen.projects), "--html", str(page)], catch_exceptions=False)
    assert done.exit_code == 0, done.stderr
    html = page.read_text()
    doc = _audit_json(gen.projects)
    reported = doc["totals"]["reported"]
    assert f"{reported['requests']:,} calls" in html
    replayed = "The requests with their bodies, replayed"
    if gen.version == "2.1.197":  # no request recorded: no replayed section
        assert replayed not in html
        return
    assert html.count(replayed) == 1 and html.index(replayed) > html.index("<h2>Sessions</h2>")
    section = html[html.index(replayed) :]
    simulated = doc["simulated"]["totals"]
    assert "What the arms mean" in section and "Misses by cause" in section
    for arm in ("as_sent", "agentcache"):
        assert f"<b>{arm}</b>" in section
        assert f"{simulated[arm]['prompt_tokens']:,}" in section
