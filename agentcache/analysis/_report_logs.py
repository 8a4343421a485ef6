"""The parts of an audit report that only agents' own logs give (reported usage, no bodies): breakdown tables
(per day, project, model, client), the misses summed per cause with what agentcache would have saved on them, and
the logs that were read. JSON forms in docs/audit.md ("Audit JSON")."""

from __future__ import annotations

import re
from collections import Counter
from collections.abc import Sequence
from dataclasses import dataclass, field
from typing import Any

from ..loaders import UsageRecord
from ..model._types import Breakdown
from ._report import ArmMetrics, AuditReport, SessionReport

__all__ = [
    "BY",
    "FIXES",
    "SPEND",
    "SPEND_LABELS",
    "CauseRow",
    "GroupRow",
    "NotWorthIt",
    "SourceRow",
    "fixes_for",
    "not_worth_it",
    "write_caveat",
]

#: The breakdowns an audit of agents' logs can show (``--by``), in the order reports list them (``session`` is the
#: report's own session list; the others are its ``groups``).
BY: tuple[str, ...] = tuple(b.value for b in Breakdown)


#: What to do about each cause a log audit names (shown beside it; ``fix`` in the JSON).
FIXES: dict[str, str] = {
    "ttl.expired": "keep-warm across pauses (agentcache proxy with keep_warm = true), or a 1h TTL for long pauses",
    "messages.compacted": "each compaction writes a new prompt: compact less often, or before a pause, not after",
    "session.resumed": "a new process rebuilt its prompt (the agent re-reads its environment at start: a date, git "
    "status, tool descriptions); after a long pause the TTL also expired. Which bytes changed: a proxy recording "
    "or Claude Code 2.1.332's own request records name them",
    "options.model": "a cache is per model: switch models between tasks, not within one",
    "unexplained": "the log keeps no request bodies: run the agent through `agentcache proxy --record DIR` and "
    "audit DIR for the byte-level cause",
    "tools.reordered": "build the tool list in a fixed order (agentcache repairs it)",
    "tools.serialization": "serialise tool schemas once, or with sorted keys (agentcache repairs it)",
    "tools.changed": "keep tool definitions fixed within a session",
    "tools.added": "append new tools at the end of the list",
    "tools.removed": "keep the tool set for the session",
    "system.volatile": "move dates, ids and times out of the system prompt, to the newest user turn",
    "system.changed": "keep the system prompt fixed for the session",
    "messages.edited": "send history exactly as it was sent",
    "messages.serialization": "send back the bytes received (agentcache repairs it)",
    "messages.shape": "pick one content shape, string or block list (agentcache repairs it)",
    "messages.removed": "drop history in large steps, not a message per turn",
    "messages.inserted": "append, never insert",
    "messages.media_changed": "send media blocks exactly as before",
    "options.tool_choice": "keep tool_choice fixed within a session",
    "options.thinking": "keep thinking and reasoning options fixed within a session",
    "options.other": "keep cache-key options fixed within a session",
    "markers.missing": "place cache markers (agentcache does)",
    "markers.invalid": "at most 4 markers, 1h before 5m (agentcache repairs them)",
    "lookback.exceeded": "mark the entry the previous turn wrote (agentcache does)",
    "below_minimum": "nothing to do: a prefix this short is never cached",
    "cache_key.changed": "one prompt_cache_key per session lineage (agentcache sets one)",
    "write.in_flight": "hold a request until its sibling's first byte (agentcache coalesces)",
}

#: Why the ``agentcache`` arm can still lose reuse to a cause it addresses, where agentcache knows it.
_WHY_REMAINS: dict[str, str] = {
    "cache_key.changed": "the client sets its own prompt_cache_key, and agentcache keeps a client's key",
}
_CLAIM = re.compile(r" \(agentcache [^)]*\)$")


