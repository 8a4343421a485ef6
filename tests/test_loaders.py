"""Loaders against the real recorded files in data/ and tests/cases, plus synthetic edge cases."""

from __future__ import annotations

import json
from pathlib import Path

import pytest

from agentcache._exceptions import InputError, UnknownFormatError
from agentcache.loaders import FORMATS, LoadResult, Record, detect_format, load

ROOT = Path(__file__).resolve().parent.parent
DATA = ROOT / "data"
TAU = DATA / "tau-bench" / "gpt-4o-airline.json"
SWE = DATA / "swe-agent" / "marshmallow-code__marshmallow-1867.function_calling.traj"
OPENHANDS = DATA / "openhands" / "basic_gui_mode.json"
CASES = ROOT / "tests" / "cases"


def test_formats() -> None:
    # Formats with request bodies, then the agents' own logs (LOG_FORMATS).
    assert FORMATS[:6] == ("taubench", "swe-agent", "openhands", "chat", "case", "jsonl")
    assert {"claude-code", "codex", "opencode", "qwen-code"} <= set(FORMATS[6:])


@pytest.mark.parametrize(
    ("path", "fmt"),
    [
        (TAU, "taubench"),
        (SWE, "swe-agent"),
        (OPENHANDS, "openhands"),
        (CASES / "k01-tools-reordered.json", "case"),
    ],
)
def test_detect_real_files(path: Path, fmt: str) -> None:
    assert detect_format(path) == fmt
    assert detect_format(str(path)) == fmt


def test_taubench_real_file() -> None:
    result = load(TAU)
    assert isinstance(result, LoadResult)
    assert result.format == "taubench"
    assert result.errors == []
    assert len(result.records) == 2454
    sessions = {r.session for r in result.records}
    assert len(sessions) == 200
    assert "gpt-4o-airline/task3-trial1" in sessions
    first = result.records[0]
    assert first.session == "gpt-4o-airline/task0-trial0"
    assert first.api == "openai.chat" and first.at is None and first.usage is None
    assert list(first.body) == ["model", "messages", "tools", "temperature"]
    assert first.body["model"] == "gpt-4o" and first.body["temperature"] == 0.0
    assert len(first.body["tools"]) == 14
    assert [m["role"] for m in first.body["messages"]] == ["system", "user"]
    sizes = [len(r.body["messages"]) for r in result.records]
    assert max(sizes) == 60


def test_taubench_messages_copied_byte_exact() -> None:
    runs = json.loads(TAU.read_text(encoding="utf-8"))
    run = runs[0]
    records = [r for r in load(TAU).records if r.session == "gpt-4o-airline/task0-trial0"]
    assistant_at = [i for i, m in enumerate(run["traj"]) if m["role"] == "assistant"]
    assert len(records) == len(assistant_at)
    for rec, i in zip(records, assistant_at, strict=True):
        assert json.dumps(rec.body["messages"]) == json.dumps(run["traj"][:i])


def test_taubench_bad_run_reported(tmp_path: Path) -> None:
    runs = json.loads(TAU.read_text(encoding="utf-8"))[:3]
    runs[1] = {"task_id": 9, "traj": "not a list"}
    path = tmp_path / "mini-airline.json"
    path.write_text(json.dumps(runs), encoding="utf-8")
    tools = DATA / "tau-bench" / "airline_tools.json"
    with pytest.raises(InputError, match="tools_path"):
        load(path)
    result = load(path, tools_path=str(tools))
    assert len({r.session for r in result.records}) == 2
    assert [(e.record, e.source) for e in result.errors] == [(1, str(path))]


def test_sweagent_real_file() -> None:
    result = load(SWE)
    assert result.format == "swe-agent" and result.errors == []
    records = result.records
    assert len(records) == 13
    assert len({r.session for r in records}) == 1
    assert records[0].session == "marshmallow-code__marshmallow-1867.function_calling"
    counts = [len(r.body["messages"]) for r in records]
    assert counts[0] == 4 and counts[-1] == 28
    assert counts == list(range(4, 29, 2))
    assert records[0].body["model"] == "replay"
    allowed = {"role", "content", "tool_calls", "tool_call_id", "name", "cache_control"}
    for rec in records:
        for msg in rec.body["messages"]:
            assert set(msg) <= allowed
    assistant, tool = records[-1].body["messages"][2:4]
    assert assistant["role"] == "assistant" and assistant["tool_calls"][0]["id"] == "call_9diWc1DYm4RLmPfHgIaP2wd"
    assert tool == {
        "role": "tool",
        "content": "Old environment output: (7 lines omitted)",
        "tool_call_id": "call_9diWc1DYm4RLmPfHgIaP2wd",
    }


