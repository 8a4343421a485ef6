"""What the sessions of one cache scope share (:class:`ScopeMemory`): the tool sets seen first, and the OpenAI
routing-key planner."""

from __future__ import annotations

from collections import OrderedDict
from dataclasses import dataclass, field
from typing import TYPE_CHECKING

from ..analysis._repair import ToolMemory
from ..model._canonical import CanonicalRequest
from ..policies import KeyPlanner

if TYPE_CHECKING:
    from ._pipeline import Prepared

__all__ = ["SCOPE_BYTES", "TOOL_SET_BYTES", "TOOL_SET_BYTES_PER_BYTE", "ScopeMemory", "tool_names"]


#: Bytes of one cache scope's own objects (the ScopeMemory, its planner, their dicts), and of one remembered tool
#: set beyond its tools' canonical bytes (its entry, name set and ToolMemory); a remembered tool set holds
#: :data:`TOOL_SET_BYTES_PER_BYTE` bytes per byte of its tools' canonical data (the JSON units and the blocks):
#: measured with a ``sys.getsizeof`` walk (tests/test_memory_bounds.py measures them again), rounded up.
SCOPE_BYTES = 2000
TOOL_SET_BYTES = 1000
TOOL_SET_BYTES_PER_BYTE = 6


@dataclass(slots=True)
class ScopeMemory:
    """State shared by the sessions of one cache scope: the first tool memory seen for each tool-name set (so a
    new session of the same agent adopts its order and bytes; the ``max_tool_sets`` most recent sets), and the
    OpenAI key planner. ``tool_bytes``: the remembered tool sets' estimated bytes."""

    tools: OrderedDict[frozenset[str], ToolMemory] = field(default_factory=OrderedDict)
    max_tool_sets: int = 1024
    keys: KeyPlanner = field(default_factory=KeyPlanner)
    tool_bytes: int = 0

    def record(self, prepared: Prepared, fresh: bool, lineage: str = "") -> None:
        """Count ``prepared`` as sent by ``lineage``: its routing key's family, and its tools if it opened a
        session."""
        if prepared.plan.family is not None:
            self.keys.record(prepared.plan.family, prepared.at, lineage)
        names = tool_names(prepared.planned)
        if fresh and names and names not in self.tools:
            self.tools[names] = prepared.state.tools
            self.tool_bytes += _tool_set_bytes(prepared.state.tools)
            while len(self.tools) > self.max_tool_sets:
                self.forget_oldest()

    def estimated_bytes(self) -> int:
        """Estimated bytes this scope holds: its tool sets and its planner's families."""
        return SCOPE_BYTES + self.tool_bytes + self.keys.estimated_bytes()

    def forget_oldest(self) -> bool:
        """Forget the least recently remembered tool set, else the planner's least recently used family (a memory
        bound's eviction); False when nothing is left."""
        if self.tools:
            _, old = self.tools.popitem(last=False)
            self.tool_bytes -= _tool_set_bytes(old)
            return True
        return self.keys.forget_oldest()


def _tool_set_bytes(tools: ToolMemory) -> int:
    return TOOL_SET_BYTES + TOOL_SET_BYTES_PER_BYTE * sum(len(b.data) + len(b.env) for b in tools.blocks.values())


def tool_names(req: CanonicalRequest) -> frozenset[str]:
    """The names of ``req``'s tools."""
    head = req.blocks[: req.msg_start[0]] if req.messages else req.blocks
    return frozenset(b.name or "" for b in head if b.section == "tool")
