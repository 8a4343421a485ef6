"""One prefix identity: the session index keys a request by the chain read off the same canonical request (the same
blocks, the same block digests) the turn report names, canonicalized once, before the lookup; and one equivalence
rule (the table's ``TextShape``) says which spellings of a message are one conversation item."""

from __future__ import annotations

import json
from typing import Any

import pytest

import agentcache.adapters as adapters_module
import agentcache.session._lookup as lookup_module
import agentcache.session._pipeline as pipeline_module
from agentcache.model._canonical import CanonicalRequest
from agentcache.model._fields import PrefixIdentity
from agentcache.model._usage import CacheUsage
from agentcache.session import Identity, Sessions
from agentcache.session._identity import checkpoints_from, checkpoints_of, index_entries

TOOLS = [
    {"name": "read", "description": "Read a file", "input_schema": {"type": "object"}},
    {"name": "grep", "description": "Search files", "input_schema": {"type": "object"}},
]


def _body(messages: list[dict[str, Any]], tools: list[dict[str, Any]] = TOOLS) -> dict[str, Any]:
    return {"model": "claude-sonnet-4-5", "max_tokens": 64, "system": "You are a coder. " * 40, "tools": tools,
            "messages": messages}  # fmt: skip


def _conversation(turns: int) -> list[dict[str, Any]]:
    out: list[dict[str, Any]] = []
    for k in range(turns):
        out.append({"role": "user", "content": f"question {k}: " + "details " * 60})
        out.append({"role": "assistant", "content": [{"type": "text", "text": f"answer {k}"}]})
    return out


def _usage() -> CacheUsage:
    return CacheUsage(
        prompt_tokens=10, cache_read_tokens=0, cache_write_tokens=10, uncached_tokens=0, source="anthropic"
    )


def test_the_index_keys_a_turn_on_the_chain_of_the_request_its_report_names(monkeypatch: pytest.MonkeyPatch) -> None:
    """Per turn: one canonicalization (before the lookup); the checkpoints committed to the index are read off the
    request the report's prefix identity names (its message blocks' digests, whatever spelling agentcache sent a
    message in); and the index holds that chain's head for the session."""
    built: list[CanonicalRequest] = []
    canonicalize = adapters_module.canonicalize

    def counting(api: str, body: dict[str, Any], *args: Any, **kwargs: Any) -> CanonicalRequest:
        built.append(canonicalize(api, body, *args, **kwargs))
        return built[-1]

    monkeypatch.setattr(lookup_module, "canonicalize", counting)
    monkeypatch.setattr(pipeline_module, "canonicalize", counting)
    sessions = Sessions(provider="anthropic")
    history = _conversation(6)
    sids = set()
    for n in range(2, 13, 2):
        built.clear()
        turn = sessions.begin("anthropic.messages", _body(history[: n - 1]), identity=Identity(infer=True))
        assert len(built) == 1 and turn.prepared.client is built[0]  # canonicalized once, before the lookup
        report = turn.succeed(_usage())
        assert report is not None
        planned = turn.prepared.planned
        assert report.prefix_identity == PrefixIdentity.of(planned)
        # The same blocks: the planned request differs from the client's by markers (not in a digest) and by the
        # strings a marker turned into one text part, which the one equivalence rule reads as the same message.
        assert checkpoints_from(planned) == checkpoints_from(turn.prepared.client) == turn.checkpoints
        store = sessions.store
        for h, head in index_entries(turn.checkpoints, store.min_inner_match):
            assert store._index[("anonymous", h)] == (turn.session.session_id, head)
        sids.add(turn.session.session_id)
    assert len(sids) == 1  # and each turn continued the first one's session


def test_a_reordered_tool_list_finds_its_session_and_is_diagnosed_as_a_break() -> None:
    """Tools, system and options stay out of the conversation chain (keyed lookups only prefer them)."""
    sessions = Sessions(provider="anthropic")
    history = _conversation(2)
    first = sessions.begin("anthropic.messages", _body(history[:1]), identity=Identity(infer=True))
    first.succeed(_usage())
    turn = sessions.begin("anthropic.messages", _body(history[:3], TOOLS[::-1]), identity=Identity(infer=True))
    assert turn.session is first.session
    assert turn.prepared.divergence is not None and turn.prepared.divergence.cause == "tools.reordered"


@pytest.mark.parametrize(
    ("api", "string", "part", "other"),
    [
        ("anthropic.messages", {"role": "user", "content": "hi"},
         {"role": "user", "content": [{"type": "text", "text": "hi", "cache_control": {"type": "ephemeral"}}]},
         {"role": "user", "content": [{"type": "input_text", "text": "hi"}]}),
        ("openai.chat", {"role": "user", "content": "hi"},
         {"role": "user", "content": [{"type": "text", "text": "hi", "prompt_cache_breakpoint": {"mode": "explicit"}}]},
         {"role": "user", "content": [{"type": "text", "text": "hi", "extra": 1}]}),
        ("openai.responses", {"role": "assistant", "content": "hi"},
         {"type": "message", "role": "assistant", "content": [{"type": "output_text", "text": "hi"}]},
         {"role": "assistant", "content": [{"type": "input_text", "text": "hi"}]}),
    ],
)  # fmt: skip
def test_one_rule_says_which_spellings_are_one_item(
    api: str, string: dict[str, Any], part: dict[str, Any], other: dict[str, Any]
) -> None:
    """The equivalence table's ``TextShape`` at that position (the repairs' rule): a string is the one text part of
    the type the API defines there, its marker aside; another part type or another key is another item."""
    field = "input" if api == "openai.responses" else "messages"
    opening = {"role": "user", "content": "start"}

    def chain(item: dict[str, Any]) -> tuple[bytes, ...]:
        return checkpoints_of(api, {"model": "m", field: [opening, item]}).chain

    assert chain(string) == chain(part)
    assert chain(other) != chain(string)
    assert chain(string)[0] == chain(other)[0]  # the chain names each message boundary


def test_interleaved_conversations_each_walk_only_their_new_messages(monkeypatch: pytest.MonkeyPatch) -> None:
    """Twelve conversations in flight at once (more than the process keeps recent walks for): each turn's
    checkpoints re-use the links of its own conversation's previous turn, found through the block cache the
    conversation's parsed messages carry, so a turn digests its two new messages only; each keeps its session."""
    import agentcache.session._identity as identity_module
    from agentcache.model._parsememo import ParseMemo

    walked: list[int] = []
    digests = identity_module._message_digests

    def counting(api: str, blocks: Any) -> tuple[bytes, bytes]:
        walked[-1] += 1
        return digests(api, blocks)

    monkeypatch.setattr(identity_module, "_message_digests", counting)
    sessions, memo = Sessions(provider="anthropic"), ParseMemo(smallest=0)
    # Each agent its own messages: a message another conversation also holds may carry that one's cache.
    histories = [[{**m, "content": f"agent {c}: {m['content']}"} for m in _conversation(8)] for c in range(12)]
    sids: dict[int, set[str]] = {c: set() for c in range(12)}
    for n in range(3, 16, 2):
        for c, history in enumerate(histories):
            body, raw = memo.loads(json.dumps(_body(history[:n])).encode(), "tenant")
            walked.append(0)
            turn = sessions.begin("anthropic.messages", body, identity=Identity(infer=True), raw=raw)
            turn.succeed(_usage())
            sids[c].add(turn.session.session_id)
            assert walked[-1] == (n if n == 3 else 2), (c, n)
    assert all(len(s) == 1 for s in sids.values()) and len(set().union(*sids.values())) == 12
