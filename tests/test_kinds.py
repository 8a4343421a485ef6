"""A second, different input for every break and miss kind, written here (the shared cases are the
first). Bulk text is real tau-bench material; the edits are ours."""

from __future__ import annotations

import copy
import json
from typing import Any

import pytest

from agentcache import AuditReport, audit
from agentcache.loaders import Record

from .conftest import anthropic_messages, anthropic_tools, openai_tools, policy, real_turns


def _records(api: str, bodies: list[dict[str, Any]], at: list[float] | None = None, session: str = "s") -> list[Record]:
    return [Record(session, api, b, at[i] if at else None, source="test", index=i) for i, b in enumerate(bodies)]


def _anth(messages: list[dict[str, Any]], **extra: Any) -> dict[str, Any]:
    body: dict[str, Any] = {"model": "claude-opus-4-8", "max_tokens": 512}
    body["system"] = extra.pop("system", [{"type": "text", "text": policy()}])
    body["tools"] = extra.pop("tools", anthropic_tools())
    body.update(extra)
    body["messages"] = messages
    return body


def _oai(messages: list[dict[str, Any]], **extra: Any) -> dict[str, Any]:
    body: dict[str, Any] = {"model": "gpt-4o", "messages": messages, "tools": extra.pop("tools", openai_tools())}
    body.update(extra)
    return body


def _oai_msgs(n: int, run: int = 3) -> list[dict[str, Any]]:
    return [{"role": "system", "content": policy()}, *real_turns(run)[:n]]


def _break(report: AuditReport, request: int) -> tuple[str, str | None]:
    hits = [(b.cause, b.first_divergent) for b in report.breaks if b.request == request]
    assert len(hits) == 1, report.breaks
    return hits[0]


def _miss(report: AuditReport, request: int, arm: str = "as_sent") -> str:
    hits = [m.cause for m in report.misses if m.request == request and m.arm == arm]
    assert len(hits) == 1, report.misses
    return hits[0]


# ---- breaks ------------------------------------------------------------------------------------


def test_tools_reordered_openai_first_tool() -> None:
    tools = openai_tools()
    swapped = [tools[1], tools[0], *tools[2:]]
    r = audit(_records("openai.chat", [_oai(_oai_msgs(2)), _oai(_oai_msgs(4), tools=swapped)]))
    assert _break(r, 1) == ("tools.reordered", "tools[0]")
    assert r.breaks[0].repaired
    assert r.turns[1].arms["agentcache"].cache_read_tokens > r.turns[1].arms["as_sent"].cache_read_tokens


def test_tools_serialization_openai_parameters_key_order() -> None:
    tools = openai_tools()
    params = tools[5]["function"]["parameters"]
    tools[5]["function"]["parameters"] = dict(reversed(list(params.items())))
    r = audit(_records("openai.chat", [_oai(_oai_msgs(2)), _oai(_oai_msgs(4), tools=tools)]))
    assert _break(r, 1) == ("tools.serialization", "tools[5]")
    assert r.breaks[0].repaired


def test_tools_added_at_end_and_removed() -> None:
    tools = anthropic_tools()
    extra = {"name": "get_weather", "description": "Weather at an airport.", "input_schema": {"type": "object"}}
    bodies = [
        _anth(anthropic_messages(1), tools=tools[:13]),
        _anth(anthropic_messages(3), tools=[*tools[:13], extra]),
        _anth(anthropic_messages(5), tools=tools[:12]),
    ]
    r = audit(_records("anthropic.messages", bodies))
    assert _break(r, 1) == ("tools.added", "tools[13]")
    assert _break(r, 2) == ("tools.removed", "tools[12]")
    assert not any(b.repaired for b in r.breaks)


def test_tools_changed_description() -> None:
    tools = anthropic_tools()
    tools[2] = {**tools[2], "description": tools[2]["description"] + " Use sparingly."}
    r = audit(_records("anthropic.messages", [_anth(anthropic_messages(1)), _anth(anthropic_messages(3), tools=tools)]))
    assert _break(r, 1) == ("tools.changed", "tools[2]")
    assert r.turns[1].repairs == ()


def test_system_volatile_epoch_counter_in_string_system() -> None:
    sys0, sys1 = f"Request stamp 1732871000.\n{policy()}", f"Request stamp 1732871044.\n{policy()}"
    bodies = [_anth(anthropic_messages(1), system=sys0), _anth(anthropic_messages(3), system=sys1)]
    r = audit(_records("anthropic.messages", bodies))
    assert _break(r, 1) == ("system.volatile", "system")
    assert r.breaks[0].volatile is not None and r.breaks[0].volatile["text"] == "1732871044"


def test_system_changed_real_edit() -> None:
    edited = policy().replace("You should deny user requests", "You may grant user requests")
    assert edited != policy()
    bodies = [_anth(anthropic_messages(1)), _anth(anthropic_messages(3), system=[{"type": "text", "text": edited}])]
    r = audit(_records("anthropic.messages", bodies))
    assert _break(r, 1) == ("system.changed", "system[0]")


