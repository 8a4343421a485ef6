"""The Codex CLI reader on rollouts the real ``codex exec`` writes, at test time, against the realistic fake upstream
(issue 21): each API call counted once with the fake's own usage, subagents linked, compaction and a TTL expiry on
the right calls; older rollout shapes (token counts only, a fork's copied counts) and bad input.

One conversation: a fresh run, a resume, a resume after the user paused an hour (the OpenAI cache forgot the
prefix), a resume whose context passes ``model_auto_compact_token_limit`` (Codex compacts); then a run that spawns
a subagent (``spawn_agent``) and one that forks the conversation into it (``fork_context``).
"""

from __future__ import annotations

import json
import shutil
import tempfile
from collections import Counter
from collections.abc import Callable, Iterator
from pathlib import Path
from typing import Any

import pytest

from agentcache.loaders import UsageRecord, detect_format, load
from agentcache.loaders._codex import default_roots, read_codex
from agentcache.loaders._paths import load_paths
from tests.clients.agentlogs import Generated, Step, generate, require, shift_jsonl
from tests.clients.drivers import Client, Codex
from tests.clients.fake_upstream import FakeUpstream

PAUSE = 3600.0


class CodexWith(Codex):
    """Codex with extra ``config.toml`` lines for the next runs."""

    extra = ""

    def configure(self, base_url: str) -> None:
        super().configure(base_url)
        config = self.home / "codex" / "config.toml"
        config.write_text(self.extra + config.read_text())


def _compact_soon(driver: Client, fake: FakeUpstream) -> None:
    """Set the auto-compaction limit just above the conversation's last prompt: the next call passes it."""
    assert isinstance(driver, CodexWith)
    last = fake.usage_log[-1]["usage"]["input_tokens"]
    driver.extra = f"model_auto_compact_token_limit = {last + 50}\n"


def _no_limit(driver: Client, fake: FakeUpstream) -> None:
    assert isinstance(driver, CodexWith)
    driver.extra = ""


STEPS = (
    Step("fresh", "Print a marker. agentcache-script:shell"),
    Step("resume", "Print it again. agentcache-script:shell", resume=True),
    Step("paused", "Print it after a pause. agentcache-script:shell", resume=True, pause=PAUSE),
    Step("compact", "Print it once more. agentcache-script:shell", resume=True, setup=_compact_soon),
    Step("subagent", "Delegate to a subagent. agentcache-script:task", setup=_no_limit),
    Step("fork", "Delegate with the context. agentcache-script:fork"),
)


@pytest.fixture(scope="module")
def gen() -> Iterator[Generated]:
    require("codex")
    home = Path(tempfile.mkdtemp(prefix="agentcache-codex-logs-"))
    yield generate(CodexWith(home), STEPS, lambda h, since, s: shift_jsonl(_rollouts(h), since, s))
    shutil.rmtree(home, ignore_errors=True)


def _rollouts(home: Path) -> list[Path]:
    return sorted((home / "codex" / "sessions").rglob("rollout-*.jsonl"))


@pytest.fixture(scope="module")
def records(gen: Generated) -> list[UsageRecord]:
    inputs = load_paths([gen.home / "codex" / "sessions"])
    assert [f.format for f in inputs.files] == ["codex"] * len(inputs.files) and inputs.files
    assert all(not f.errors and f.error is None and not f.truncated for f in inputs.files)
    return inputs.usage_records


def _by_call(records: list[UsageRecord]) -> dict[str, UsageRecord]:
    return {r.call_id: r for r in records}


