"""The audit of agents' own logs on hand-built calls (issue 21 items 2 and 3): each loss against the session's cached
prefix, its inferred cause, its USD, and the ``agentcache`` arm's what-if (TTL policy, keep-warm) on the same pauses.
The real clients' logs are audited in the readers' own tests; here every number is derived from the prices in
``agentcache/data/models.toml`` (claude-opus-4-8: $5 input, 1.25× / 2× writes, 0.1× reads)."""

from __future__ import annotations

import pytest

from agentcache._audit_logs import audit_logs
from agentcache.analysis._inferred import MIN_LOSS, duration, infer_losses
from agentcache.loaders import UsageRecord
from agentcache.model._usage import normalize_usage

T0 = 1_790_000_000.0
MODEL = "claude-opus-4-8"
RATE = 5.0 / 1e6  # USD per base input token


def usage(read: int, w5: int = 0, w1: int = 0, uncached: int = 0) -> object:
    raw = {
        "input_tokens": uncached,
        "cache_read_input_tokens": read,
        "cache_creation_input_tokens": w5 + w1,
        "cache_creation": {"ephemeral_5m_input_tokens": w5, "ephemeral_1h_input_tokens": w1},
        "output_tokens": 10,
    }
    return normalize_usage(raw, "anthropic.messages")


def call(
    i: int,
    at: float,
    read: int,
    w5: int = 0,
    w1: int = 0,
    *,
    session: str = "s",
    model: str = MODEL,
    events: tuple[str, ...] = (),
    kind: str = "main",
    parent: str | None = None,
    uncached: int = 0,
) -> UsageRecord:
    u = usage(read, w5, w1, uncached)
    return UsageRecord(
        session,
        "claude-code",
        "anthropic.messages",
        u,
        model,
        T0 + at,
        f"{session}-{i}",
        parent,
        "/work",
        kind,
        events,  # type: ignore[arg-type]
    )


def test_healthy_session_loses_nothing() -> None:
    calls = [call(0, 0, 0, 20_000), call(1, 30, 20_000, 500), call(2, 60, 20_500, 800)]
    losses = infer_losses(calls)
    assert [(x.expected, x.lost, x.cause) for x in losses] == [(0, 0, None), (20_000, 0, None), (20_500, 0, None)]
    assert losses[0].start == "session"
    report = audit_logs(calls)
    assert report.misses == [] and report.causes == []
    rep, ours = report.totals["reported"], report.totals["agentcache"]
    assert rep.cost_usd == pytest.approx(ours.cost_usd)  # nothing to save: the what-if costs the same
    assert rep.cost_usd == pytest.approx(RATE * (1.25 * 21_300 + 0.1 * 40_500))


def test_each_cause_in_order() -> None:
    calls = [
        call(0, 0, 0, 20_000),
        call(1, 20, 0, 21_000, model="claude-sonnet-4-6"),  # model switch: the other model's cache is empty
        call(2, 40, 21_000, 200, model="claude-sonnet-4-6"),
        call(3, 60, 0, 5_000, model="claude-sonnet-4-6", events=("compacted",)),
        call(4, 60 + 400, 0, 5_300, model="claude-sonnet-4-6"),  # 6m 40s > 5m
        call(5, 480, 0, 5_600, model="claude-sonnet-4-6", events=("resumed",)),
        call(6, 500, 0, 5_900, model="claude-sonnet-4-6"),
    ]
    losses = infer_losses(calls)
    assert [x.cause for x in losses] == [
        None,
        "options.model",
        None,
        "messages.compacted",
        "ttl.expired",
        "session.resumed",
        "unexplained",
    ]
    assert losses[4].detail == "6m 40s pause > 5m TTL" and losses[4].lost == 5_000
    assert losses[6].where == "tools or system"
    assert all(x.inferred for x in losses)


def test_one_hour_writes_survive_a_ten_minute_pause_and_small_losses_are_not_misses() -> None:
    calls = [call(0, 0, 0, 0, 30_000), call(1, 600, 30_000, 0, 400), call(2, 4300, 0, 0, 30_600)]
    losses = infer_losses(calls)
    assert losses[1].cause is None and losses[1].ttl == 3600
    assert losses[2].cause == "ttl.expired" and losses[2].detail == "1h 01m pause > 1h TTL"
    small = [call(0, 0, 0, 20_000), call(1, 10, 20_000 - MIN_LOSS + 1, MIN_LOSS)]
    assert infer_losses(small)[1].cause is None and infer_losses(small)[1].lost == MIN_LOSS - 1