def test_messages_edited_tool_output_rewritten() -> None:
    m0 = _oai_msgs(10)
    m1 = copy.deepcopy(_oai_msgs(12))
    idx = next(i for i, m in enumerate(m0) if m["role"] == "tool")
    m1[idx]["content"] = "[output elided]"
    r = audit(_records("openai.chat", [_oai(m0), _oai(m1)]))
    assert _break(r, 1) == ("messages.edited", f"messages[{idx}].content")


def test_messages_serialization_tool_call_arguments_spacing() -> None:
    m0 = _oai_msgs(10)
    m1 = copy.deepcopy(_oai_msgs(12))
    idx, call = next((i, m["tool_calls"][0]) for i, m in enumerate(m1[: len(m0)]) if m.get("tool_calls"))
    call["function"]["arguments"] = json.dumps(json.loads(call["function"]["arguments"]), indent=1)
    r = audit(_records("openai.chat", [_oai(m0), _oai(m1)]))
    assert _break(r, 1) == ("messages.serialization", f"messages[{idx}].tool_calls[0]")
    assert r.breaks[0].repaired
    assert "messages.serialization" in r.turns[1].repairs


def test_messages_shape_array_to_string() -> None:
    m0 = anthropic_messages(3)
    m1 = copy.deepcopy(anthropic_messages(5))
    m1[2]["content"] = m1[2]["content"][0]["text"]
    r = audit(_records("anthropic.messages", [_anth(m0), _anth(m1)]))
    assert _break(r, 1) == ("messages.shape", "messages[2].content")
    assert r.breaks[0].repaired


def test_messages_removed_and_inserted() -> None:
    base = anthropic_messages(7)
    removed = base[:2] + base[4:]
    inserted = [*base[:3], {"role": "user", "content": [{"type": "text", "text": "note"}]}, *base[3:]]
    r1 = audit(_records("anthropic.messages", [_anth(base[:5]), _anth(removed)]))
    assert _break(r1, 1) == ("messages.removed", "messages[2].content[0]")
    r2 = audit(_records("anthropic.messages", [_anth(base[:5]), _anth(inserted)]))
    assert _break(r2, 1) == ("messages.inserted", "messages[3].content[0]")


def test_messages_compacted_openai_keeps_system() -> None:
    m0 = _oai_msgs(12)
    summary = {"role": "user", "content": "Summary of the conversation so far: the user wants to cancel."}
    m1 = [m0[0], summary, *m0[9:], {"role": "user", "content": "Go ahead."}]
    r = audit(_records("openai.chat", [_oai(m0), _oai(m1)]))
    assert _break(r, 1) == ("messages.compacted", "messages[1].content")


def test_messages_media_changed() -> None:
    def img(data: str) -> dict[str, Any]:
        return {"type": "image", "source": {"type": "base64", "media_type": "image/png", "data": data}}

    m0 = anthropic_messages(3)
    m0[0]["content"].append(img("iVBORw0KGgoAAAANSUhEUgAAAAEAAAAB"))
    m1 = copy.deepcopy(anthropic_messages(5))
    m1[0]["content"].append(img("iVBORw0KGgoAAAANSUhEUgAAAAIAAAAC"))
    r = audit(_records("anthropic.messages", [_anth(m0), _anth(m1)]))
    assert _break(r, 1) == ("messages.media_changed", "messages[0].content[1]")


@pytest.mark.parametrize(
    ("key", "v0", "v1", "cause"),
    [
        ("model", "claude-opus-4-8", "claude-opus-4-1", "options.model"),
        ("thinking", {"type": "enabled", "budget_tokens": 2048}, {"type": "disabled"}, "options.thinking"),
        ("tool_choice", {"type": "auto"}, {"type": "any"}, "options.tool_choice"),
    ],
)
def test_options_anthropic(key: str, v0: Any, v1: Any, cause: str) -> None:
    bodies = [_anth(anthropic_messages(1), **{key: v0}), _anth(anthropic_messages(3), **{key: v1})]
    r = audit(_records("anthropic.messages", bodies), "anthropic")
    assert _break(r, 1) == (cause, key)


def test_options_other_parallel_tool_calls() -> None:
    bodies = [_oai(_oai_msgs(2), parallel_tool_calls=True), _oai(_oai_msgs(4), parallel_tool_calls=False)]
    r = audit(_records("openai.chat", bodies))
    assert _break(r, 1) == ("options.other", "parallel_tool_calls")


def test_tool_choice_change_keeps_tools_and_system() -> None:
    bodies = [
        _anth(anthropic_messages(5), tool_choice={"type": "auto"}),
        _anth(anthropic_messages(5), tool_choice={"type": "any"}),
    ]
    r = audit(_records("anthropic.messages", bodies), "anthropic")
    t = r.turns[1].arms["agentcache"]
    # Tools + system (~3.2k tokens) are still read; the messages are written again.
    assert 3000 < t.cache_read_tokens < t.prompt_tokens - 200


