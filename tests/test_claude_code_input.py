"""The Claude Code readers on hand-made input: the line shapes observed in 2.1.197/2.1.332 transcripts, the older
layouts (inline sidechains, ``agent-acompact-*`` files), bad and foreign input (issue 21, item 6)."""

from __future__ import annotations

import json
import os
from pathlib import Path
from typing import Any

import pytest

from agentcache.loaders import detect_format, load
from agentcache.loaders._claude_code import default_roots, read, sniff_lines
from agentcache.loaders._claude_code_bodies import read as read_dump
from agentcache.loaders._claude_code_request import canonical, fingerprint
from agentcache.loaders._paths import load_paths

SID = "0aab6793-d8cb-4220-a80d-85ee8edc9439"


def _usage(read: int, write: int, uncached: int = 0) -> dict[str, Any]:
    split = {"ephemeral_5m_input_tokens": write, "ephemeral_1h_input_tokens": 0}
    return {"input_tokens": uncached, "cache_creation_input_tokens": write, "cache_read_input_tokens": read,
            "cache_creation": split, "output_tokens": 8}  # fmt: skip


def _assistant(mid: str, usage: dict[str, Any], block: dict[str, Any] | None = None, **extra: Any) -> dict[str, Any]:
    message = {"id": mid, "type": "message", "role": "assistant", "model": "claude-sonnet-4-6",
               "content": [block or {"type": "text", "text": "ok"}], "usage": usage}  # fmt: skip
    line = {"type": "assistant", "sessionId": SID, "requestId": f"req_{mid}", "cwd": "/w", "version": "2.1.197",
            "timestamp": "2026-12-01T22:37:29.580Z", "message": message}  # fmt: skip
    return {**line, **extra}


def _user(text: str, **extra: Any) -> dict[str, Any]:
    return {"type": "user", "sessionId": SID, "message": {"role": "user", "content": text}, **extra}


def _write(path: Path, lines: list[dict[str, Any]], tail: str = "") -> Path:
    path.parent.mkdir(parents=True, exist_ok=True)
    path.write_text("".join(json.dumps(line, separators=(",", ":")) + "\n" for line in lines) + tail)
    return path


def test_one_call_over_several_lines_counts_once_with_its_last_usage(tmp_path: Path) -> None:
    tool = {"type": "tool_use", "id": "toolu_1", "name": "Bash", "input": {"command": "ls"}}
    lines = [
        {"type": "queue-operation", "operation": "enqueue", "sessionId": SID},
        _user("hi"),
        _assistant("msg_1", {**_usage(0, 100), "output_tokens": 1}),
        _assistant("msg_1", _usage(0, 100), tool),
        _assistant("msg_2", _usage(100, 20), model="<synthetic>"),
    ]
    lines[-1]["message"]["model"] = "<synthetic>"  # Claude Code's own text: no API call
    out = read(_write(tmp_path / "p" / f"{SID}.jsonl", lines))
    assert [(u.call_id, u.usage.cache_write_tokens, u.usage.output_tokens) for u in out.usage_records] == [
        ("msg_1/req_msg_1", 100, 8)
    ]
    assert (out.lines, out.ignored, out.errors, out.truncated) == (5, 3, [], False)


def test_truncated_last_line_is_normal_and_bad_call_lines_are_errors(tmp_path: Path) -> None:
    lines = [_assistant("msg_1", _usage(0, 50)), {"type": "assistant", "sessionId": SID, "message": {"id": "m"}}]
    lines += [{"type": "some-future-kind", "sessionId": SID}, _user("x")]
    cut = json.dumps(_assistant("msg_3", _usage(50, 5)))[:40]
    out = read(_write(tmp_path / "s.jsonl", lines, tail=cut))
    assert [u.call_id for u in out.usage_records] == ["msg_1/req_msg_1"]
    assert out.truncated is True and [e.record for e in out.errors] == [1]
    assert "without message id or usage" in str(out.errors[0])


