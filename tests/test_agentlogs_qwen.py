"""The Qwen Code reader on the chats the real ``qwen`` writes, at test time, against the realistic fake upstream
(issue 21): each API call counted once with the fake's own usage (a subagent's calls are in its parent's chat and
in its own transcript), subagents linked, compression and a TTL expiry on the right calls, both API modes; bad input.

One conversation in OpenAI Chat Completions mode: a fresh run, a continue, a continue after the user paused an
hour (the OpenAI cache forgot it), ``/compress``, a continue; then a run that delegates to a subagent (``agent``),
one that forks (``subagent_type: "fork"``), and a fresh run in Anthropic mode.
"""

from __future__ import annotations

import json
import shutil
import tempfile
from collections import Counter
from collections.abc import Iterator
from pathlib import Path

import pytest

from agentcache.loaders import UsageRecord, detect_format
from agentcache.loaders._paths import load_paths
from agentcache.loaders._qwen import default_roots, read_qwen, sniff_lines
from tests.clients.agentlogs import Generated, Step, generate, require, shift_jsonl, usage_triples
from tests.clients.drivers import Client, QwenCode
from tests.clients.fake_upstream import FakeUpstream

PAUSE = 3600.0


def _anthropic(driver: Client, fake: FakeUpstream) -> None:
    assert isinstance(driver, QwenCode)
    driver.auth = "anthropic"


STEPS = (
    Step("fresh", "Print a marker. agentcache-script:shell"),
    Step("continue", "Print it again. agentcache-script:shell", resume=True),
    Step("paused", "Print it after a pause. agentcache-script:shell", resume=True, pause=PAUSE),
    Step("compress", "/compress", resume=True),
    Step("after", "Print it once more. agentcache-script:shell", resume=True),
    Step("subagent", "Delegate to a subagent. agentcache-script:task"),
    Step("fork", "Delegate with the context. agentcache-script:fork", resume=True),
    Step("anthropic", "Print a marker in Anthropic mode. agentcache-script:shell", setup=_anthropic),
)


@pytest.fixture(scope="module")
def gen() -> Iterator[Generated]:
    require("qwen")
    home = Path(tempfile.mkdtemp(prefix="agentcache-qwen-logs-"))
    yield generate(QwenCode(home), STEPS, lambda h, since, s: shift_jsonl(_logs(h), since, s))
    shutil.rmtree(home, ignore_errors=True)


def _projects(home: Path) -> Path:
    return home / ".qwen" / "projects"


def _logs(home: Path) -> list[Path]:
    return sorted(_projects(home).rglob("*.jsonl"))


@pytest.fixture(scope="module")
def records(gen: Generated) -> list[UsageRecord]:
    inputs = load_paths([_projects(gen.home)])
    assert {f.format for f in inputs.files} == {"qwen-code"}
    assert all(not f.errors and f.error is None for f in inputs.files), [(f.errors[:2], f.error) for f in inputs.files]
    subagent_files = [f for f in inputs.files if "subagents" in f.path.parts]
    # Each subagent transcript repeats calls its parent's chat counted: each is a duplicate.
    assert len(subagent_files) == 2 and inputs.duplicates == sum(f.usage_records for f in subagent_files) >= 3
    return inputs.usage_records


def _rid(call_id: str) -> str:
    return call_id.removeprefix("qwen-code:").split("-", 1)[-1].split("_", 1)[-1]


def triple(r: UsageRecord) -> tuple[int, int, int]:
    return r.usage.prompt_tokens, r.usage.cache_read_tokens, r.usage.output_tokens or 0


def test_each_call_counted_once_with_the_fake_upstreams_usage(gen: Generated, records: list[UsageRecord]) -> None:
    truth = gen.fake.usage_log
    assert len(records) == len(truth) >= 18
    assert Counter(map(triple, records)) == Counter(usage_triples(truth))
    # Calls of the main agent are known by their response id: the same call, the same figures, the same model.
    by_rid = {e["id"]: e for e in truth}
    mains = [r for r in records if r.kind != "subagent"]
    assert len(mains) >= 14
    for r in mains:
        e = by_rid[_rid(r.call_id)]
        assert triple(r) == usage_triples([e])[0] and r.model == e["model"]
    assert {r.api for r in records if r.model == "claude-sonnet-4-5"} == {"anthropic.messages"}
    assert {r.api for r in records if r.model == "qwen3-coder-plus"} == {"openai.chat"}
    assert all(r.client == "qwen-code" and r.project == str(gen.home / "work") for r in records)


def test_anthropic_mode_keeps_the_read_not_the_write(gen: Generated, records: list[UsageRecord]) -> None:
    """Qwen Code folds Anthropic's cache write into its prompt count: the reads are exact, the write is lost."""
    (first, second) = [r for r in records if r.model == "claude-sonnet-4-5"]
    truth = gen.calls["anthropic"]
    assert first.usage.cache_read_tokens == 0 and first.usage.uncached_tokens == first.usage.prompt_tokens
    assert second.usage.cache_read_tokens == truth[1]["usage"]["cache_read_input_tokens"] > 0
    assert second.usage.cache_write_tokens == 0 < truth[1]["usage"]["cache_creation_input_tokens"]
    assert first.write_unknown and second.write_unknown
    assert not any(r.write_unknown for r in records if r.model != "claude-sonnet-4-5")