# ---- misses ------------------------------------------------------------------------------------


def _marked(msgs: list[dict[str, Any]], ttl: str = "5m") -> list[dict[str, Any]]:
    msgs = copy.deepcopy(msgs)
    cc = {"type": "ephemeral"} if ttl == "5m" else {"type": "ephemeral", "ttl": ttl}
    msgs[-1]["content"][-1]["cache_control"] = cc
    return msgs


def test_markers_invalid_marker_on_empty_text_block() -> None:
    m1 = _marked(anthropic_messages(3))
    m1[1]["content"].append({"type": "text", "text": "", "cache_control": {"type": "ephemeral"}})
    r = audit(_records("anthropic.messages", [_anth(_marked(anthropic_messages(1))), _anth(m1)]))
    assert _miss(r, 1) == "markers.invalid"
    assert [m.rejected for m in r.misses if m.arm == "as_sent"] == [True]
    assert not [m for m in r.misses if m.arm == "agentcache"]


def test_markers_invalid_1h_after_5m() -> None:
    system = [{"type": "text", "text": policy(), "cache_control": {"type": "ephemeral"}}]
    r = audit(
        _records(
            "anthropic.messages",
            [
                _anth(_marked(anthropic_messages(1)), system=system),
                _anth(_marked(anthropic_messages(3), "1h"), system=system),
            ],
        )
    )
    assert _miss(r, 1) == "markers.invalid"


def test_markers_missing_system_only_marker() -> None:
    system = [{"type": "text", "text": policy(), "cache_control": {"type": "ephemeral"}}]
    bodies = [_anth(anthropic_messages(n), system=system) for n in (3, 5, 7)]
    r = audit(_records("anthropic.messages", bodies))
    assert _miss(r, 1) == "markers.missing"
    assert r.totals["agentcache"].cache_read_tokens == r.totals["ideal"].cache_read_tokens


def test_lookback_exceeded_thirty_block_fanout() -> None:
    m0 = _marked(anthropic_messages(3))
    m1 = copy.deepcopy(anthropic_messages(3))
    calls = [
        {
            "type": "tool_use",
            "id": f"toolu_{i:02d}",
            "name": "search_direct_flight",
            "input": {"date": f"2024-05-{i + 1:02d}"},
        }
        for i in range(15)
    ]
    results = [{"type": "tool_result", "tool_use_id": f"toolu_{i:02d}", "content": "[]"} for i in range(15)]
    m1 += [{"role": "assistant", "content": calls}, {"role": "user", "content": results}]
    r = audit(_records("anthropic.messages", [_anth(m0), _anth(_marked(m1))]))
    assert _miss(r, 1) == "lookback.exceeded"
    assert r.turns[1].arms["agentcache"].cache_read_tokens == r.turns[1].arms["ideal"].cache_read_tokens


def test_ttl_expired_1h_marker_after_two_hours() -> None:
    bodies = [_anth(_marked(anthropic_messages(1), "1h")), _anth(_marked(anthropic_messages(3), "1h"))]
    r = audit(_records("anthropic.messages", bodies, at=[0.0, 7200.0]))
    assert _miss(r, 1) == "ttl.expired"
    bodies_ok = [_anth(_marked(anthropic_messages(1), "1h")), _anth(_marked(anthropic_messages(3), "1h"))]
    r_ok = audit(_records("anthropic.messages", bodies_ok, at=[0.0, 1800.0]))
    assert [m for m in r_ok.misses if m.arm == "as_sent"] == []


def test_ttl_expired_openai_after_ten_minutes() -> None:
    r = audit(_records("openai.chat", [_oai(_oai_msgs(2)), _oai(_oai_msgs(4))], at=[0.0, 600.0]))
    assert _miss(r, 1) == "ttl.expired"


def test_below_minimum_short_prompt() -> None:
    bodies = [
        {
            "model": "claude-opus-4-8",
            "max_tokens": 64,
            "system": "Be brief.",
            "messages": _marked(anthropic_messages(n)),
        }
        for n in (1, 3)
    ]
    r = audit(_records("anthropic.messages", bodies))
    assert _miss(r, 1) == "below_minimum"
    assert r.totals["as_sent"].cache_read_tokens == 0


def test_cache_key_changed_once_mid_session() -> None:
    bodies = [
        _oai(_oai_msgs(2), prompt_cache_key="agent-1"),
        _oai(_oai_msgs(4), prompt_cache_key="agent-1"),
        _oai(_oai_msgs(6), prompt_cache_key="agent-1-retry"),
    ]
    r = audit(_records("openai.chat", bodies))
    assert _miss(r, 2) == "cache_key.changed"
    assert "cache_key.changed" in r.turns[2].repairs
    assert not [m for m in r.misses if m.arm == "agentcache"]