def test_inline_sidechains_and_compaction_files(tmp_path: Path) -> None:
    chain = [
        _user("task A", uuid="a1", parentUuid=None, isSidechain=True),
        _assistant("msg_a", _usage(0, 10), uuid="a2", parentUuid="a1", isSidechain=True),
        _user("task B", uuid="b1", parentUuid=None, isSidechain=True),
        _assistant("msg_b", _usage(0, 10), uuid="b2", parentUuid="b1", isSidechain=True),
        _assistant("msg_a2", _usage(10, 5), uuid="a3", parentUuid="a2", isSidechain=True),
        _assistant("msg_m", _usage(0, 30), uuid="m1", parentUuid=None),
    ]
    out = read(_write(tmp_path / f"{SID}.jsonl", chain))
    got = [(u.session, u.parent, u.kind) for u in out.usage_records]
    a, b = f"{SID}/sidechain-a1", f"{SID}/sidechain-b1"
    assert got == [(a, SID, "subagent"), (b, SID, "subagent"), (a, SID, "subagent"), (SID, None, "main")]
    compaction = read(
        _write(tmp_path / SID / "subagents" / "agent-acompact-1a2b.jsonl", [_assistant("msg_c", _usage(30, 9))])
    )
    assert [(u.session, u.kind) for u in compaction.usage_records] == [(SID, "compaction")]


def test_events_compaction_and_process_ends(tmp_path: Path) -> None:
    lines = [
        _assistant("msg_1", _usage(0, 10)),
        {"type": "last-prompt", "sessionId": SID, "leafUuid": "x"},  # 2.1.197: a process ended
        _assistant("msg_2", _usage(10, 5)),
        {"type": "system", "subtype": "compact_boundary", "sessionId": SID},
        _user("summary", isCompactSummary=True),
        _assistant("msg_3", _usage(0, 12)),
        _assistant("msg_4", _usage(12, 2), version="2.1.332"),  # an upgrade is a new process
    ]
    out = read(_write(tmp_path / "s.jsonl", lines))
    assert [u.events for u in out.usage_records] == [(), ("resumed",), ("compacted",), ("resumed",)]
    with_cost = [*lines[:2], {"type": "cost-state", "sessionId": SID, "startTime": 1}, *lines[2:]]
    out = read(_write(tmp_path / "c.jsonl", with_cost))  # 2.1.332: cost-state marks the end, last-prompt does not
    assert [u.events for u in out.usage_records] == [(), ("resumed",), ("compacted",), ("resumed",)]
    out = read(_write(tmp_path / "d.jsonl", [lines[0], {"type": "cost-state", "sessionId": SID}, lines[1], lines[2]]))
    assert [u.events for u in out.usage_records] == [(), ("resumed",)]


def test_a_copy_in_another_file_counts_once(tmp_path: Path) -> None:
    lines = [_assistant("msg_1", _usage(0, 10)), _assistant("msg_2", _usage(10, 5))]
    _write(tmp_path / "p" / "a.jsonl", lines)
    _write(tmp_path / "p" / "b.jsonl", [*lines, _assistant("msg_3", _usage(15, 5))])
    inputs = load_paths([tmp_path / "p"])
    assert [u.call_id for u in inputs.usage_records] == ["msg_1/req_msg_1", "msg_2/req_msg_2", "msg_3/req_msg_3"]
    assert inputs.duplicates == 2


def test_sniffing_rejects_other_agents_logs(tmp_path: Path) -> None:
    codex = [{"timestamp": "t", "type": "session_meta", "payload": {"id": "x"}}]
    qwen = [{"uuid": "u", "sessionId": "s", "type": "user", "message": {"role": "user", "parts": [{"text": "hi"}]}}]
    ours = [{"session": "s", "api": "anthropic.messages", "body": {}}]
    assert not any(sniff_lines(x) for x in (codex, qwen, ours, []))
    assert sniff_lines([{"type": "summary", "summary": "t", "leafUuid": "u"}])  # older versions' first line
    path = _write(tmp_path / "rollout.jsonl", codex * 50)
    assert detect_format(path) != "claude-code"
    forced = load(path, "claude-code")  # forced on a foreign file: nothing read, no error per line
    assert (forced.usage_records, forced.errors, forced.ignored) == ([], [], 50)