def fixes_for(report: AuditReport) -> dict[str, str]:
    """:data:`FIXES` for one simulated audit: a cause's "(agentcache does)" claim stays only where the
    ``agentcache`` arm achieved it in this traffic (no miss of that cause, no unrepaired break of it); otherwise
    it says what remains (requests, tokens lost, where) and why, when known."""
    left: dict[str, list[tuple[int, str | None, int]]] = {}
    for m in report.misses:
        if m.arm == "agentcache" and m.tokens_lost > 0:
            left.setdefault(m.cause, []).append((m.tokens_lost, m.where, m.request))
    for b in report.breaks:
        if not b.repaired:
            left.setdefault(b.cause, []).append((b.tokens_lost, b.first_divergent, b.request))
    out = dict(FIXES)
    for cause, items in left.items():
        claim = _CLAIM.search(FIXES.get(cause, ""))
        if claim is None:
            continue
        where = Counter(w for _, w, _ in items if w).most_common(1)
        at = f", at {where[0][0]}" if where else ""
        n, tokens = len(items), sum(t for t, _, _ in items)
        first = (", a" if n == 1 else ", each a") + " session's first" if all(r == 0 for _, _, r in items) else ""
        why = f"; because {_WHY_REMAINS[cause]}" if cause in _WHY_REMAINS else ""
        remains = f"{n:,} request{'s' if n != 1 else ''}{first}, {tokens:,} tokens{at}"
        out[cause] = FIXES[cause][: claim.start()] + f" (agentcache's requests still lose it here: {remains}{why})"
    return out


#: The parts of the input bill a log audit splits the reported spend into (``spend`` in the JSON, USD).
SPEND = (
    "reads",
    "writes.session_start",
    "writes.subagent_start",
    "writes.new_turns",
    "writes.rewrites",
    "uncached",
)

#: How reports name each part of :data:`SPEND`.
SPEND_LABELS: dict[str, str] = {
    "reads": "cache reads",
    "writes.session_start": "writes: session starts",
    "writes.subagent_start": "writes: subagent starts",
    "writes.new_turns": "writes: new turns",
    "writes.rewrites": "writes: rewrites after misses",
    "uncached": "uncached input",
}


@dataclass(slots=True)
class GroupRow:
    """One row of a breakdown: the calls whose ``by`` value (a UTC day ``2026-11-30``, a project, a model, a
    client) is ``key``: how many ``sessions`` they belong to, each arm's totals, and the USD the reported misses
    among them lost (``usd_lost``)."""

    by: str
    key: str
    sessions: int = 0
    arms: dict[str, ArmMetrics] = field(default_factory=dict)
    usd_lost: float = 0.0

    def to_dict(self) -> dict[str, Any]:
        """JSON object: ``key``, ``sessions``, ``usd_lost``, ``arms``."""
        return {
            "key": self.key,
            "sessions": self.sessions,
            "usd_lost": round(self.usd_lost, 6),
            "arms": {a: m.to_dict() for a, m in self.arms.items()},
        }


@dataclass(slots=True)
class CauseRow:
    """The reported misses of one ``cause``: how many (``misses``), the ``tokens_lost`` and ``usd_lost``, how many
    the provider itself named (``diagnosed``: the others are ``inferred``), and what the ``agentcache`` arm saved on
    those calls (``saved_usd``, and by lever: ``saved_by`` ``{"keep_warm": usd, "ttl": usd}``; negative when a
    policy cost more than it saved)."""

    cause: str
    misses: int = 0
    tokens_lost: int = 0
    usd_lost: float = 0.0
    diagnosed: int = 0
    saved_usd: float = 0.0
    saved_by: dict[str, float] = field(default_factory=dict)

    def to_dict(self) -> dict[str, Any]:
        """JSON object."""
        return {
            "cause": self.cause,
            "misses": self.misses,
            "inferred": self.misses - self.diagnosed,
            "tokens_lost": self.tokens_lost,
            "usd_lost": round(self.usd_lost, 6),
            "saved_usd": round(self.saved_usd, 6),
            "saved_by": {k: round(v, 6) for k, v in self.saved_by.items()},
            "fix": FIXES.get(self.cause),
        }


