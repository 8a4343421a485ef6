"""Policies in isolation: TTL choice and keep-warm, OpenAI lineage keys, baseline strategies, the
opt-in volatile move, and settings."""

from __future__ import annotations

import copy
import json
from pathlib import Path
from typing import Any

import pytest

from agentcache._config import Settings, load_settings
from agentcache._exceptions import ConfigError
from agentcache.adapters import canonicalize
from agentcache.model._canonical import with_markers
from agentcache.model._rules import anthropic_rules
from agentcache.policies import KeyPlanner, apply_strategy, choose_ttl, jump_hash, plan_breakpoints, plan_keep_warm
from agentcache.policies.volatility import MOVED_PREFIX
from agentcache.session._pipeline import ScopeMemory, SessionPipeline

from .clients.fake_upstream import unmarked
from .clients.harness import markers
from .conftest import CASES, anthropic_messages, anthropic_tools, policy

RULES = anthropic_rules("claude-opus-4-8")


def test_ttl_5m_without_timing_or_short_gaps() -> None:
    assert choose_ttl(None, 10_000, 200, RULES).ttl == "5m"
    assert choose_ttl([3.0, 5.0, 2.0, 8.0], 10_000, 200, RULES).ttl == "5m"


def test_ttl_1h_when_long_gaps_are_common() -> None:
    d = choose_ttl([600.0, 4.0, 900.0, 1200.0], 20_000, 300, RULES)
    assert d.ttl == "1h"
    assert d.expected_cost_1h < d.expected_cost_5m
    assert "P(gap>5m)" in d.reason


def test_ttl_not_worth_1h_for_a_large_new_tail() -> None:
    # Writing 20k new tokens at 2x to protect a 1k prefix is not worth it.
    assert choose_ttl([600.0, 700.0], 1_000, 20_000, RULES).ttl == "5m"


def test_ttl_pinned_by_settings() -> None:
    assert choose_ttl([1.0], 10, 10, RULES, pinned="1h").ttl == "1h"


def test_keep_warm_decision() -> None:
    d = plan_keep_warm(900.0, 300.0, 50_000, RULES)
    assert d.send and d.count == 3 and d.first_at == 270.0
    assert d.cost_keep_warm == pytest.approx(3 * 0.1 * 50_000)
    long = plan_keep_warm(4 * 3600.0, 300.0, 50_000, RULES)
    assert not long.send  # 53 refreshes cost more than writing the prefix again
    assert not plan_keep_warm(100.0, 300.0, 50_000, RULES).send


def test_jump_hash_is_consistent() -> None:
    keys = range(2000)
    before = [jump_hash(k * 7919, 4) for k in keys]
    after = [jump_hash(k * 7919, 5) for k in keys]
    moved = sum(a != b for a, b in zip(before, after, strict=True))
    assert all(0 <= b < 4 for b in before)
    assert 0 < moved < 2000 * 0.35  # about 1/5 move, never most


def test_key_planner_shards_only_for_a_sustained_rate_over_several_lineages() -> None:
    kp = KeyPlanner(rpm_per_key=15)
    first = kp.key("fam", "lineage-a", 0.0)
    assert kp.shards("fam") == 1  # asking for a key counts nothing: only a sent request is recorded
    kp.record("fam", 0.0, "lineage-a")
    assert first == kp.key("fam", "lineage-a", 1.0) == "ac-fam-0"
    # One agent's quick requests are no rate to shard for (issue 23: 3 requests in 10 s once made 2 keys).
    for t in (1.0, 5.0, 9.0):
        kp.record("fam", t, "lineage-a")
    assert kp.shards("fam") == 1
    # Nor is one lineage's own traffic, however fast: its requests all carry one key.
    for i in range(40):
        kp.record("fam", 10.0 + i * 0.5, "lineage-a")
    assert kp.shards("fam") == 1 and kp.key("fam", "lineage-b", 30.0) == "ac-fam-0"
    # Several lineages: counted while under one key's minute, ...
    busy = KeyPlanner(rpm_per_key=15)
    for i in range(15):
        busy.record("f", i * 0.5, f"l{i}")
    assert busy.shards("f") == 1  # 15 requests of 15 lineages in 7 s: still one key's minute
    # ... and past it within a young window, a burst: its rate so far taken for the minute (16 in 7.5 s over the
    # 10 s floor: 96/min), at most one shard per lineage
    busy.record("f", 7.5, "l15")
    assert busy.shards("f") == 7
    for i in range(46):
        busy.record("f", 60.0 + i * 1.5, f"l{i % 20}")
    assert busy.shards("f") == 3  # steady: the last minute's 40 requests of 20 lineages, 15 per key
    assert len({busy.key("f", f"new{i}", 128.0) for i in range(40)}) > 1
    # The count follows the traffic down: a minute later new lineages share one key again.
    busy.record("f", 300.0, "late")
    assert busy.shards("f") == 1 and busy.key("f", "new1", 301.0) == "ac-f-0"