def test_default_roots() -> None:
    env = {"HOME": "/h", "CLAUDE_CONFIG_DIR": "/c"}
    assert default_roots(env) == [Path("/c/projects"), Path("/h/.claude/projects"), Path("/h/.config/claude/projects")]
    assert default_roots({"HOME": "/h"})[0] == Path("/h/.claude/projects")


def test_canonical_bytes_and_fingerprint() -> None:
    assert canonical({"b": 1, "a": ["é", "\ud800"]}) == '{"a":["é","\\ud800"],"b":1}'.encode()
    assert fingerprint("Print a marker. agentcache-script:shell", "2.1.332") == "45d"  # observed on the wire
    assert fingerprint("", "2.1.332") == fingerprint("ab", "2.1.332")  # characters past the end count as "0"


def test_dumps_without_an_index_pair_by_time_and_model(tmp_path: Path) -> None:
    """2.1.197 writes no index: two concurrent calls of different models still pair right."""

    def body(model: str) -> dict[str, Any]:
        meta = {"user_id": json.dumps({"device_id": "d", "account_uuid": "", "session_id": SID})}
        return {"model": model, "messages": [{"role": "user", "content": "x"}], "system": [], "tools": [{"name": "t"}],
                "betas": ["b1"], "metadata": meta, "max_tokens": 10, "stream": True}  # fmt: skip

    files = [
        ("11111111-1111-4111-8111-111111111111.request.json", body("claude-haiku-4-5")),
        ("22222222-2222-4222-8222-222222222222.request.json", body("claude-sonnet-4-6")),
        ("req_b.response.json", {"id": "msg_b", "model": "claude-sonnet-4-6", "usage": _usage(0, 9)}),
        ("req_a.response.json", {"id": "msg_a", "model": "claude-haiku-4-5", "usage": _usage(0, 7)}),
    ]
    for n, (name, doc) in enumerate(files):
        (tmp_path / name).write_text(json.dumps(doc))
        os.utime(tmp_path / name, ns=(10**18 + n * 10**6, 10**18 + n * 10**6))
    records = [r for name, _ in files for r in read_dump(tmp_path / name).records]
    assert [(r.body["model"], r.meta["call_id"], r.meta["paired_by"]) for r in records] == [
        ("claude-haiku-4-5", "msg_a/req_a", "order"),
        ("claude-sonnet-4-6", "msg_b/req_b", "order"),
    ]
    assert "betas" not in records[0].body and records[0].meta["betas"] == ["b1"] and records[0].session == SID
    assert detect_format(tmp_path / files[0][0]) == "claude-code-bodies"


@pytest.mark.parametrize("name", ["notes.request.json", "x.json", "index.json"])
def test_dump_names_are_specific(tmp_path: Path, name: str) -> None:
    (tmp_path / name).write_text("{}")
    assert load_paths([tmp_path]).unrecognised == 1


def test_a_request_whose_index_line_was_lost_is_paired_by_time(tmp_path: Path) -> None:
    """2.1.332 appends its index after the answer; a process that exits first leaves a request without a line."""
    meta = {"user_id": json.dumps({"device_id": "d", "account_uuid": "", "session_id": SID})}
    body = {"model": "claude-sonnet-4-6", "messages": [], "tools": [{"name": "t"}], "metadata": meta}
    names = ["11111111-1111-4111-8111-111111111111", "22222222-2222-4222-8222-222222222222"]
    for n, (request, rid) in enumerate(zip(names, ["req_a", "req_b"], strict=True)):
        (tmp_path / f"{request}.request.json").write_text(json.dumps(body))
        (tmp_path / f"{rid}.response.json").write_text(json.dumps({"id": f"msg_{n}", "model": body["model"]}))
        for k, name in enumerate([f"{request}.request.json", f"{rid}.response.json"]):
            os.utime(tmp_path / name, ns=(10**18 + (2 * n + k) * 10**6,) * 2)
    entry = {"session_id": SID, "query_source": "sdk", "request_id": "req_a", "message_id": "msg_0",
             "request_file": f"{names[0]}.request.json", "response_file": "req_a.response.json"}  # fmt: skip
    (tmp_path / "index.jsonl").write_text(json.dumps(entry) + "\n")
    records = load_paths([tmp_path]).records
    assert sorted((r.meta["call_id"], r.meta["paired_by"]) for r in records) == [
        ("msg_0/req_a", "index"),
        ("msg_1/req_b", "order"),
    ]