def test_each_call_counted_once_with_the_fake_upstreams_usage(gen: Generated, records: list[UsageRecord]) -> None:
    truth = gen.fake.usage_log
    assert len(records) == len(truth) >= 14
    by_call = _by_call(records)
    assert set(by_call) == {f"codex:resp_{e['id']}" for e in truth}
    for e in truth:
        rec, u = by_call[f"codex:resp_{e['id']}"], e["usage"]
        assert rec.usage.prompt_tokens == u["input_tokens"], e
        assert rec.usage.cache_read_tokens == u["input_tokens_details"]["cached_tokens"], e
        assert rec.usage.output_tokens == u["output_tokens"] and rec.model == e["model"] == "gpt-5.2-codex"
        assert rec.client == "codex" and rec.api == "openai.responses"
    assert sum(r.usage.prompt_tokens for r in records) == sum(e["usage"]["input_tokens"] for e in truth)


def test_one_conversation_and_its_subagents_linked(gen: Generated, records: list[UsageRecord]) -> None:
    by_call = _by_call(records)
    session_of = {step: {by_call[f"codex:resp_{e['id']}"].session for e in gen.calls[step]} for step in gen.calls}
    # fresh, resume, paused and compact are one thread; each delegating run has its own and one subagent.
    main = session_of["fresh"]
    assert len(main) == 1 and session_of["resume"] == session_of["paused"] == session_of["compact"] == main
    for step in ("subagent", "fork"):
        calls = [by_call[f"codex:resp_{e['id']}"] for e in gen.calls[step]]
        parents = [r for r in calls if r.kind == "main"]
        subs = [r for r in calls if r.kind == "subagent"]
        assert len(parents) == 3 and len(subs) == 2, [(r.kind, r.session) for r in calls]
        parent = {r.session for r in parents}
        assert len(parent) == 1 and {r.parent for r in subs} == parent
        (child,) = {r.session for r in subs}
        assert child.startswith(f"{next(iter(parent))}/") and not parent & main
    assert all(r.project == str(gen.home / "work") for r in records)


def test_compaction_is_the_call_codex_sent_for_it(gen: Generated, records: list[UsageRecord]) -> None:
    compactions = [r for r in records if r.kind == "compaction"]
    sent = [r for r in gen.fake.model_requests() if _request_kind(r.headers) == "compaction"]
    assert len(compactions) == len(sent) == 1
    (call,) = compactions
    assert call.call_id in {f"codex:resp_{e['id']}" for e in gen.calls["compact"]}
    thread = [r for r in records if r.session == call.session]
    after = thread[thread.index(call) + 1]
    assert after.events == ("compacted",) and after.kind == "main"
    assert [r.events for r in thread].count(("compacted",)) == 1


def _request_kind(headers: dict[str, str]) -> str | None:
    meta = headers.get("x-codex-turn-metadata")
    return json.loads(meta).get("request_kind") if meta else None


def test_the_pause_shows_as_a_gap_and_a_cold_cache(gen: Generated, records: list[UsageRecord]) -> None:
    by_call = _by_call(records)
    before = by_call[f"codex:resp_{gen.calls['resume'][-1]['id']}"]
    first = by_call[f"codex:resp_{gen.calls['paused'][0]['id']}"]
    assert before.at is not None and first.at is not None and first.at - before.at >= PAUSE
    # The OpenAI cache forgot the conversation (and the tools) after 600 s: nothing is read.
    assert gen.calls["paused"][0]["usage"]["input_tokens_details"]["cached_tokens"] == first.usage.cache_read_tokens
    assert first.usage.cache_read_tokens == 0 < before.usage.cache_read_tokens
    # The log's times are the fake's clock's (the shift matches the advance): within a few seconds of each call.
    truth_at = {f"codex:resp_{e['id']}": e["at"] for e in gen.fake.usage_log}
    assert all(abs(r.at - truth_at[r.call_id]) < 5 for r in records if r.at is not None)


def test_detection_and_default_roots(gen: Generated) -> None:
    rollout = _rollouts(gen.home)[0]
    assert detect_format(rollout) == "codex" and load(rollout).format == "codex"
    assert default_roots({"CODEX_HOME": "/x", "HOME": "/h"}) == [Path("/x/sessions"), Path("/h/.codex/sessions")]
    assert default_roots({"HOME": "/h"}) == [Path("/h/.codex/sessions")]