def test_key_planner_forgets_the_least_recently_used_families() -> None:
    kp = KeyPlanner(rpm_per_key=1, max_families=3)
    for t in range(3):
        kp.record("busy", float(t), f"l{t}")
    assert kp.shards("busy") == 3  # 3 requests of 3 lineages in the last minute, 1 per key
    for i in range(10):  # a timestamp in the system prompt: a new family on every request
        kp.record(f"f{i}", 10.0)
    assert len(kp._times) == 3 and kp.shards("busy") == 1  # bounded; a forgotten family starts over


def test_subagent_shares_the_root_key_and_session_key_is_stable() -> None:
    case = json.loads((CASES / "k02-tool-inserted-mid-list.json").read_text())
    scope = ScopeMemory()
    root = SessionPipeline("openai", scope=scope, session="root")
    child = SessionPipeline("openai", scope=scope, session="root/child", lineage="root")
    other = SessionPipeline("openai", scope=scope, session="other")
    keys = []
    for pipe in (root, child, other):
        prep = pipe.prepare("openai.chat", case["requests"][0]["body"], now=0.0)
        keys.append(prep.body["prompt_cache_key"])
        pipe.commit(prep)
    assert keys[0] == keys[1]
    assert keys[0].startswith("ac-")
    # Same agent family: with one shard every session shares the key (and the static prefix).
    assert keys[2] == keys[0]
    later = root.prepare("openai.chat", case["requests"][1]["body"], now=5.0)
    assert later.body["prompt_cache_key"] == keys[0]


def test_client_key_is_kept_not_replaced() -> None:
    case = json.loads((CASES / "k20-random-prompt-cache-key.json").read_text())
    pipe = SessionPipeline("openai")
    prep = pipe.prepare("openai.chat", case["requests"][0]["body"])
    assert prep.body["prompt_cache_key"] == case["requests"][0]["body"]["prompt_cache_key"]


def _body(n: int) -> dict[str, Any]:
    return {
        "model": "claude-opus-4-8",
        "max_tokens": 64,
        "system": [{"type": "text", "text": policy()}],
        "tools": anthropic_tools(),
        "messages": anthropic_messages(n),
    }


def test_baseline_strategy_positions() -> None:
    req = canonicalize("anthropic.messages", _body(4))
    paths = lambda r: [r.blocks[i].path for i, _ in r.markers()]  # noqa: E731
    assert paths(apply_strategy("no_markers", req)) == []
    auto = apply_strategy("anthropic_auto", req)
    assert paths(auto) == [] and auto.top_marker is not None
    assert paths(apply_strategy("langchain", req)) == ["tools[13]", "system[0]", "messages[3].content[0]"]
    assert paths(apply_strategy("litellm", req)) == ["system[0]", "messages[2].content[0]"]
    with pytest.raises(KeyError):
        apply_strategy("nope", req)


