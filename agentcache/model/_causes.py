"""Names of the reasons reuse was lost: the one leaf module every layer imports.

Two kinds (see ``docs/design.md``, "Why reuse was lost"):

* a **break** is a prefix divergence: a request does not extend what its session (or, for the
  static prefix, another session in the same cache scope) sent before;
* a **miss** is a cache-mechanics loss on bytes that did match.

Two more names exist only for causes inferred from agents' own logs, which keep the usage of each call but not
what was sent (docs/design.md, "Users' own data"): ``session.resumed`` (a break at the first call of a new
process: ``--continue``, ``--resume`` or a restart rebuilt the prompt) and ``unexplained`` (reads fell and
nothing in the log says why: an honest "unknown" rather than a guess).

The strings are part of the public contract (JSON reports, logs, metrics): never rename them.
"""

from __future__ import annotations

from enum import StrEnum
from typing import Final, Literal


class Cause(StrEnum):
    """Why reuse was lost: a break (the prefix diverged) or a miss (cache mechanics on matching bytes)."""

    TOOLS_REORDERED = "tools.reordered"
    TOOLS_SERIALIZATION = "tools.serialization"
    TOOLS_CHANGED = "tools.changed"
    TOOLS_ADDED = "tools.added"
    TOOLS_REMOVED = "tools.removed"
    SYSTEM_VOLATILE = "system.volatile"
    SYSTEM_CHANGED = "system.changed"
    MESSAGES_EDITED = "messages.edited"
    MESSAGES_SERIALIZATION = "messages.serialization"
    MESSAGES_SHAPE = "messages.shape"
    MESSAGES_REMOVED = "messages.removed"
    MESSAGES_INSERTED = "messages.inserted"
    MESSAGES_COMPACTED = "messages.compacted"
    MESSAGES_MEDIA_CHANGED = "messages.media_changed"
    OPTIONS_MODEL = "options.model"
    OPTIONS_TOOL_CHOICE = "options.tool_choice"
    OPTIONS_THINKING = "options.thinking"
    OPTIONS_OTHER = "options.other"

    MARKERS_MISSING = "markers.missing"
    MARKERS_INVALID = "markers.invalid"
    LOOKBACK_EXCEEDED = "lookback.exceeded"
    TTL_EXPIRED = "ttl.expired"
    BELOW_MINIMUM = "below_minimum"
    CACHE_KEY_CHANGED = "cache_key.changed"
    WRITE_IN_FLIGHT = "write.in_flight"

    SESSION_RESUMED = "session.resumed"
    UNEXPLAINED = "unexplained"

    @property
    def is_break(self) -> bool:
        """True for a prefix divergence, False for a cache-mechanics miss."""
        return self in BREAK_CAUSES


TOOLS_REORDERED: Final = Cause.TOOLS_REORDERED
TOOLS_SERIALIZATION: Final = Cause.TOOLS_SERIALIZATION
TOOLS_CHANGED: Final = Cause.TOOLS_CHANGED
TOOLS_ADDED: Final = Cause.TOOLS_ADDED
TOOLS_REMOVED: Final = Cause.TOOLS_REMOVED
SYSTEM_VOLATILE: Final = Cause.SYSTEM_VOLATILE
SYSTEM_CHANGED: Final = Cause.SYSTEM_CHANGED
MESSAGES_EDITED: Final = Cause.MESSAGES_EDITED
MESSAGES_SERIALIZATION: Final = Cause.MESSAGES_SERIALIZATION
MESSAGES_SHAPE: Final = Cause.MESSAGES_SHAPE
MESSAGES_REMOVED: Final = Cause.MESSAGES_REMOVED
MESSAGES_INSERTED: Final = Cause.MESSAGES_INSERTED
MESSAGES_COMPACTED: Final = Cause.MESSAGES_COMPACTED
MESSAGES_MEDIA_CHANGED: Final = Cause.MESSAGES_MEDIA_CHANGED
OPTIONS_MODEL: Final = Cause.OPTIONS_MODEL
OPTIONS_TOOL_CHOICE: Final = Cause.OPTIONS_TOOL_CHOICE
OPTIONS_THINKING: Final = Cause.OPTIONS_THINKING
OPTIONS_OTHER: Final = Cause.OPTIONS_OTHER

MARKERS_MISSING: Final = Cause.MARKERS_MISSING
MARKERS_INVALID: Final = Cause.MARKERS_INVALID
LOOKBACK_EXCEEDED: Final = Cause.LOOKBACK_EXCEEDED
TTL_EXPIRED: Final = Cause.TTL_EXPIRED
BELOW_MINIMUM: Final = Cause.BELOW_MINIMUM
CACHE_KEY_CHANGED: Final = Cause.CACHE_KEY_CHANGED
WRITE_IN_FLIGHT: Final = Cause.WRITE_IN_FLIGHT
SESSION_RESUMED: Final = Cause.SESSION_RESUMED
UNEXPLAINED: Final = Cause.UNEXPLAINED

BREAK_CAUSES: Final[tuple[Cause, ...]] = (
    TOOLS_REORDERED,
    TOOLS_SERIALIZATION,
    TOOLS_CHANGED,
    TOOLS_ADDED,
    TOOLS_REMOVED,
    SYSTEM_VOLATILE,
    SYSTEM_CHANGED,
    MESSAGES_EDITED,
    MESSAGES_SERIALIZATION,
    MESSAGES_SHAPE,
    MESSAGES_REMOVED,
    MESSAGES_INSERTED,
    MESSAGES_COMPACTED,
    MESSAGES_MEDIA_CHANGED,
    OPTIONS_MODEL,
    OPTIONS_TOOL_CHOICE,
    OPTIONS_THINKING,
    OPTIONS_OTHER,
    SESSION_RESUMED,
)
MISS_CAUSES: Final[tuple[Cause, ...]] = (
    MARKERS_MISSING,
    MARKERS_INVALID,
    LOOKBACK_EXCEEDED,
    TTL_EXPIRED,
    BELOW_MINIMUM,
    CACHE_KEY_CHANGED,
    WRITE_IN_FLIGHT,
)
#: Causes only an inference from agents' logs names (no request body to compare).
INFERRED_CAUSES: Final[tuple[Cause, ...]] = (SESSION_RESUMED, UNEXPLAINED)

#: Breaks whose new bytes mean the same as the old ones: agentcache re-sends the old bytes.
REPAIRABLE_BREAKS: Final[frozenset[Cause]] = frozenset(
    {TOOLS_REORDERED, TOOLS_SERIALIZATION, MESSAGES_SERIALIZATION, MESSAGES_SHAPE}
)

Section = Literal["option", "tool", "system", "message"]
