"""Safe repairs: re-send the bytes a session already sent when the new bytes mean the same.

Implements the repair rule of docs/design.md: the same tool set in another order, the same JSON value re-serialised
(tool schemas, tool-call arguments, message key order), a string vs a one-element text array, and a routing key
that changes per request are restored; anything that changes meaning is left exactly as the client sent it.
Repairs stop at the first message whose meaning differs: history after a real edit is never touched.

agentcache remembers the form it sent for every unit whose sent form differs from the client's (:class:`Sent`
``forms``: a repair, or its own reshaping of a string to carry a marker). A unit the client sends exactly as it
did last turn goes out exactly as it went out last turn, without comparing meanings again and without reporting
anything: the difference is agentcache's own, not a new client defect. So an append-only turn costs one chain
comparison plus one entry per remembered form. A unit whose client form carries a marker is re-sent in an
earlier form only when that form has the same blocks, so the client's markers keep their places.
"""

from __future__ import annotations

from collections.abc import Mapping
from dataclasses import dataclass, field
from typing import Any

from ..model._build import rebuild
from ..model._canonical import Block, CanonicalRequest, common_prefix, unmarked
from ..model._causes import (
    CACHE_KEY_CHANGED,
    MESSAGES_SERIALIZATION,
    MESSAGES_SHAPE,
    TOOLS_REORDERED,
    TOOLS_SERIALIZATION,
    Cause,
)
from ..model._equivalence import value_digest
from ..model._plan import KEEP, WirePlan

__all__ = ["RepairPlan", "Sent", "ToolMemory", "plan_repairs", "repaired_request"]


@dataclass(frozen=True, slots=True)
class ToolMemory:
    """The tool definitions a session (or, for its first request, its cache scope) has sent: ``units`` and
    ``blocks`` by meaning (value digest → the first-sent JSON unit and its block, unmarked), and ``order``, the
    tool names in the order last sent."""

    units: Mapping[bytes, Any] = field(default_factory=dict)
    blocks: Mapping[bytes, Block] = field(default_factory=dict)
    order: tuple[str, ...] = ()

    def after(self, sent: CanonicalRequest, before: CanonicalRequest | None) -> ToolMemory:
        """The memory once ``sent`` went out (``before``: the request sent previously). Copies only when the
        tools changed: first-sent bytes win, the order is the one just sent."""
        tools = [b for b in sent.head if b.section == "tool"]
        if before is not None and [b.digest for b in tools] == [b.digest for b in before.head if b.section == "tool"]:
            return self
        units, blocks = dict(self.units), dict(self.blocks)
        for b in tools:
            vd = value_digest(b, sent.api)
            if vd not in units:
                units[vd] = b.unit()
                blocks[vd] = b if b.marker is None else unmarked((b,))[0]
        return ToolMemory(units, blocks, tuple(b.name or "" for b in tools))


@dataclass(frozen=True, slots=True)
class Sent:
    """What a session sent last: ``request`` (canonical, markers included) and ``body`` (the wire body),
    ``client`` (the client's own request that turn, canonical), ``forms`` (message index → the blocks sent for
    it, unmarked, wherever they differ from the client's) and ``cache_key`` (the first routing key sent)."""

    request: CanonicalRequest
    body: Mapping[str, Any]
    client: CanonicalRequest | None = None
    forms: Mapping[int, tuple[Block, ...]] = field(default_factory=dict)
    cache_key: str | None = None


@dataclass(frozen=True, slots=True)
class RepairPlan:
    """The wire changes (``plan``) and the causes they repair (a subset of ``REPAIRABLE_BREAKS`` and
    ``cache_key.changed``; silent re-sends of agentcache's own forms are not listed). The canonical side of the
    same changes, for assembling the repaired request without reading the wire body again: ``tools`` (client
    tool index → the first-sent block of that tool), ``system`` (the system blocks sent last time) and
    ``messages`` (message index → the blocks sent last time), all unmarked."""

    plan: WirePlan = field(default_factory=WirePlan)
    repaired: tuple[Cause, ...] = ()
    tools: Mapping[int, Block] = field(default_factory=dict)
    system: tuple[Block, ...] | None = None
    messages: Mapping[int, tuple[Block, ...]] = field(default_factory=dict)


