"""Names of the reasons reuse was lost: the one leaf module every layer imports.

Two kinds (see ``shared/design.md``, "Why reuse was lost"):

* a **break** is a prefix divergence: a request does not extend what its session (or, for the
  static prefix, another session in the same cache scope) sent before;
* a **miss** is a cache-mechanics loss on bytes that did match.

The strings are part of the public contract (JSON reports, logs, metrics): never rename them.
"""

from __future__ import annotations

from typing import Final, Literal

TOOLS_REORDERED: Final = "tools.reordered"
TOOLS_SERIALIZATION: Final = "tools.serialization"
TOOLS_CHANGED: Final = "tools.changed"
TOOLS_ADDED: Final = "tools.added"
TOOLS_REMOVED: Final = "tools.removed"
SYSTEM_VOLATILE: Final = "system.volatile"
SYSTEM_CHANGED: Final = "system.changed"
MESSAGES_EDITED: Final = "messages.edited"
MESSAGES_SERIALIZATION: Final = "messages.serialization"
MESSAGES_SHAPE: Final = "messages.shape"
MESSAGES_REMOVED: Final = "messages.removed"
MESSAGES_INSERTED: Final = "messages.inserted"
MESSAGES_COMPACTED: Final = "messages.compacted"
MESSAGES_MEDIA_CHANGED: Final = "messages.media_changed"
OPTIONS_MODEL: Final = "options.model"
OPTIONS_TOOL_CHOICE: Final = "options.tool_choice"
OPTIONS_THINKING: Final = "options.thinking"
OPTIONS_OTHER: Final = "options.other"

MARKERS_MISSING: Final = "markers.missing"
MARKERS_INVALID: Final = "markers.invalid"
LOOKBACK_EXCEEDED: Final = "lookback.exceeded"
TTL_EXPIRED: Final = "ttl.expired"
BELOW_MINIMUM: Final = "below_minimum"
CACHE_KEY_CHANGED: Final = "cache_key.changed"

BREAK_CAUSES: Final[tuple[str, ...]] = (
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
)
MISS_CAUSES: Final[tuple[str, ...]] = (
    MARKERS_MISSING,
    MARKERS_INVALID,
    LOOKBACK_EXCEEDED,
    TTL_EXPIRED,
    BELOW_MINIMUM,
    CACHE_KEY_CHANGED,
)

#: Breaks whose new bytes mean the same as the old ones: agentcache re-sends the old bytes.
REPAIRABLE_BREAKS: Final[frozenset[str]] = frozenset(
    {TOOLS_REORDERED, TOOLS_SERIALIZATION, MESSAGES_SERIALIZATION, MESSAGES_SHAPE}
)

Section = Literal["option", "tool", "system", "message"]