def test_sweagent_history_form(tmp_path: Path) -> None:
    doc = json.loads(SWE.read_text(encoding="utf-8"))
    for step in doc["trajectory"]:
        del step["messages"]
    path = tmp_path / "old.traj"
    path.write_text(json.dumps(doc), encoding="utf-8")
    records = load(path).records
    assert [len(r.body["messages"]) for r in records] == list(range(2, 27, 2))
    assert records[0].body["messages"][0]["role"] == "system"


def test_openhands_real_file() -> None:
    result = load(OPENHANDS)
    assert result.format == "openhands" and result.errors == []
    records = result.records
    assert [r.usage["prompt_tokens"] for r in records if r.usage] == [3439, 3601, 4769, 5488]
    assert [r.usage["cache_read_input_tokens"] for r in records if r.usage] == [0, 3435, 3595, 4763]
    assert all(r.body["model"] == "claude-3-5-sonnet-20241022" for r in records)
    assert [r.at for r in records] == pytest.approx([0.0, 13.884703, 21.85855, 24.241358])
    roles = [[m["role"] for m in r.body["messages"]] for r in records]
    assert roles[0] == ["system", "user"]
    assert roles[-1] == ["system", "user"] + ["assistant", "tool"] * 3
    tool = records[1].body["messages"][3]
    assert tool["tool_call_id"] == records[1].body["messages"][2]["tool_calls"][0]["id"]
    assert tool["name"] == "execute_bash"


def test_case_file() -> None:
    path = CASES / "k07-session-uuid-in-system.json"
    case = json.loads(path.read_text(encoding="utf-8"))
    result = load(path)
    assert result.format == "case" and result.errors == []
    records = result.records
    assert len(records) == len(case["requests"]) == 2
    assert [r.session for r in records] == ["k07-session-uuid-in-system/a", "k07-session-uuid-in-system/b"]
    assert all(r.api == case["api"] == "anthropic.messages" for r in records)
    assert [r.at for r in records] == [req["at"] for req in case["requests"]]
    assert json.dumps(records[1].body) == json.dumps(case["requests"][1]["body"])
    assert records[0].meta == {"case": "k07-session-uuid-in-system", "expect": case["expect"]}


def test_case_without_sessions_uses_case_id() -> None:
    records = load(CASES / "k01-tools-reordered.json").records
    assert {r.session for r in records} == {"k01-tools-reordered/k01-tools-reordered"}
    assert [r.index for r in records] == [0, 1, 2]


def test_jsonl_bad_line_reported(tmp_path: Path) -> None:
    body = {"model": "m", "messages": [{"role": "user", "content": "hi"}]}
    lines = [
        json.dumps({"session": "s1", "api": "openai.chat", "at": 5.0, "body": body}),
        "",
        "{not json",
        json.dumps({"session": "s2", "api": "anthropic.messages", "at": 1.0, "body": body, "usage": {"x": 1}}),
        json.dumps({"session": "s3", "api": "bogus.api", "body": body}),
        json.dumps({"session": "s1", "api": "openai.chat", "at": 7.5, "body": body}),
    ]
    path = tmp_path / "traffic.jsonl"
    path.write_text("\n".join(lines) + "\n", encoding="utf-8")
    assert detect_format(path) == "jsonl"
    result = load(path)
    assert result.format == "jsonl"
    assert [(e.record, e.source) for e in result.errors] == [(2, str(path)), (4, str(path))]
    assert [(r.session, r.at, r.index) for r in result.records] == [
        ("traffic/s2", 1.0, 3),
        ("traffic/s1", 5.0, 0),
        ("traffic/s1", 7.5, 5),
    ]
    assert result.records[0].usage == {"x": 1}
    assert result.records[0].api == "anthropic.messages"


