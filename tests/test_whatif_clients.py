"""The ``agentcache`` arm of an audit of agents' own logs on a real client's logs (issue 21, "Must show": cost below
reported where keep-warm or a TTL change pays, equal where it does not).

Claude Code (the pinned version) runs against the realistic fake upstream, whose clock makes cache entries expire:
one conversation where the user pauses twice for ten minutes between turns (past the 5-minute TTL Claude Code's
writes use), and one without pauses. After the first pause the TTL policy has seen a long pause and writes the next
turns' entries for an hour, so the second pause reads what the client wrote again: the arm costs less. Without
pauses every decision stays the client's: the arm costs exactly what was reported.
"""

from __future__ import annotations

import json
import shutil
import tempfile
from collections.abc import Iterator
from pathlib import Path
from typing import Any

import pytest
from typer.testing import CliRunner

from agentcache._cli import app
from tests.clients.agentlogs import Generated, Step, generate, require, shift_jsonl
from tests.clients.drivers import ClaudeCode

PAUSE = 600.0
STEPS = (
    Step("fresh", "Print a marker. agentcache-script:shell"),
    Step("again", "Print it again. agentcache-script:shell", resume=True),
    Step("paused", "Print it after a pause. agentcache-script:shell", resume=True, pause=PAUSE),
    Step("next", "Print it once more. agentcache-script:shell", resume=True),
    Step("paused_again", "Print it after another pause. agentcache-script:shell", resume=True, pause=PAUSE),
    Step("other", "A conversation without pauses. agentcache-script:shell"),
    Step("other_again", "And its follow-up. agentcache-script:shell", resume=True),
)


@pytest.fixture(scope="module")
def gen() -> Iterator[Generated]:
    require("claude")
    home = Path(tempfile.mkdtemp(prefix="agentcache-whatif-"))
    yield generate(ClaudeCode(home), STEPS, lambda h, since, s: shift_jsonl(_transcripts(h), since, s))
    shutil.rmtree(home, ignore_errors=True)


def _transcripts(home: Path) -> list[Path]:
    return sorted((home / "claude" / "projects").rglob("*.jsonl"))


@pytest.fixture(scope="module")
def doc(gen: Generated) -> dict[str, Any]:
    done = CliRunner().invoke(app, ["audit", str(gen.home / "claude" / "projects"), "--json"], catch_exceptions=False)
    assert done.exit_code == 0, done.stderr
    report: dict[str, Any] = json.loads(done.stdout)
    return report


def _sessions(doc: dict[str, Any]) -> dict[str, dict[str, Any]]:
    """The two main conversations: the one with pauses (more calls) and the other."""
    main = sorted((s for s in doc["sessions"] if not s.get("parent")), key=lambda s: -s["requests"])
    assert len(main) == 2, [s["session"] for s in doc["sessions"]]
    return {"paused": main[0], "steady": main[1]}


def test_a_ttl_change_pays_after_the_first_long_pause(doc: dict[str, Any]) -> None:
    paused = _sessions(doc)["paused"]
    reported, ours = paused["arms"]["reported"]["cost_usd"], paused["arms"]["agentcache"]["cost_usd"]
    assert ours < reported, (ours, reported)
    expired = [m for m in doc["misses"] if m["session"] == paused["session"] and m["cause"] == "ttl.expired"]
    by_arm = {arm: [m["request"] for m in expired if m["arm"] == arm] for arm in ("reported", "agentcache")}
    assert len(by_arm["reported"]) == 2  # both pauses expired the client's 5-minute entries
    assert by_arm["agentcache"] == by_arm["reported"][:1]  # the second is read under the 1h TTL chosen after the first
    (row,) = [c for c in doc["causes"] if c["cause"] == "ttl.expired"]
    assert row["saved_usd"] > 0 and set(row["saved_by"]) == {"ttl"}


def test_equal_where_nothing_pays(doc: dict[str, Any]) -> None:
    steady = _sessions(doc)["steady"]
    assert steady["arms"]["agentcache"] == steady["arms"]["reported"]
    assert not [m for m in doc["misses"] if m["session"] == steady["session"] and m["cause"] == "ttl.expired"]
