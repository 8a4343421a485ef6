"""Safe repairs: re-send the bytes a session already sent when the new bytes mean the same.

Implements the repair rule of ``shared/design.md``: the same tool set in another order, the same
JSON value re-serialised (tool schemas, tool-call arguments, message key order), a string vs a
one-element text array, and a routing key that changes per request are restored; anything that
changes meaning is left exactly as the client sent it. Repairs stop at the first message whose
meaning differs: history after a real edit is never touched.
"""

from __future__ import annotations

from dataclasses import dataclass, field
from typing import Any

from ..model import _causes as C
from ..model._canonical import CanonicalRequest, common_prefix, dumps, value_digest
from ..model._plan import KEEP, WirePlan


@dataclass(slots=True)
class SessionMemory:
    """What agentcache has sent for one session: the last request (canonical and wire), every tool
    definition by meaning (first-sent bytes win), the tool order, and the first routing key."""

    sent: CanonicalRequest | None = None
    sent_body: dict[str, Any] | None = None
    tool_units: dict[bytes, Any] = field(default_factory=dict)
    tool_order: list[str] = field(default_factory=list)
    cache_key: str | None = None

    def remember(self, canon: CanonicalRequest, body: dict[str, Any]) -> None:
        """Record the request as sent (after repairs and markers)."""
        tools = [b for b in canon.blocks if b.section == "tool"]
        old = [b.digest for b in self.sent.blocks if b.section == "tool"] if self.sent else None
        if old != [b.digest for b in tools]:  # parse tool values only when the tools changed
            self.tool_order = [b.name or "" for b in tools]
            for b in tools:
                self.tool_units.setdefault(value_digest(b), b.unit())
        self.sent, self.sent_body = canon, body
        if self.cache_key is None and canon.cache_key:
            self.cache_key = canon.cache_key


@dataclass(frozen=True, slots=True)
class RepairPlan:
    """The wire changes and the causes they repair (a subset of ``REPAIRABLE_BREAKS`` and
    ``cache_key.changed``)."""

    plan: WirePlan
    repaired: tuple[str, ...]


def plan_repairs(
    memory: SessionMemory, canon: CanonicalRequest, body: dict[str, Any], client_prev: CanonicalRequest | None = None
) -> RepairPlan:
    """Repairs for ``body`` (canonical form ``canon``) against what the session sent before. ``client_prev``: the
    client's own previous request; a unit the client sent exactly as last time but that went out in another
    form (a string that agentcache turned into a text block to carry a marker) is restored silently: the
    difference is agentcache's, not a client defect to report."""
    replace: dict[str, Any] = {}
    repaired: list[str] = []
    order = _repair_tools(memory, canon, replace, repaired)
    if memory.sent is not None and memory.sent_body is not None:
        _repair_system(memory.sent, memory.sent_body, canon, replace, repaired, client_prev)
        _repair_messages(memory.sent, memory.sent_body, canon, replace, repaired, client_prev)
    key: Any = KEEP
    if memory.cache_key is not None and canon.cache_key != memory.cache_key and "prompt_cache_key" in body:
        key = memory.cache_key
        repaired.append(C.CACHE_KEY_CHANGED)
    return RepairPlan(WirePlan(replace=replace, tool_order=order, cache_key=key), tuple(dict.fromkeys(repaired)))


def _repair_tools(
    memory: SessionMemory, canon: CanonicalRequest, replace: dict[str, Any], repaired: list[str]
) -> tuple[int, ...] | None:
    tools = [b for b in canon.blocks if b.section == "tool"]
    if memory.sent is not None:
        sent_tools = [b.digest for b in memory.sent.blocks if b.section == "tool"]
        if [b.digest for b in tools] == sent_tools:
            return None  # fast path: byte-identical tools
    for i, b in enumerate(tools):
        old = memory.tool_units.get(value_digest(b))
        if old is not None and dumps(old) != b.data:
            replace[f"tools[{i}]"] = old
            repaired.append(C.TOOLS_SERIALIZATION)
    rank = {name: r for r, name in enumerate(memory.tool_order)}
    # Tools already sent keep their slots; new ones follow in the client's order.
    order = sorted(range(len(tools)), key=lambda i: (rank.get(tools[i].name or "", len(rank)), i))
    if order != list(range(len(tools))):
        repaired.append(C.TOOLS_REORDERED)
        return tuple(order)
    return None