def test_jsonl_parents_and_the_proxys_recorded_lines(tmp_path: Path) -> None:
    """``parent`` is read into ``meta``; a line ``recorded_by`` the proxy keeps its session ids as written (one
    session spans the proxy's rotated files), any other gets the file stem, its parent too."""
    body = {"model": "m", "messages": [{"role": "user", "content": "hi"}]}
    lines = [
        {"session": "a/sub", "parent": "a", "api": "openai.chat", "body": body},
        {"recorded_by": "agentcache-proxy/0.1.0", "session": "S/a1", "parent": "S", "api": "openai.chat", "body": body},
        {"recorded_by": "agentcache-proxy/0.1.0", "session": "S", "api": "openai.chat", "body": body},
        {"session": "b", "parent": "", "api": "openai.chat", "body": body},
    ]
    path = tmp_path / "day-1.jsonl"
    path.write_text("".join(json.dumps(line) + "\n" for line in lines), encoding="utf-8")
    result = load(path)
    assert [(r.session, r.meta) for r in result.records] == [
        ("day-1/a/sub", {"parent": "day-1/a"}),
        ("S/a1", {"parent": "S", "recorded_by": "agentcache-proxy/0.1.0"}),
        ("S", {"recorded_by": "agentcache-proxy/0.1.0"}),
    ]
    assert [(e.record, str(e)) for e in result.errors] == [(3, f"{path} record 3: 'parent' must be a non-empty string")]


def test_chat_list(tmp_path: Path) -> None:
    msgs = [
        {"role": "system", "content": "s"},
        {"role": "user", "content": "u1"},
        {"role": "assistant", "content": "a1"},
        {"role": "user", "content": "u2"},
        {"role": "assistant", "content": "a2"},
    ]
    path = tmp_path / "talk.json"
    path.write_text(json.dumps(msgs), encoding="utf-8")
    result = load(path)
    assert result.format == "chat"
    assert [r.body for r in result.records] == [
        {"model": "unknown", "messages": msgs[:2]},
        {"model": "unknown", "messages": msgs[:4]},
    ]
    assert all(isinstance(r, Record) and r.session == "talk" for r in result.records)


def test_unknown_format(tmp_path: Path) -> None:
    path = tmp_path / "mystery.json"
    path.write_text(json.dumps({"hello": "world"}), encoding="utf-8")
    with pytest.raises(UnknownFormatError, match=r"mystery\.json"):
        detect_format(path)
    with pytest.raises(UnknownFormatError, match=r"mystery\.json"):
        load(path)
    text = tmp_path / "notes.txt"
    text.write_text("just some text\n", encoding="utf-8")
    with pytest.raises(UnknownFormatError, match=r"notes\.txt"):
        load(text)
    with pytest.raises(UnknownFormatError):
        load(path, format="nonsense")


def test_aiders_history_says_it_keeps_no_usage(tmp_path: Path) -> None:
    """aider's own files keep no API usage: the error says so and how to audit aider (record through the proxy)."""
    history = tmp_path / ".aider.chat.history.md"
    history.write_text("# aider chat started at 2026-12-02 08:00:00\n\n#### hi\n", encoding="utf-8")
    with pytest.raises(UnknownFormatError, match=r"aider's chat history keeps no API usage; .*--record DIR"):
        load(history)


def test_unreadable_and_invalid_json(tmp_path: Path) -> None:
    with pytest.raises(InputError):
        load(tmp_path / "missing.json")
    broken = tmp_path / "broken.traj"
    broken.write_text("{", encoding="utf-8")
    with pytest.raises(InputError, match="invalid JSON"):
        load(broken)
    with pytest.raises(InputError):
        load(OPENHANDS, format="case")


def test_time_window_applies_to_a_proxy_recordings_lines(tmp_path: Path) -> None:
    """A recording's ``at`` is unix seconds: ``--since``/``--until`` keep its lines in the window (other records
    with bodies carry file-relative times and are kept)."""
    from agentcache.loaders._paths import load_paths

    body = {"model": "m", "messages": [{"role": "user", "content": "hi"}]}
    tag = {"recorded_by": "agentcache-proxy/0.1.0", "api": "openai.chat", "body": body}
    lines = [{**tag, "session": "S", "at": at} for at in (1_000.0, 2_000.0, 3_000.0)]
    (tmp_path / "rec.jsonl").write_text("".join(json.dumps(x) + "\n" for x in lines))
    (tmp_path / "plain.jsonl").write_text(json.dumps({"session": "p", "api": "openai.chat", "at": 5, "body": body}))
    inputs = load_paths([tmp_path], since=1_500.0, until=3_000.0)
    assert sorted((r.session, r.at) for r in inputs.records) == [("S", 2_000.0), ("plain/p", 5.0)]
    assert inputs.filtered == 2