def test_volatile_move_is_opt_in_and_keeps_history_verbatim() -> None:
    case = json.loads((CASES / "k05-seconds-timestamp-in-system.json").read_text())
    bodies = [r["body"] for r in case["requests"]]
    off = SessionPipeline("anthropic")
    for b in bodies:
        prep = off.prepare("anthropic.messages", b, now=0.0)
        assert prep.body["system"][0]["text"] == b["system"][0]["text"]
        off.commit(prep)

    on = SessionPipeline("anthropic", settings=Settings(move_volatile=True))
    sent = []
    for b in bodies:
        prep = on.prepare("anthropic.messages", copy.deepcopy(b), now=0.0)
        on.commit(prep)
        sent.append(prep.body)
    # From the request where the clock line was seen changing, the system text is stable...
    assert "The current time is" not in sent[1]["system"][0]["text"]
    assert sent[1]["system"][0]["text"] == sent[2]["system"][0]["text"]
    # ...the line went to the newest user turn, and stays there verbatim afterwards.
    moved1 = sent[1]["messages"][-1]["content"][-1]["text"]
    assert moved1.startswith(MOVED_PREFIX) and "15:00:25" in moved1
    assert sent[2]["messages"][len(bodies[1]["messages"]) - 1]["content"][-1]["text"] == moved1
    assert "15:00:54" in sent[2]["messages"][-1]["content"][-1]["text"]