def _rewrite(files: list[Path], dest: Path, keep: Callable[[dict[str, Any]], bool]) -> list[Path]:
    """Copies of ``files`` in ``dest`` with only the lines ``keep(obj)`` accepts (as ``keep`` left them)."""
    out = []
    for path in files:
        objs = [json.loads(ln) for ln in path.read_text().splitlines()]
        out.append(dest / path.name)
        out[-1].write_text("".join(json.dumps(o) + "\n" for o in objs if keep(o)))
    return out


def test_older_rollouts_without_usage_records_count_the_same(gen: Generated, tmp_path: Path) -> None:
    """Before 0.171 a call was known by its ``token_count`` event alone (written twice at times)."""
    files = _rewrite(_rollouts(gen.home), tmp_path, lambda o: o.get("type") != "token_usage_record")
    old = load_paths([tmp_path]).usage_records
    new = load_paths([gen.home / "codex" / "sessions"]).usage_records
    assert len(old) == len(new) and all(r.call_id.count(":") == 2 for r in old)
    key = lambda r: (r.session, r.kind, r.events, r.usage.prompt_tokens, r.usage.cache_read_tokens)  # noqa: E731
    assert Counter(map(key, old)) == Counter(map(key, new))
    assert files


def test_compaction_found_without_its_output_marker(gen: Generated, tmp_path: Path) -> None:
    """A compaction whose answer item is not marked (``metadata.compaction_output``, new in 0.171): the call just
    before the ``compacted`` line, with only events between, is still the compaction."""

    def unmarked(obj: dict[str, Any]) -> bool:
        obj.pop("metadata", None)
        return True

    files = _rewrite(_rollouts(gen.home), tmp_path, unmarked)
    old = [r for f in files for r in read_codex(f).usage_records]
    new = [r for f in _rollouts(gen.home) for r in read_codex(f).usage_records]
    assert [(r.call_id, r.kind, r.events) for r in old] == [(r.call_id, r.kind, r.events) for r in new]
    assert [r.kind for r in old].count("compaction") == 1


def test_a_forks_copied_token_counts_count_once(gen: Generated, tmp_path: Path) -> None:
    """Codex 0.128-0.153 copied the parent's ``token_count`` events into a fork, re-stamped at fork time, and the
    fork's own counts went on from the parent's running total. Built here from the real parent rollout (counts
    only, no ``session_id``: those versions had none): the copies are the parent's calls, counted once."""
    (parent,) = _rewrite(_rollouts(gen.home)[:1], tmp_path, lambda o: o.get("type") != "token_usage_record")
    lines = [json.loads(ln) for ln in parent.read_text().splitlines()]
    meta = {k: v for k, v in lines[0]["payload"].items() if k != "session_id"}
    lines[0]["payload"] = meta
    parent.write_text("\n".join(json.dumps(o) for o in lines) + "\n")
    counts = [o for o in lines if o["type"] == "event_msg" and o["payload"]["type"] == "token_count"]
    later = "2099-01-01T00:00:00.000Z"
    own = json.loads(json.dumps(counts[-1]))  # one call of the fork's own, after the inherited total
    info = own["payload"]["info"]
    info["total_token_usage"] = {k: v + info["last_token_usage"][k] for k, v in info["total_token_usage"].items()}
    child_meta = {**meta, "id": "child-thread", "forked_from_id": meta["id"]}
    child = [{"type": "session_meta", "payload": child_meta}, *lines, own]
    child = [{**o, "timestamp": later} for o in child]
    (tmp_path / "rollout-child.jsonl").write_text("\n".join(json.dumps(o) for o in child) + "\n")
    inputs = load_paths([tmp_path])
    parent_calls = len(read_codex(parent).usage_records)
    assert parent_calls >= 4
    assert len(inputs.usage_records) == parent_calls + 1 and inputs.duplicates == parent_calls
    sessions = Counter(r.session for r in inputs.usage_records)
    assert sessions == {meta["id"]: parent_calls, "child-thread": 1}