def plan_repairs(canon: CanonicalRequest, body: Mapping[str, Any], last: Sent | None, tools: ToolMemory) -> RepairPlan:
    """Repairs for ``body`` (canonical form ``canon``) against what the session sent ``last`` (None for its
    first request), with ``tools`` the tool definitions sent so far (the scope's for a first request)."""
    if last is not None and last.request.api != canon.api:
        last = None  # another wire format: nothing sent in this one to restore
    replace: dict[str, Any] = {}
    repaired: list[Cause] = []
    tool_blocks: dict[int, Block] = {}
    order = _repair_tools(canon, last, tools, replace, repaired, tool_blocks)
    system: tuple[Block, ...] | None = None
    messages: dict[int, tuple[Block, ...]] = {}
    if last is not None:
        system = _repair_system(canon, last, replace, repaired)
        _repair_messages(canon, last, replace, repaired, messages)
    key: Any = KEEP
    if (
        last is not None
        and last.cache_key is not None
        and canon.cache_key != last.cache_key
        and "prompt_cache_key" in body
    ):
        key = last.cache_key
        repaired.append(CACHE_KEY_CHANGED)
    plan = WirePlan(replace=replace, tool_order=order, cache_key=key)
    return RepairPlan(plan, tuple(dict.fromkeys(repaired)), tool_blocks, system, messages)


def _repair_tools(
    canon: CanonicalRequest,
    last: Sent | None,
    memory: ToolMemory,
    replace: dict[str, Any],
    repaired: list[Cause],
    out: dict[int, Block],
) -> tuple[int, ...] | None:
    tools = [b for b in canon.head if b.section == "tool"]
    if not tools:
        return None
    if last is not None and [b.digest for b in tools] == [b.digest for b in last.request.head if b.section == "tool"]:
        return None  # fast path: byte-identical tools
    for i, b in enumerate(tools):
        vd = value_digest(b, canon.api)
        old = memory.blocks.get(vd)
        if old is not None and old.digest != b.digest:
            replace[f"tools[{i}]"] = memory.units[vd]
            out[i] = old
            repaired.append(TOOLS_SERIALIZATION)
    rank = {name: r for r, name in enumerate(memory.order)}
    # Tools already sent keep their slots; new ones follow in the client's order.
    order = sorted(range(len(tools)), key=lambda i: (rank.get(tools[i].name or "", len(rank)), i))
    if order != list(range(len(tools))):
        repaired.append(TOOLS_REORDERED)
        return tuple(order)
    return None


def _system_blocks(req: CanonicalRequest) -> list[Block]:
    return [b for b in req.head if b.section == "system"]


def _repair_system(
    canon: CanonicalRequest, last: Sent, replace: dict[str, Any], repaired: list[Cause]
) -> tuple[Block, ...] | None:
    old, new = _system_blocks(last.request), _system_blocks(canon)
    if [b.digest for b in old] == [b.digest for b in new] or not old or not new:
        return None
    key = "instructions" if "instructions" in last.body else "system"
    if key not in last.body or (any(b.marker for b in new) and len(old) != len(new)):
        return None  # the client's own markers sit on a shape the old form does not have: keep the client's
    client = _system_blocks(last.client) if last.client is not None else None
    if client is not None and [b.digest for b in client] == [b.digest for b in new]:
        # The client's system is as it was last turn, so what went out for it then was equivalent (a repair
        # or agentcache's own reshaping): send it again, nothing new to report.
        replace[key] = last.body[key]
        return unmarked(tuple(old))
    if [value_digest(b, canon.api) for b in old] == [value_digest(b, canon.api) for b in new]:
        replace[key] = last.body[key]
        flip = old[0].path.endswith("]") != new[0].path.endswith("]")
        repaired.append(MESSAGES_SHAPE if flip else MESSAGES_SERIALIZATION)
        return unmarked(tuple(old))
    return None


def _first_client_change(canon: CanonicalRequest, client: CanonicalRequest | None) -> int:
    """The first message the client changed since its own last request (``canon.messages`` when it only
    appended): every message before it has the same blocks as last turn."""
    if client is None:
        return 0
    n = common_prefix(client, canon)
    if n < len(client.blocks):
        first = client.blocks[n].message
        m = first if first is not None else 0
    else:
        m = client.messages
        if m and canon.messages >= m and canon.message_span(m - 1) != client.message_span(m - 1):
            m -= 1  # the client's last message grew a block
    # The same blocks could be split into messages differently: messages must start where they started.
    k = 0
    limit = min(m, canon.messages)
    while k < limit and canon.msg_start[k] == client.msg_start[k]:
        k += 1
    return k


