"""The unit every loader yields: one recorded request of one session."""

from __future__ import annotations

from dataclasses import dataclass, field
from typing import Any, Literal

Api = Literal["anthropic.messages", "openai.chat", "openai.responses"]
APIS: tuple[str, ...] = ("anthropic.messages", "openai.chat", "openai.responses")


@dataclass(frozen=True, slots=True)
class Record:
    """One recorded request.

    ``session``: session id, unique across all loaded files (loaders prefix it with the file stem).
    ``api``: the wire format of ``body``. ``body``: the request body exactly as sent (dict, key order
    preserved). ``at``: seconds since the first request of the file, or None when not recorded
    (records are then replayed in file order). ``usage``: the provider's recorded usage object for this
    request, as it appeared on the wire, or None. ``response``: the whole recorded response object (its ``id``,
    ``usage`` and the provider's cache diagnostics, when recorded), or None. ``source``/``index``: file path
    and 0-based record index within it, for error messages.
    """

    session: str
    api: str
    body: dict[str, Any]
    at: float | None = None
    usage: dict[str, Any] | None = None
    source: str = ""
    index: int = 0
    meta: dict[str, Any] = field(default_factory=dict)
    response: dict[str, Any] | None = None