def test_reads_stopped_at_the_static_prefix() -> None:
    fresh = [call(0, 0, 8_000, 12_000, session="a")]  # a fresh session reads the tools + system others wrote
    later = [call(0, 100, 8_000, 14_000, session="b"), call(1, 130, 8_000, 15_000, session="b")]
    report = audit_logs(fresh + later)
    miss = next(m for m in report.misses if m.arm == "reported")
    assert (miss.session, miss.request, miss.cause, miss.where) == ("b", 1, "unexplained", "messages")
    assert miss.tokens_lost == 14_000 and "static prefix (8,000 tokens)" in (miss.detail or "")
    assert miss.usd_lost == pytest.approx(RATE * 14_000 * (1.25 - 0.1))


def test_whatif_ttl_policy_after_a_long_pause() -> None:
    """The first 10-minute pause is lost (no history yet); after it the TTL policy writes 1h, so the second long
    pause reads instead of rewriting. The what-if pays the 1h premium on the writes made after the choice."""
    calls = [
        call(0, 0, 0, 20_000),
        call(1, 30, 20_000, 2_000),
        call(2, 60, 22_000, 2_000),
        call(3, 660, 0, 26_000),
        call(4, 700, 26_000, 1_000),
        call(5, 1630, 0, 28_000),
        call(6, 1700, 28_000, 500),
    ]
    report = audit_logs(calls)
    reported = [m for m in report.misses if m.arm == "reported"]
    assert [(m.request, m.cause, m.tokens_lost) for m in reported] == [
        (3, "ttl.expired", 24_000),
        (5, "ttl.expired", 27_000),
    ]
    assert [m.request for m in report.misses if m.arm == "agentcache"] == [3]
    (row,) = report.causes
    assert row.saved_by.keys() == {"ttl"}
    # Net on the call saved: 27,000 tokens read instead of rewritten, less the 1h premium on its own 1,000 writes.
    assert row.saved_usd == pytest.approx(RATE * (27_000 * (1.25 - 0.1) - 1_000 * (2.0 - 1.25)))
    rep, ours = report.totals["reported"], report.totals["agentcache"]
    premium = RATE * (2.0 - 1.25) * (1_000 + 1_000 + 500)  # 1h from call 4 on (call 5 writes 1,000: it reads 27,000)
    assert rep.cost_usd - ours.cost_usd == pytest.approx(RATE * 27_000 * (1.25 - 0.1) - premium)


def test_whatif_keep_warm_bridges_a_pause_once_pauses_are_expected() -> None:
    """A client already on 1h entries: pauses past the hour expire them. After the first, keep-warm refreshes
    (reads of the prefix) keep the entry alive across the second; each refresh is paid in the agentcache arm."""
    calls = [
        call(0, 0, 0, 0, 20_000),
        call(1, 5_000, 0, 0, 20_500),
        call(2, 5_030, 20_500, 0, 300),
        call(3, 10_000, 0, 0, 21_000),
    ]
    report = audit_logs(calls)
    (row,) = report.causes
    assert row.misses == 2 and row.saved_by.keys() == {"keep_warm"}
    ours = report.totals["agentcache"]
    assert ours.requests == 4 + 1  # one refresh bridged the 4,970 s pause (3,570 s refresh interval)
    refresh = RATE * 0.1 * 20_800
    saved = RATE * 20_800 * (2.0 - 0.1)
    assert report.totals["reported"].cost_usd - ours.cost_usd == pytest.approx(saved - refresh)


def test_subagents_groups_and_json() -> None:
    parent = [call(0, 0, 0, 20_000, session="p"), call(1, 20, 20_000, 300, session="p")]
    sub = [call(0, 10, 0, 9_000, session="p/agent-1", kind="subagent", parent="p")]
    report = audit_logs(parent + sub)
    doc = report.to_dict()
    assert doc["mode"] == "reported"
    subagent = next(s for s in doc["sessions"] if s["session"] == "p/agent-1")
    assert subagent["parent"] == "p" and subagent["lineage"] == "p" and subagent["client"] == "claude-code"
    assert doc["spend"]["writes.subagent_start"] == pytest.approx(RATE * 1.25 * 9_000)
    assert doc["spend"]["writes.session_start"] == pytest.approx(RATE * 1.25 * 20_000)
    (day,) = doc["groups"]["day"]
    assert day["key"] == "2026-09-21" and day["sessions"] == 2 and day["arms"]["reported"]["requests"] == 3
    assert sum(doc["spend"].values()) == pytest.approx(doc["totals"]["reported"]["cost_usd"], abs=1e-6)


