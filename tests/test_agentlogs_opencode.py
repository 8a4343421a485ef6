"""The opencode reader on the SQLite database the real ``opencode run`` writes, at test time, against the realistic
fake upstream (issue 21): each API call counted once with the fake's own usage (opencode keeps no record of its
title calls: those are left out of the truth), subagents linked, compaction and a TTL expiry on the right calls,
a fork's copied messages counted once, an OpenAI model's usage read with OpenAI's semantics; the older JSON
storage and bad input.

One conversation: a fresh run, a continue with a long note, a continue under a context limit the note passed
(opencode compacts first), a continue after the user paused an hour (Anthropic's 5-minute entries expired); then
a run that delegates to a subagent (``task``), and ``run --continue --fork`` of it on ``openai/gpt-5.1``.
"""

from __future__ import annotations

import json
import shutil
import sqlite3
import tempfile
from collections import Counter
from collections.abc import Iterator
from contextlib import closing
from pathlib import Path
from typing import Any

import pytest

from agentcache.loaders import UsageRecord, detect_format
from agentcache.loaders._opencode import default_roots, read_opencode, sniff_path
from agentcache.loaders._paths import load_paths
from tests.clients.agentlogs import Generated, Step, generate, require, shift_opencode, usage_triples
from tests.clients.drivers import Client, OpenCode
from tests.clients.fake_upstream import FakeUpstream, Recorded

PAUSE = 3600.0
MODEL = "claude-sonnet-4-5"
ASSISTANT = "json_extract(data, '$.role') = 'assistant'"  # SQL: an assistant message row


class OpenCodeWith(OpenCode):
    """opencode with the OpenAI provider pointed at the fake too, extra ``opencode.json`` settings and run flags."""

    extra: dict[str, Any]
    flags: list[str]

    def __init__(self, home: Path) -> None:
        super().__init__(home)
        self.extra, self.flags = {}, []

    def configure(self, base_url: str) -> None:
        super().configure(base_url)
        path = self.work / "opencode.json"
        config = json.loads(path.read_text())
        config["provider"]["openai"] = {"options": {"baseURL": f"{base_url}/v1", "apiKey": "sk-agentcache-test"}}
        config["provider"]["anthropic"].update(self.extra)
        path.write_text(json.dumps(config, indent=2))

    def command(self, prompt: str, resume: bool) -> list[str]:
        cmd = super().command(prompt, resume)
        return [*cmd[:2], *self.flags, *cmd[2:]]


def _small_context(driver: Client, fake: FakeUpstream) -> None:
    """A context limit just under the conversation's last call (the one with the long note): opencode compacts
    before the next prompt, and the summary leaves the note out, well under the limit."""
    assert isinstance(driver, OpenCodeWith)
    u = fake.usage_log[-1]["usage"]
    last = u["input_tokens"] + u["cache_read_input_tokens"] + u["cache_creation_input_tokens"] + u["output_tokens"]
    driver.extra = {"models": {MODEL: {"limit": {"context": last - 100 + 1000, "output": 1000}}}}


def _fork_on_openai(driver: Client, fake: FakeUpstream) -> None:
    assert isinstance(driver, OpenCodeWith)
    driver.extra, driver.flags = {}, ["--fork", "-m", "openai/gpt-5.1"]


NOTE = " ".join(["a long note the user pasted"] * 250)
STEPS = (
    Step("fresh", "Print a marker. agentcache-script:shell"),
    Step("note", f"Print it with this note: {NOTE} agentcache-script:shell", resume=True),
    Step("compact", "Print it again. agentcache-script:shell", resume=True, setup=_small_context),
    Step("paused", "Print it after a pause. agentcache-script:shell", resume=True, pause=PAUSE),
    Step("subagent", "Delegate to a subagent. agentcache-script:task", setup=lambda d, f: setattr(d, "extra", {})),
    Step("fork", "Print it with another model. agentcache-script:shell", resume=True, setup=_fork_on_openai),
)


@pytest.fixture(scope="module")
def gen() -> Iterator[Generated]:
    require("opencode")
    home = Path(tempfile.mkdtemp(prefix="agentcache-opencode-logs-"))
    yield generate(OpenCodeWith(home), STEPS, lambda h, since, s: shift_opencode(_db(h), since, s))
    shutil.rmtree(home, ignore_errors=True)


