"""What a session remembers between turns: :class:`PipelineState` (immutable; the pipeline's ``commit``
installs the next one) and the client habits it learned (:class:`Learned`)."""

from __future__ import annotations

from collections.abc import Mapping
from dataclasses import dataclass, field
from typing import Any

from ..analysis._repair import Sent, ToolMemory
from ..policies.volatility import VolatileMemory

__all__ = ["Learned", "PipelineState"]


@dataclass(frozen=True, slots=True)
class Learned:
    """What the client's own history says about its next request: the message indices it rewrote
    (``edit_points``), the trailing blocks it sends once and drops (``ephemeral_tail``), and the message it is
    expected to rewrite next (``rewrite_at``, from the stride of its rewrites)."""

    edit_points: tuple[int, ...] = ()
    ephemeral_tail: int = 0
    rewrite_at: int | None = None


@dataclass(frozen=True, slots=True)
class PipelineState:
    """A session's memory between turns. ``sent``: what went out last (None before the first request);
    ``client_body``: the client's own last body when it differs from ``sent.body``; ``tools``: tool definitions
    by meaning and the order sent; ``routing_key``: the ``prompt_cache_key`` agentcache chose; ``times``: the
    last 32 request times (seconds), ``timed`` False once one came without a time; ``learned``: client habits;
    ``volatile``: system lines seen changing (setting ``move_volatile``); ``response_id``: the id of the response
    to the last sent request, once it arrived (setting ``provider_diagnostics`` compares the next request with
    it)."""

    sent: Sent | None = None
    client_body: Mapping[str, Any] | None = None
    tools: ToolMemory = field(default_factory=ToolMemory)
    routing_key: str | None = None
    times: tuple[float, ...] = ()
    timed: bool = True
    learned: Learned = field(default_factory=Learned)
    volatile: VolatileMemory = field(default_factory=VolatileMemory)
    response_id: str | None = None