def test_a_compaction_run_is_its_compaction() -> None:
    calls = [call(0, 0, 0, 20_000), call(1, 20, 0, 0, uncached=21_000, kind="compaction")]
    assert infer_losses(calls)[1].cause == "messages.compacted"


def test_duration_words() -> None:
    assert [duration(s) for s in (42, 60, 432, 3600, 3780)] == ["42s", "1m", "7m 12s", "1h", "1h 03m"]


def test_whatif_that_costs_more_is_not_recommended() -> None:
    """The TTL policy bets on past pauses: after a 10-minute pause it writes 1h, and the next pause outlasts the
    hour, so the premium buys nothing. The audit says so ("not worth it", the session named), and with the levers
    costing more in all, its "What to do" does not recommend them."""
    import io

    from rich.console import Console

    from agentcache.analysis._render_logs import render_logs_report
    from agentcache.analysis._report_logs import FIXES, not_worth_it

    calls = [
        call(0, 0, 0, 20_000),
        call(1, 30, 20_000, 2_000),
        call(2, 60, 22_000, 2_000),
        call(3, 660, 0, 26_000),  # ttl.expired: the policy turns to 1h
        *(call(4 + i, 700 + 30 * i, 26_000 + 1_000 * i, 1_000) for i in range(5)),
        call(9, 10_000, 0, 31_000),  # past the hour: the 1h writes bought nothing
    ]
    report = audit_logs(calls)
    premium = RATE * (2.0 - 1.25) * 1_000 * 5
    assert report.totals["agentcache"].cost_usd - report.totals["reported"].cost_usd == pytest.approx(premium)
    worse = not_worth_it(report.sessions)
    assert worse is not None and worse.sessions == ["s"] and worse.everywhere
    assert worse.extra_usd == pytest.approx(premium)
    out = io.StringIO()
    render_logs_report(report, Console(file=out, width=400, color_system=None))
    text = out.getvalue()
    assert (
        f"Not worth it on these logs: agentcache's TTL policy and keep-warm would have cost {premium:.4f} USD" in text
    )
    assert FIXES["ttl.expired"] not in text
    assert "ttl.expired: not worth it on these logs (see above): keep the client's own TTL" in text
    from agentcache.analysis._html import render_html

    page = render_html(report)
    assert 'id="not-worth-it">Not worth it on these logs' in page and FIXES["ttl.expired"] not in page


def test_sample_names_the_sessions_where_the_whatif_costs_more() -> None:
    """``agentcache audit --sample``: 3 of its 34 sessions cost more under the policies (a 1h TTL chosen after a
    pause under the hour, then a pause past it); the audit names them and still recommends the levers, which save
    in all."""
    import io

    from rich.console import Console

    from agentcache._cli_audit import sample_path
    from agentcache._cli_errors import Errors
    from agentcache._cli_inputs import load_inputs
    from agentcache.analysis._render_logs import render_logs_report
    from agentcache.analysis._report_logs import FIXES, not_worth_it

    report = audit_logs(load_inputs([sample_path()], None, None, Errors()).usage_records)
    worse = not_worth_it(report.sessions)
    assert worse is not None and not worse.everywhere and worse.of == 34
    assert [s[:8] for s in worse.sessions] == ["77467e9f", "3eeb25b1", "9a2670aa"]
    for key in worse.sessions:
        (s,) = [s for s in report.sessions if s.session == key]
        assert s.arms["agentcache"].cost_usd > s.arms["reported"].cost_usd
    out = io.StringIO()
    render_logs_report(report, Console(file=out, width=400, color_system=None))
    assert (
        "Not worth it on 3 of 34 sessions: there agentcache's TTL policy and keep-warm would have cost"
        in out.getvalue()
    )
    assert FIXES["ttl.expired"] in out.getvalue()
