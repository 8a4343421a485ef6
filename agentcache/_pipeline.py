"""The per-session request pipeline shared by audit, the SDK wrappers and the proxy:
canonicalize → diagnose → repair → plan → apply.

:class:`SessionPipeline` holds one session's memory; :meth:`SessionPipeline.prepare` turns the
client's wire body into the body agentcache sends (repairs and planned breakpoints applied) and
reports what it found. :meth:`SessionPipeline.commit` records the prepared request as sent; callers
commit only once the request actually went out, so a request that failed before sending leaves
the session unchanged.
"""

from __future__ import annotations

from dataclasses import dataclass, field
from typing import Any

from ._canonical import CanonicalRequest, with_markers
from ._diagnose import Divergence, diagnose
from ._pricing import anthropic_rules
from ._repair import SessionMemory, plan_repairs
from .adapters import WirePlan, apply, canonicalize
from .policies import plan_breakpoints


@dataclass(slots=True)
class ScopeMemory:
    """State shared by the sessions of one cache scope: the first tool order and bytes seen for each
    tool-name set, so a new session of the same agent adopts them (cross-session reuse)."""

    tools: dict[frozenset[str], SessionMemory] = field(default_factory=dict)


@dataclass(frozen=True, slots=True)
class Prepared:
    """What :meth:`SessionPipeline.prepare` decided for one request.

    ``body``: the wire body to send (the client's own object when nothing changed). ``original``:
    the client's request, canonical. ``planned``: what is sent, canonical, markers included.
    ``divergence``: ``original`` against the client's previous request (None for the first).
    ``repairs``: causes repaired. ``markers``: block paths carrying a planned marker.
    """

    body: dict[str, Any]
    original: CanonicalRequest
    planned: CanonicalRequest
    divergence: Divergence | None
    repairs: tuple[str, ...]
    markers: tuple[str, ...]


def _tool_names(req: CanonicalRequest) -> frozenset[str]:
    return frozenset(b.name or "" for b in req.blocks if b.section == "tool")


class SessionPipeline:
    """One session's pipeline. ``provider`` decides the policies (``anthropic``: breakpoints are
    planned; ``openai``: caching is automatic, only repairs apply). ``model`` overrides the request's
    model for the provider rules. ``apply_markers``: write planned markers onto Anthropic wire bodies
    (audit only needs them on the canonical form)."""

    def __init__(
        self,
        provider: str,
        model: str | None = None,
        scope: ScopeMemory | None = None,
        apply_markers: bool = True,
    ):
        self.provider = provider
        self.model = model
        self.scope = scope if scope is not None else ScopeMemory()
        self.apply_markers = apply_markers
        self.memory = SessionMemory()
        self.last_original: CanonicalRequest | None = None

    def prepare(self, api: str, body: dict[str, Any], original: CanonicalRequest | None = None) -> Prepared:
        """Plan the request. Raises InputError for a malformed body (the caller fails open)."""
        orig = original if original is not None else canonicalize(api, body)
        div = diagnose(self.last_original, orig) if self.last_original is not None else None
        if self.memory.sent is None:
            first = self.scope.tools.get(_tool_names(orig))
            if first is not None and _tool_names(orig):
                self.memory.tool_order = list(first.tool_order)
                self.memory.tool_units = dict(first.tool_units)
        repair = plan_repairs(self.memory, orig, body)
        wire = apply(api, body, repair.plan) if not repair.plan.empty else body
        rep = canonicalize(api, wire) if wire is not body else orig
        planned = rep
        marks: tuple[str, ...] = ()
        if self.provider == "anthropic":
            bp = plan_breakpoints(rep, self.memory.sent, anthropic_rules(self.model or rep.model))
            planned = with_markers(rep, bp.markers, bp.top)
            marks = tuple(rep.blocks[i].path for i in bp.markers)
            if self.apply_markers and api == "anthropic.messages":
                ttl = {rep.blocks[i].path: m.ttl for i, m in bp.markers.items()}
                wire = apply(api, wire, WirePlan(markers=tuple(ttl.items()), top_marker=False))
                # A marker on a string turns it into a text block: re-read what is really sent.
                planned = canonicalize(api, wire)
        return Prepared(wire, orig, planned, div, repair.repaired, marks)

    def commit(self, prepared: Prepared, wire_without_markers: dict[str, Any] | None = None) -> None:
        """Record ``prepared`` as sent."""
        fresh = self.memory.sent is None
        self.memory.remember(prepared.planned, wire_without_markers or prepared.body)
        if fresh:
            self.scope.tools.setdefault(_tool_names(prepared.planned), self.memory)
        self.last_original = prepared.original