def test_bad_lines_cost_themselves(gen: Generated, tmp_path: Path) -> None:
    source = _rollouts(gen.home)[0]
    lines = source.read_text().splitlines()
    calls = len(read_codex(source).usage_records)
    usage_at = next(i for i, ln in enumerate(lines) if json.loads(ln)["type"] == "token_usage_record")
    broken = json.loads(lines[usage_at])
    broken["payload"]["usage"] = "lots"
    lines[usage_at] = json.dumps(broken)
    twin = next(i for i in range(usage_at, len(lines)) if '"token_count"' in lines[i])
    lines[twin] = lines[twin].replace('"token_count"', '"token_cnt"')  # its twin count would stand in otherwise
    lines.insert(3, "{not json")
    path = tmp_path / source.name
    path.write_text("\n".join(lines) + "\n" + '{"timestamp": "2026-01-01T00:00:00Z", "type": "event_m')
    read = read_codex(path)
    assert len(read.usage_records) == calls - 1 and read.truncated
    assert [e.record for e in read.errors] == [3, usage_at + 1]
    assert "token usage without input_tokens" in str(read.errors[1])
    assert read.ignored == read.lines - len(read.usage_records) - 2


def test_files_without_usage_are_recognised_and_empty(tmp_path: Path) -> None:
    """A rollout from before the typed lines (codex-rs ``rollout.rs`` of mid-2025) and the prompt history."""
    legacy = tmp_path / "rollout-2025-06-01T10-00-00-0197a1b2-0000-7000-8000-000000000001.jsonl"
    lines = [
        {"id": "0197a1b2-0000-7000-8000-000000000001", "timestamp": "2025-06-01T10:00:00Z", "instructions": None},
        {"type": "message", "role": "user", "content": [{"type": "input_text", "text": "hi"}]},
        {"record_type": "state"},
    ]
    legacy.write_text("".join(json.dumps(o) + "\n" for o in lines))
    history = tmp_path / "history.jsonl"
    history.write_text(json.dumps({"session_id": "s", "ts": 1750000000, "text": "hi"}) + "\n")
    for path, count in ((legacy, 3), (history, 1)):
        result = load(path)
        assert result.format == "codex" and not result.usage_records and not result.errors
        assert result.lines == result.ignored == count


def test_agentcache_audit_on_the_rollouts(gen: Generated) -> None:
    """``agentcache audit <sessions> --json`` (the door a user runs): every call once with the fake's usage, the
    subagents linked, the pause named ttl.expired and the compaction messages.compacted, both inferred; OpenAI's
    automatic cache has no time-only lever, so the agentcache arm costs what was reported."""
    from typer.testing import CliRunner

    from agentcache._cli import app

    done = CliRunner().invoke(app, ["audit", str(gen.home / "codex" / "sessions"), "--json"], catch_exceptions=False)
    assert done.exit_code == 0, done.stderr
    doc = json.loads(done.stdout)
    truth = gen.fake.usage_log
    reported = doc["totals"]["reported"]
    assert doc["mode"] == "reported" and reported["requests"] == len(truth)
    assert reported["prompt_tokens"] == sum(e["usage"]["input_tokens"] for e in truth)
    assert reported["cache_read_tokens"] == sum(e["usage"]["input_tokens_details"]["cached_tokens"] for e in truth)
    assert doc["totals"]["agentcache"]["cost_usd"] == reported["cost_usd"] > 0
    (source,) = doc["sources"]
    assert source["client"] == "Codex CLI" and source["calls"] == len(truth) and source["errors"] == 0
    causes = {m["cause"]: m for m in doc["misses"] if m["arm"] == "reported"}
    assert causes["ttl.expired"]["inferred"] and "pause > 5m TTL" in causes["ttl.expired"]["detail"]
    assert causes["messages.compacted"]["inferred"]
    subs = [s for s in doc["sessions"] if s.get("parent")]
    assert len(subs) == 2 and all(s["lineage"] == s["parent"] for s in subs)