def test_pairing_by_time_survives_late_request_files_and_concurrent_calls(tmp_path: Path) -> None:
    """Observed with 2.1.197: the session-title request file landed 4 ms after its answer; the title call and the
    first turn (same model) run at once. Sizes against reported prompt tokens tell them apart."""
    meta = {"user_id": json.dumps({"device_id": "d", "account_uuid": "", "session_id": SID})}
    title = {"model": "claude-opus-4-8", "messages": [{"role": "user", "content": "t" * 2000}], "tools": [],
             "metadata": meta}  # fmt: skip
    turn = {**title, "messages": [{"role": "user", "content": "x" * 80000}], "tools": [{"name": "t"}]}
    files = [  # (name, document, milliseconds)
        ("req_turn.response.json", {"id": "msg_turn", "model": "claude-opus-4-8", "usage": _usage(0, 20000)}, 300),
        ("req_title.response.json", {"id": "msg_title", "model": "claude-opus-4-8", "usage": _usage(0, 500)}, 0),
        ("11111111-1111-4111-8111-111111111111.request.json", title, 4),
        ("22222222-2222-4222-8222-222222222222.request.json", turn, 100),
    ]
    for name, doc, ms in files:
        (tmp_path / name).write_text(json.dumps(doc))
        os.utime(tmp_path / name, ns=(10**18 + ms * 10**6,) * 2)
    records = load_paths([tmp_path]).records
    assert sorted((r.meta["call_id"], r.meta["kind"], r.session) for r in records) == [
        ("msg_title/req_title", "side", f"{SID}/side"),
        ("msg_turn/req_turn", "main", SID),
    ]


def test_an_empty_response_file_is_a_write_cut_short(tmp_path: Path) -> None:
    """Seen with 2.1.332: a process exited before its last response file was written; the index line had landed."""
    body = {"model": "claude-sonnet-4-6", "messages": [], "tools": [{"name": "t"}]}
    request = "11111111-1111-4111-8111-111111111111.request.json"
    (tmp_path / request).write_text(json.dumps(body))
    (tmp_path / "req_a.response.json").write_text("")
    entry = {"session_id": SID, "query_source": "sdk", "request_id": "req_a", "message_id": "msg_a",
             "request_file": request, "response_file": "req_a.response.json"}  # fmt: skip
    (tmp_path / "index.jsonl").write_text(json.dumps(entry) + "\n")
    out = read_dump(tmp_path / request)
    assert out.errors == [] and out.truncated is True
    assert [(r.meta["call_id"], r.usage, r.response) for r in out.records] == [("msg_a/req_a", None, None)]


@pytest.mark.parametrize(("command", "verb"), [("plan", "planned"), ("replay", "replayed")])
def test_plan_and_replay_name_bodiless_logs_once_per_format(tmp_path: Path, command: str, verb: str) -> None:
    """Many agents' logs without request bodies are one error line (count, first file, what reads them), not one
    line per file, in the command's own words."""
    from typer.testing import CliRunner

    from agentcache._cli import app

    for n in range(3):
        sid = f"0aab6793-d8cb-4220-a80d-85ee8edc943{n}"
        lines = [{**_user("hi"), "sessionId": sid}, {**_assistant(f"msg_{n}", _usage(0, 100)), "sessionId": sid}]
        _write(tmp_path / "p" / f"{sid}.jsonl", lines)
    args = [command, str(tmp_path / "p")] + (["--endpoint", "http://127.0.0.1:9"] if command == "replay" else [])
    done = CliRunner().invoke(app, args, catch_exceptions=False)
    errors = [ln for ln in done.stderr.splitlines() if ln.strip()]
    assert done.exit_code == 2, done.stderr
    assert len(errors) == 1, done.stderr
    assert "3 files (" in errors[0] and f"cannot be {verb}" in errors[0] and "claude-code logs" in errors[0]
    assert "agentcache audit" in errors[0] and errors[0].endswith(f"records bodies that can be {verb}")