def _db(home: Path) -> Path:
    return home / "xdg" / "data" / "opencode" / "opencode.db"


@pytest.fixture(scope="module")
def records(gen: Generated) -> list[UsageRecord]:
    inputs = load_paths([_db(gen.home)])
    (file,) = inputs.files
    assert file.format == "opencode" and not file.errors and file.error is None
    return inputs.usage_records


def _calls(gen: Generated) -> list[tuple[Recorded, dict[str, Any]]]:
    """The fake's calls opencode logs (not its title calls), with the request each answered."""
    pairs = list(zip(gen.fake.model_requests(), gen.fake.usage_log, strict=True))
    return [(req, e) for req, e in pairs if "title generator" not in json.dumps(req.body.get("system"))]


def _triple(r: UsageRecord) -> tuple[int, int, int]:
    return r.usage.prompt_tokens, r.usage.cache_read_tokens, r.usage.output_tokens or 0


def test_each_call_counted_once_with_the_fake_upstreams_usage(gen: Generated, records: list[UsageRecord]) -> None:
    calls = _calls(gen)
    assert len(records) == len(calls) == 14 and len(gen.fake.usage_log) - len(calls) == 2  # two titled sessions
    # Per opencode session (the request names it in x-session-id): the same calls, with the same usage and model.
    for sid in {req.headers["x-session-id"] for req, _ in calls}:
        truth = [e for req, e in calls if req.headers["x-session-id"] == sid]
        mine = [r for r in records if r.session.rsplit("/", 1)[-1] == sid]
        assert Counter(map(_triple, mine)) == Counter(usage_triples(truth)), sid
        assert Counter(r.model for r in mine) == Counter(e["model"] for e in truth)
    anthropic = [e for _, e in calls if "cache_creation_input_tokens" in e["usage"]]
    writes = sum(e["usage"]["cache_creation_input_tokens"] for e in anthropic)
    assert sum(r.usage.cache_write_tokens for r in records) == writes > 0
    assert all(r.client == "opencode" and r.project == str(gen.home / "work") for r in records)


def test_providers_usage_read_with_their_own_semantics(records: list[UsageRecord]) -> None:
    """opencode logs the uncached remainder for both; the reader puts back the API each call went to."""
    openai = [r for r in records if r.model == "gpt-5.1"]
    assert len(openai) == 2 and {r.api for r in openai} == {"openai.responses"}
    assert openai[1].usage.cache_read_tokens > 0 and openai[1].usage.cache_write_tokens == 0
    assert {r.api for r in records if r.model == MODEL} == {"anthropic.messages"}


def test_subagent_linked_and_fork_copies_counted_once(gen: Generated, records: list[UsageRecord]) -> None:
    subs = [r for r in records if r.kind == "subagent"]
    assert len(subs) == 2 and len({r.session for r in subs}) == 1
    (parent,) = {r.parent for r in subs}
    assert parent is not None and subs[0].session.startswith(f"{parent}/")
    assert len([r for r in records if r.session == parent]) == 2
    # The fork copied the delegating session's two calls (and, so, the same figures) into a new session: not
    # counted again; the new session holds only its own two OpenAI calls.
    with closing(sqlite3.connect(_db(gen.home))) as db:
        (stored,) = db.execute(f"SELECT count(*) FROM message WHERE {ASSISTANT}").fetchone()
    assert stored == len(records) + 2
    fork = {r.session for r in records if r.model == "gpt-5.1"}
    assert len(fork) == 1 and len([r for r in records if r.session in fork]) == 2


def test_compaction_and_the_pause_on_the_right_calls(gen: Generated, records: list[UsageRecord]) -> None:
    main = [r for r in records if r.session == records[0].session]
    # fresh (2 calls), note (2), compact: the compaction before the prompt, then one answer (the fake answers
    # opencode's "continue" message after the summary in text), paused (2).
    assert [r.kind for r in main] == ["main"] * 4 + ["compaction"] + ["main"] * 3
    assert [r.events for r in main] == [()] * 5 + [("compacted",)] + [()] * 2
    assert main[5].usage.prompt_tokens < main[3].usage.prompt_tokens  # the summary left the note out
    before, first = main[5], main[6]
    assert before.at is not None and first.at is not None and first.at - before.at >= PAUSE
    # Anthropic's 5-minute entries expired: the first call after the pause writes its whole prefix again.
    assert first.usage.cache_read_tokens == 0 < before.usage.cache_read_tokens
    assert first.usage.cache_write_tokens == first.usage.prompt_tokens
    truth_at = [e["at"] for _, e in _calls(gen)]
    assert sorted(truth_at) == truth_at and abs(first.at - gen.calls["paused"][0]["at"]) < 5


