"""A session's state as a JSON document and back: what the Redis store keeps after each commit, so another
replica continues the session exactly (:meth:`~agentcache.session.SessionPipeline.snapshot`,
:meth:`~agentcache.session.SessionPipeline.from_snapshot`). Canonical requests are not stored: they are derived
from the bodies again, so a snapshot is about the size of the last request's body (twice, when the client's body
differs from what was sent).
"""

from __future__ import annotations

from collections.abc import Mapping
from typing import TYPE_CHECKING, Any

from ..adapters import canonicalize, wire_for
from ..analysis._repair import Sent, ToolMemory
from ..model._canonical import unmarked
from ..model._equivalence import value_digest
from ..model._types import Api
from ..policies.volatility import VolatileMemory
from ..targets import Target
from ._state import Learned, PipelineState

if TYPE_CHECKING:
    from ._pipeline import SessionPipeline

__all__ = ["SNAPSHOT_VERSION", "restore", "snapshot"]


SNAPSHOT_VERSION = 1


def snapshot(st: PipelineState, target: Target) -> dict[str, Any]:
    """A session state as a JSON-ready document (:meth:`SessionPipeline.from_snapshot` rebuilds it): the target,
    the last sent body and the client's own (when it differs), the re-sent forms, tool memory, routing key, times,
    learned habits and volatile lines. Canonical requests are not stored: they are derived from the bodies."""
    doc: dict[str, Any] = {"v": SNAPSHOT_VERSION, "target": target.engine.value if target.engine else target.name}
    if st.sent is not None:
        doc.update(
            api=str(st.sent.request.api),
            sent=st.sent.body,
            client=st.client_body,
            forms=sorted(st.sent.forms),
            cache_key=st.sent.cache_key,
        )
    doc.update(
        tools=list(st.tools.units.values()),
        tool_order=list(st.tools.order),
        routing_key=st.routing_key,
        response_id=st.response_id,
        times=list(st.times),
        timed=st.timed,
        learned=[list(st.learned.edit_points), st.learned.ephemeral_tail, st.learned.rewrite_at],
        volatile=[
            sorted(st.volatile.patterns),
            [list(x) for x in st.volatile.last_lines],
            list(st.volatile.moved.items()),
        ],
    )
    return doc


def restore(pipe: SessionPipeline, doc: Mapping[str, Any]) -> None:
    """Install the state of a :func:`snapshot` document into a fresh ``pipe``. Raises KeyError/ValueError/InputError
    for a document that is not one (the caller then starts the session over)."""
    if doc.get("v") != SNAPSHOT_VERSION:
        raise ValueError(f"unknown snapshot version {doc.get('v')!r}")
    sent: Sent | None = None
    tools = ToolMemory()
    if doc.get("sent") is not None:
        api = Api(doc["api"])
        pipe.cache.begin()
        request = canonicalize(api, doc["sent"], cache=pipe.cache)
        client_body = doc.get("client")
        client = canonicalize(api, client_body, cache=pipe.cache) if client_body is not None else request
        forms = {
            int(k): unmarked(request.blocks[slice(*request.message_span(int(k)))])
            for k in doc.get("forms", ())
            if int(k) < request.messages
        }
        sent = Sent(request, doc["sent"], client, forms, doc.get("cache_key"))
        units = list(doc.get("tools") or ())
        if units:
            shell = {"model": request.model, "tools": units, wire_for(api).items_field: []}
            blocks = [b for b in canonicalize(api, shell).blocks if b.section == "tool"]
            tools = ToolMemory(
                {value_digest(b, api): u for b, u in zip(blocks, units, strict=True)},
                {value_digest(b, api): b for b in blocks},
                tuple(doc.get("tool_order") or ()),
            )
    edits, tail, rewrite = doc.get("learned") or ((), 0, None)
    patterns, lines, moved = doc.get("volatile") or ((), (), ())
    pipe.state = PipelineState(
        sent,
        doc.get("client") if sent is not None else None,
        tools,
        doc.get("routing_key"),
        tuple(float(t) for t in doc.get("times") or ()),
        bool(doc.get("timed", True)),
        Learned(tuple(int(e) for e in edits), int(tail), None if rewrite is None else int(rewrite)),
        VolatileMemory(frozenset(patterns), tuple(tuple(x) for x in lines), {int(k): str(v) for k, v in moved}),
        doc.get("response_id") if isinstance(doc.get("response_id"), str) else None,
    )