def test_settings_env_and_toml(tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> None:
    cfg = tmp_path / "agentcache.toml"
    cfg.write_text('[agentcache]\nmarkers = "own"\nttl_policy = "1h"\n')
    assert load_settings(cfg).markers == "own"
    monkeypatch.setenv("AGENTCACHE_MARKERS", "merge")
    s = load_settings(cfg)
    assert (s.markers, s.ttl_policy) == ("merge", "1h")  # environment beats the file
    with pytest.raises(ConfigError) as bad:  # the message names where the bad value came from
        load_settings(cfg, ttl_policy="2h")
    assert (
        str(bad.value) == "invalid setting ttl_policy='2h' (argument ttl_policy): Input should be 'auto', '5m' or '1h'"
    )
    cfg.write_text('[agentcache]\nttl_policy = "2h"\n')
    with pytest.raises(ConfigError) as bad:
        load_settings(cfg)
    assert (
        str(bad.value) == f"invalid setting ttl_policy='2h' (ttl_policy in {cfg}): Input should be 'auto', '5m' or '1h'"
    )
    cfg.write_text('[agentcache]\nmarkers = "own"\nttl_policy = "1h"\n')
    monkeypatch.setenv("AGENTCACHE_OPENAI_RPM_PER_KEY", "-1")
    with pytest.raises(
        ConfigError, match=r"^invalid setting openai_rpm_per_key='-1' \(AGENTCACHE_OPENAI_RPM_PER_KEY\)"
    ):
        load_settings()
    monkeypatch.delenv("AGENTCACHE_OPENAI_RPM_PER_KEY")
    cfg.write_text("not toml [")
    with pytest.raises(ConfigError):
        load_settings(cfg)


def test_pipeline_exposes_keep_warm_decisions() -> None:
    case = json.loads((CASES / "ttl-expired-after-7-minutes.json").read_text())
    auto, pinned = SessionPipeline("anthropic"), SessionPipeline("anthropic", settings=Settings(ttl_policy="5m"))
    own = SessionPipeline("anthropic")  # the same requests without the client's markers
    assert pinned.keep_warm() is None  # nothing sent yet
    for pipe in (auto, pinned, own):
        for r in case["requests"]:
            body = unmarked(r["body"]) if pipe is own else r["body"]
            prep = pipe.prepare("anthropic.messages", body, now=r["at"])
            pipe.commit(prep)
    # After a 420 s gap the TTL policy already moved agentcache's own markers to 1h: nothing to keep warm ...
    assert own.keep_warm() is not None and own.keep_warm().send is False  # type: ignore[union-attr]
    assert {m.ttl for _, m in own.sent.markers()} == {"1h"}  # type: ignore[union-attr]
    # ... but the client's own markers ask for 5m, kept by value (an own 1h marker may only precede them), so its
    # entries expire as before the policy.
    client = {p for p, _ in markers(case["requests"][-1]["body"]).items()}
    sent = auto.sent
    assert (
        sent is not None
        and {sent.blocks[i].path: m.ttl for i, m in sent.markers()}.items()
        >= {
            ("system[0]", "5m"),
            ("messages[4].content[0]", "5m"),
        }
        and len(client) == 2
    )
    assert auto.keep_warm() == pinned.keep_warm()
    pipe = pinned
    d = pipe.keep_warm()  # 5m entries, one 420 s gap seen: one refresh bridges it
    assert d is not None and d.send and d.count == 1 and d.first_at == 270.0
    body = pipe.keep_warm_body()
    assert body is not None and body["max_tokens"] == 0 and body["messages"] == pipe.sent_body["messages"]  # type: ignore[index]
    assert pipe.keep_warm(expected_gap=100.0).send is False  # type: ignore[union-attr]


def _reminder_session() -> list[dict[str, Any]]:
    """Each request ends with a system-reminder block appended to the last user message, which the
    client drops again on the next request (a block sent once, never resent)."""
    base = anthropic_messages(9)
    bodies = []
    for n in (3, 5, 7, 9):
        msgs = copy.deepcopy(base[:n])
        msgs[-1]["content"].append(
            {"type": "text", "text": f"<system-reminder>turn {n}: 12 todos open</system-reminder>"}
        )
        bodies.append({**_body(0), "messages": msgs})
    return bodies


def test_ephemeral_trailing_block_is_not_marked_once_learned() -> None:
    from agentcache import audit
    from agentcache.loaders import Record

    records = [Record("s", "anthropic.messages", b, float(i), None, "t", i) for i, b in enumerate(_reminder_session())]
    report = audit(records, "anthropic")
    turns = report.turns
    # From the second request on, the tail marker skips the reminder and goes on the block before it...
    assert turns[2].prepared.marker_reasons[-1] == "tail"
    assert not turns[2].markers[-1].endswith(".content[1]")
    # ...so the next request reads everything but the reminder, as ideal does.
    for t in turns[3:]:
        assert t.arms["agentcache"].cache_read_tokens == t.arms["ideal"].cache_read_tokens
    assert turns[3].arms["agentcache"].cache_read_tokens > turns[3].arms["as_sent"].cache_read_tokens


def test_openai_rpm_per_key_setting_reaches_the_key_planner() -> None:
    """``openai_rpm_per_key`` decides when sessions of one prefix family are spread over several keys."""
    from agentcache import Sessions

    def keys(rpm: float) -> set[str]:
        sessions = Sessions(settings=Settings(openai_rpm_per_key=rpm))
        out = set()
        for i in range(8):  # 8 sessions of one family within 8 seconds
            body = {"model": "gpt-4o", "messages": [{"role": "system", "content": "Be careful. " * 400},
                                                     {"role": "user", "content": f"task {i}"}]}  # fmt: skip
            turn = sessions.session(f"s{i}").begin("openai.chat", body, now=100.0 + i)
            assert turn.commit()
            out.add(turn.body["prompt_cache_key"])
        return out

    assert len(keys(15)) == 1  # 8 requests/min: one key carries them
    assert len(keys(2)) > 1  # above 2 requests/min the family is sharded


def test_no_write_bet_on_a_request_without_tools() -> None:
    """A request without tools is a person's turn (aider's --message chats): agentcache's own markers go no deeper
    than the client's deepest marker and the static prefix; an agent loop (tools) gets the tail as always, and so
    does a chat whose client marks nothing once its session has sent before."""
    from tests.client_shapes import aider_anthropic

    rules = anthropic_rules("claude-sonnet-4-20250514")
    chat = canonicalize("anthropic.messages", aider_anthropic("Say hello. " + policy()))
    deepest_client = max(i for i, _ in chat.markers())
    for prev in (None, chat):
        plan = plan_breakpoints(chat, prev, rules)
        assert max(plan.markers) == deepest_client and "tail" not in plan.reasons.values()
    tail = len(chat.blocks) - 1
    bare = with_markers(chat, {})  # the same chat, its client marking nothing
    assert "tail" not in plan_breakpoints(bare, None, rules).reasons.values()
    assert plan_breakpoints(bare, bare, rules).reasons[tail] == "tail"
    tooled_body = {**aider_anthropic("Say hello. " + policy()), "tools": anthropic_tools()}
    tooled = canonicalize("anthropic.messages", tooled_body)
    assert plan_breakpoints(tooled, None, rules).reasons[len(tooled.blocks) - 1] == "tail"