def test_detection_and_default_roots(gen: Generated, tmp_path: Path) -> None:
    assert detect_format(_db(gen.home)) == "opencode" and sniff_path(_db(gen.home))
    other = tmp_path / "other.db"
    with closing(sqlite3.connect(other)) as db:
        db.execute("CREATE TABLE t (x)")
    assert not sniff_path(other) and not sniff_path(tmp_path / "missing.db")
    data = Path("/x/opencode")
    assert default_roots({"XDG_DATA_HOME": "/x", "HOME": "/h"}) == [data / "opencode.db", data / "storage" / "session"]
    assert default_roots({"HOME": "/h"})[0] == Path("/h/.local/share/opencode/opencode.db")


def _export_json_storage(db_path: Path, storage: Path) -> None:
    """The database's sessions and messages as the older JSON storage (``json-migration.ts``'s layout, reversed)."""
    with closing(sqlite3.connect(db_path)) as db:
        for sid, project, parent, directory, created in db.execute(
            "SELECT id, project_id, parent_id, directory, time_created FROM session"
        ):
            info = {"id": sid, "parentID": parent, "directory": directory, "time": {"created": created}}
            (storage / "session" / project).mkdir(parents=True, exist_ok=True)
            (storage / "session" / project / f"{sid}.json").write_text(json.dumps(info))
        for mid, sid, data in db.execute("SELECT id, session_id, data FROM message"):
            (storage / "message" / sid).mkdir(parents=True, exist_ok=True)
            (storage / "message" / sid / f"{mid}.json").write_text(
                json.dumps({"id": mid, "sessionID": sid, **json.loads(data)})
            )


def test_older_json_storage_reads_the_same(gen: Generated, records: list[UsageRecord], tmp_path: Path) -> None:
    storage = tmp_path / "opencode" / "storage"
    _export_json_storage(_db(gen.home), storage)
    inputs = load_paths([tmp_path / "opencode"])
    assert {f.format for f in inputs.files} == {"opencode"} and inputs.unrecognised > 0  # message files
    key = lambda r: (r.session, r.parent, r.kind, r.events, r.model, _triple(r))  # noqa: E731
    assert Counter(map(key, inputs.usage_records)) == Counter(map(key, records))
    # Both stores at once (a database migrated from the JSON files): each call once.
    both = load_paths([tmp_path / "opencode", _db(gen.home)])
    assert len(both.usage_records) == len(records) and both.duplicates == len(records)


def test_bad_messages_cost_themselves(gen: Generated, tmp_path: Path) -> None:
    copy = tmp_path / "opencode.db"
    with closing(sqlite3.connect(_db(gen.home))) as src, closing(sqlite3.connect(copy)) as dst:
        src.backup(dst)
        rows = dst.execute(f"SELECT id FROM message WHERE {ASSISTANT} LIMIT 2").fetchall()
        dst.execute("UPDATE message SET data = '{not json' WHERE id = ?", rows[0])
        dst.execute("UPDATE message SET data = json_set(data, '$.tokens.input', 'many') WHERE id = ?", rows[1])
        dst.commit()
    read = read_opencode(copy)
    assert len(read.errors) == 2 and any("token count is not a count: 'many'" in str(e) for e in read.errors)
    assert len(read.usage_records) == len(read_opencode(_db(gen.home)).usage_records) - 2
    assert read.ignored == read.lines - len(read.usage_records) - 2


def test_the_audit_says_the_title_calls_are_not_in_the_logs(gen: Generated) -> None:
    """opencode keeps no record of its session-title calls (the fake saw them; the log did not): the audit says so
    beside its figures, as it does for Claude Code's."""
    from typer.testing import CliRunner

    from agentcache._cli import app

    titles = len(gen.fake.usage_log) - len(_calls(gen))
    assert titles > 0
    done = CliRunner().invoke(app, ["audit", str(_db(gen.home)), "--json"], catch_exceptions=False)
    (source,) = json.loads(done.stdout)["sources"]
    assert source["client"] == "opencode" and "session-title calls" in source["leaves_out"]