def test_the_audit_says_its_anthropic_spend_is_a_lower_bound(gen: Generated, records: list[UsageRecord]) -> None:
    """The audit names the calls whose write the log lost, with their tokens counted as uncached, in the terminal,
    the JSON and the HTML page (a fresh user read $0.0824 for $0.1484 with no word of it)."""
    from typer.testing import CliRunner

    from agentcache._cli import app

    lost = [r for r in records if r.write_unknown]
    tokens = sum(r.usage.uncached_tokens for r in lost)
    want = f"{len(lost)} calls kept no cache-write count: their {tokens:,} tokens not read are counted as uncached"
    root = gen.home / ".qwen"
    text = CliRunner().invoke(app, ["audit", str(root), "--html", str(gen.home / "q.html")], catch_exceptions=False)
    assert text.exit_code == 0, text.stderr
    assert want in " ".join(text.stdout.split()), text.stdout
    assert want in (gen.home / "q.html").read_text()
    doc = json.loads(CliRunner().invoke(app, ["audit", str(root), "--json"], catch_exceptions=False).stdout)
    (source,) = [s for s in doc["sources"] if s["client"] == "Qwen Code"]
    assert source["caveat"].startswith(want)


def test_one_conversation_subagents_linked(gen: Generated, records: list[UsageRecord]) -> None:
    main = {r.session for r in records if _rid(r.call_id) in {e["id"] for e in gen.calls["fresh"]}}
    assert len(main) == 1
    for step in ("continue", "paused", "compress", "after"):
        assert {r.session for r in records if _rid(r.call_id) in {e["id"] for e in gen.calls[step]}} == main
    subs = [r for r in records if r.kind == "subagent"]
    kinds = Counter(r.session.rsplit("/", 1)[-1].split("-call_")[0] for r in subs)
    assert kinds["general-purpose"] == 2 and kinds["fork"] >= 1, kinds
    for r in subs:
        assert r.parent is not None and r.session.startswith(f"{r.parent}/")
    assert {r.parent for r in subs if "fork-call_" in r.session} <= {r.session for r in records if r.kind == "main"}


def test_compression_and_the_pause_on_the_right_calls(gen: Generated, records: list[UsageRecord]) -> None:
    (session,) = {r.session for r in records if _rid(r.call_id) == gen.calls["fresh"][0]["id"]}
    thread = [r for r in records if r.session == session]
    compress = {e["id"] for e in gen.calls["compress"]}
    assert [r.kind for r in thread if _rid(r.call_id) in compress] == ["compaction"] * len(compress) and compress
    assert [_rid(r.call_id) for r in thread if r.events == ("compacted",)] == [gen.calls["after"][0]["id"]]
    by_rid = {_rid(r.call_id): r for r in thread}
    before, first = by_rid[gen.calls["continue"][-1]["id"]], by_rid[gen.calls["paused"][0]["id"]]
    assert before.at is not None and first.at is not None and first.at - before.at >= PAUSE
    assert first.usage.cache_read_tokens == 0 < before.usage.cache_read_tokens  # the OpenAI cache forgot (600 s)


def test_detection_and_default_roots(gen: Generated) -> None:
    chat = next(p for p in _logs(gen.home) if "chats" in p.parts)
    assert detect_format(chat) == "qwen-code"
    env = {"HOME": "/h", "QWEN_HOME": "/q"}
    assert default_roots(env) == [Path("/q/projects"), Path("/h/.qwen/projects")]
    assert default_roots({"HOME": "/h", "QWEN_RUNTIME_DIR": "/r"})[0] == Path("/r/projects")


def test_bad_lines_cost_themselves(gen: Generated, tmp_path: Path) -> None:
    chat = next(p for p in _logs(gen.home) if "chats" in p.parts)
    lines = chat.read_text().splitlines()
    calls = len(read_qwen(chat).usage_records)
    at = next(i for i, ln in enumerate(lines) if "qwen-code.api_response" in ln)
    broken = json.loads(lines[at])
    broken["systemPayload"]["uiEvent"]["input_token_count"] = -5
    lines[at] = json.dumps(broken)
    lines.insert(1, "[1, 2]")
    path = tmp_path / chat.name
    path.write_text("\n".join(lines) + "\n" + lines[-1][:40])
    read = read_qwen(path)
    # The broken call's assistant line (its copy) stands in for it: no call lost, two errors.
    assert len(read.usage_records) == calls and read.truncated
    assert [e.record for e in read.errors] == [1, at + 1] and "not a count: -5" in str(read.errors[1])


def test_ledgers_recognised_and_claude_code_lines_not_claimed(tmp_path: Path) -> None:
    ledger = tmp_path / "token-usage-2026-12.jsonl"
    entry = {"schemaVersion": 1, "id": "x", "timestamp": "2026-12-01T00:00:00Z", "sessionId": "s", "inputTokens": 9}
    ledger.write_text(json.dumps(entry) + "\n")
    assert detect_format(ledger) == "qwen-code"
    read = read_qwen(ledger)
    assert not read.usage_records and not read.errors and read.ignored == 1
    message = {"role": "assistant", "content": [{"type": "text", "text": "hi"}], "usage": {"input_tokens": 3}}
    claude = {"parentUuid": None, "sessionId": "s", "uuid": "u", "type": "assistant", "message": message}
    assert not sniff_lines([claude])