@dataclass(frozen=True, slots=True)
class SourceRow:
    """What was read of one agent's logs: the ``client``, the ``roots`` given or found, the ``files`` read, the
    ``calls`` they held (each once), the ``sessions``, the ``lines`` skipped as unreadable (``errors``) and the
    calls the agent makes but does not log (``leaves_out``, or None), and what its figures cannot show
    (``caveat``, e.g. :func:`write_caveat`, or None)."""

    client: str
    roots: tuple[str, ...]
    files: int
    calls: int
    sessions: int
    errors: int = 0
    leaves_out: str | None = None
    caveat: str | None = None

    def to_dict(self) -> dict[str, Any]:
        """JSON object."""
        return {
            "client": self.client,
            "roots": list(self.roots),
            "files": self.files,
            "calls": self.calls,
            "sessions": self.sessions,
            "errors": self.errors,
            "leaves_out": self.leaves_out,
            "caveat": self.caveat,
        }


def write_caveat(records: Sequence[UsageRecord]) -> str | None:
    """What ``records`` (one agent's calls) cannot show of the spend: the calls whose log kept no cache-write count
    (:attr:`~agentcache.loaders.UsageRecord.write_unknown`), their tokens not read counted as uncached, so their
    USD is a lower bound (an Anthropic write costs 1.25× input at the 5-minute TTL, 2× at 1 hour:
    docs.anthropic.com, "Prompt caching", pricing). None when every call's writes are known."""
    unknown = [u for u in records if u.write_unknown]
    if not unknown:
        return None
    tokens = sum(u.usage.uncached_tokens for u in unknown)
    return (
        f"{len(unknown):,} call{'s' * (len(unknown) != 1)} kept no cache-write count: their {tokens:,} tokens not "
        "read are counted as uncached, so their USD is a lower bound (a write costs 1.25× or 2× input)"
    )


#: The what-if levers of an audit of agents' logs: a cause they can save is worth recommending only where they pay.
WHAT_IF_CAUSES = frozenset({"ttl.expired"})


@dataclass(frozen=True, slots=True)
class NotWorthIt:
    """Sessions whose ``agentcache`` arm (the TTL policy and keep-warm, deciding on past pauses only) cost more
    than the client's reported usage: ``sessions`` (their keys, the costliest first), ``of`` (sessions audited),
    ``extra_usd`` (what the policies cost more there, USD) and ``net_usd`` (what they saved over every session:
    negative when they cost more in all)."""

    sessions: list[str]
    of: int
    extra_usd: float
    net_usd: float

    @property
    def everywhere(self) -> bool:
        """The policies cost more than they saved over the whole audit: recommend neither."""
        return self.net_usd <= 0

    def text(self) -> str:
        """One sentence for the report (terminal and HTML)."""
        why = "(a 1h TTL or refreshes bought for pauses that then outlasted them: the policies decide on past pauses"
        why += " only)"
        if self.everywhere:
            return (
                "Not worth it on these logs: agentcache's TTL policy and keep-warm would have cost "
                f"{-self.net_usd:.4f} USD more than the client alone in all ({len(self.sessions):,} of {self.of:,} "
                f"sessions cost more) {why}."
            )
        return (
            f"Not worth it on {len(self.sessions):,} of {self.of:,} sessions: there agentcache's TTL policy and "
            f"keep-warm would have cost {self.extra_usd:.4f} USD more than the client alone {why}."
        )

    def fix(self, cause: str) -> str | None:
        """What to do about ``cause`` instead of :data:`FIXES`' when the levers that save it do not pay in all."""
        if self.everywhere and cause in WHAT_IF_CAUSES:
            return "not worth it on these logs (see above): keep the client's own TTL"
        return None


def not_worth_it(sessions: list[SessionReport]) -> NotWorthIt | None:
    """Where the ``agentcache`` arm of an audit of agents' logs cost more than ``reported`` (None: nowhere)."""
    eps = 1e-9  # USD sums of the same calls: a rounding difference is no cost
    diff = {s.session: s.arms["agentcache"].cost_usd - s.arms["reported"].cost_usd for s in sessions}
    worse = sorted((k for k, d in diff.items() if d > eps), key=lambda k: -diff[k])
    if not worse:
        return None
    return NotWorthIt(worse, len(sessions), sum(diff[k] for k in worse), -sum(diff.values()))