def _repair_messages(
    canon: CanonicalRequest,
    last: Sent,
    replace: dict[str, Any],
    repaired: list[Cause],
    out: dict[int, tuple[Block, ...]],
) -> None:
    field_name = "input" if "input" in last.body else "messages"
    old_msgs = last.body.get(field_name)
    if not isinstance(old_msgs, list):
        return
    first = _first_client_change(canon, last.client)
    for k, form in last.forms.items():
        if k < first and k < len(old_msgs):
            replace[f"{field_name}[{k}]"] = old_msgs[k]
            out[k] = form
    sent, client = last.request, last.client
    for k in range(first, min(sent.messages, canon.messages)):
        old = sent.blocks[slice(*sent.message_span(k))]
        new = canon.blocks[slice(*canon.message_span(k))]
        if [b.digest for b in old] == [b.digest for b in new]:
            continue
        if any(b.marker for b in new) and len(old) != len(new):
            return  # the client marks a shape the old form does not have: its markers win, the prefix breaks here
        prev = client.blocks[slice(*client.message_span(k))] if client is not None and k < client.messages else None
        if prev is not None and [b.digest for b in prev] == [b.digest for b in new]:
            # The client's message is as it was last turn, so what went out for it then was equivalent (a
            # repair, or agentcache's own reshaping of a string to carry a marker): send it again, silently.
            replace[f"{field_name}[{k}]"] = old_msgs[k]
            out[k] = unmarked(old)
            continue
        if [value_digest(b, canon.api) for b in old] != [value_digest(b, canon.api) for b in new]:
            return  # a real change: leave it and everything after it alone
        flip = any(b.path.endswith(".content") for b in old) != any(b.path.endswith(".content") for b in new)
        replace[f"{field_name}[{k}]"] = old_msgs[k]
        out[k] = unmarked(old)
        repaired.append(MESSAGES_SHAPE if flip else MESSAGES_SERIALIZATION)


def repaired_request(
    canon: CanonicalRequest, repair: RepairPlan, refs: tuple[CanonicalRequest, ...] = ()
) -> CanonicalRequest:
    """The canonical form of ``canon``'s body with ``repair`` applied, assembled from blocks (no wire body read):
    tools in the repaired order with their first-sent blocks, the system and the messages re-sent in their
    earlier forms. Markers are the client's own, on the units that carry them (an earlier form keeps the
    client's markers by position). ``refs``: requests whose chains to re-use (what the session sent)."""
    key = repair.plan.cache_key
    if not repair.tools and repair.system is None and not repair.messages and repair.plan.tool_order is None:
        return canon if key is KEEP else canon.evolve(cache_key=key)
    blocks = canon.blocks
    head_end = canon.msg_start[0] if canon.messages else len(blocks)
    head = list(blocks[:head_end])
    if repair.tools or repair.plan.tool_order is not None:
        lo = next(i for i, b in enumerate(head) if b.section == "tool")
        hi = lo
        while hi < len(head) and head[hi].section == "tool":
            hi += 1
        client = head[lo:hi]
        order = repair.plan.tool_order or tuple(range(len(client)))
        head[lo:hi] = [_as(repair.tools.get(i, client[i]), f"tools[{j}]", client[i]) for j, i in enumerate(order)]
    if repair.system is not None:
        lo = next(i for i, b in enumerate(head) if b.section == "system" and b.message is None)
        hi = lo
        while hi < len(head) and head[hi].section == "system" and head[hi].message is None:
            hi += 1
        head[lo:hi] = _marked_like(repair.system, head[lo:hi])
    if not repair.messages:  # only the head changed: the messages are the client's own blocks
        req = rebuild(canon, [*head, *blocks[head_end:]], refs, head=len(head))
        return req if key is KEEP else req.evolve(cache_key=key)
    out = head
    pos = head_end
    for k in sorted(repair.messages):
        lo, hi = canon.message_span(k)
        out += blocks[pos:lo]
        out += _marked_like(repair.messages[k], blocks[lo:hi])
        pos = hi
    out += blocks[pos:]
    req = rebuild(canon, out, refs)
    return req if key is KEEP else req.evolve(cache_key=key)


def _as(block: Block, path: str, client: Block) -> Block:
    """``block`` at ``path`` with ``client``'s marker (a tool keeps the client's marker where it moves)."""
    if block.path == path and block.marker == client.marker:
        return block
    return block.at(path, client.marker)


def _marked_like(form: tuple[Block, ...], client: tuple[Block, ...] | list[Block]) -> tuple[Block, ...]:
    """An earlier (unmarked) form of a unit, carrying the client's current markers position by position."""
    if all(b.marker is None for b in client) or len(form) != len(client):
        return form
    return tuple(f if c.marker is None else f.with_marker(c.marker) for f, c in zip(form, client, strict=True))