def _repair_system(
    sent: CanonicalRequest,
    sent_body: dict[str, Any],
    canon: CanonicalRequest,
    replace: dict[str, Any],
    repaired: list[str],
    client_prev: CanonicalRequest | None = None,
) -> None:
    old = [b for b in sent.blocks if b.section == "system" and b.message is None]
    new = [b for b in canon.blocks if b.section == "system" and b.message is None]
    if [b.digest for b in old] == [b.digest for b in new] or not old or not new:
        return
    key = "instructions" if "instructions" in sent_body else "system"
    if client_prev is not None:
        prev = [b.digest for b in client_prev.blocks if b.section == "system" and b.message is None]
        if prev == [b.digest for b in new]:
            # The client's system is as it was last turn, so what went out for it then was equivalent (a repair
            # or agentcache's own reshaping): send it again, nothing new to report.
            replace[key] = sent_body[key]
            return
    if [value_digest(b) for b in old] == [value_digest(b) for b in new]:
        replace[key] = sent_body[key]
        repaired.append(
            C.MESSAGES_SHAPE if old[0].path.endswith("]") != new[0].path.endswith("]") else C.MESSAGES_SERIALIZATION
        )


def _repair_messages(
    sent: CanonicalRequest,
    sent_body: dict[str, Any],
    canon: CanonicalRequest,
    replace: dict[str, Any],
    repaired: list[str],
    client_prev: CanonicalRequest | None = None,
) -> None:
    field_name = "input" if "input" in sent_body else "messages"
    old_msgs = sent_body.get(field_name)
    n = common_prefix(sent, canon)
    if not isinstance(old_msgs, list) or n == len(sent.blocks):
        return  # append-only (the common case): nothing to repair, O(log n)
    first = sent.blocks[n].message
    if first is None:
        # The divergence is before the messages (tools, system, options): the chain cannot say where the
        # messages start to differ, so compare their block digests once, aligned at the first message.
        so = next((i for i, b in enumerate(sent.blocks) if b.message is not None), len(sent.blocks))
        co = next((i for i, b in enumerate(canon.blocks) if b.message is not None), len(canon.blocks))
        pairs = zip(sent.blocks[so:], canon.blocks[co:], strict=False)
        k = next((j for j, (a, b) in enumerate(pairs) if a.digest != b.digest), None)
        if k is None:
            k = len(canon.blocks) - co
            if so + k >= len(sent.blocks):
                return  # the messages only grew
        first = sent.blocks[so + k].message
        if first is None:
            first = 0
    old_spans, new_spans = sent.message_spans(), canon.message_spans()  # once: O(n), not per message
    prev_spans = client_prev.message_spans() if client_prev is not None else {}
    prev_blocks = client_prev.blocks if client_prev is not None else ()
    for k, (lo, hi) in sorted(old_spans.items()):
        if k < first:
            continue
        if k not in new_spans:
            return
        old, new = sent.blocks[lo:hi], canon.blocks[slice(*new_spans[k])]
        if [b.digest for b in old] == [b.digest for b in new]:
            continue
        if k in prev_spans and [b.digest for b in prev_blocks[slice(*prev_spans[k])]] == [b.digest for b in new]:
            # The client's message is as it was last turn, so what went out for it then was equivalent (a
            # repair, or agentcache's own reshaping of a string to carry a marker): send it again, silently.
            replace[f"{field_name}[{k}]"] = old_msgs[k]
            continue
        if [value_digest(b) for b in old] != [value_digest(b) for b in new]:
            return  # a real change: leave it and everything after it alone
        flip = any(b.path.endswith(".content") for b in old) != any(b.path.endswith(".content") for b in new)
        replace[f"{field_name}[{k}]"] = old_msgs[k]
        repaired.append(C.MESSAGES_SHAPE if flip else C.MESSAGES_SERIALIZATION)
