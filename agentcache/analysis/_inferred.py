"""Causes inferred from reported usage alone: what each call of an agent's log lost, and why, without its body.

Agents' own logs (Claude Code transcripts, Codex rollouts, ...) keep each call's usage, time and model, not what
was sent (docs/design.md, "Users' own data"). A session's calls still tell a story: after a call, the prefix up to
its last breakpoint is cached (Anthropic: ``read + write`` tokens; OpenAI: the whole prompt, in 128-token steps
from 1,024). The next call should read that much of it (``expected``, capped at its own prompt); what it read
less is ``lost``, re-processed at the write or base price. A loss of at least :data:`MIN_LOSS` tokens is a miss,
and its cause is inferred from what the log does show, in this order:

1. the exact cause, when the request body is known (Claude Code 2.1.332 records its requests; its body dumps; a
   proxy recording): the byte-level break or miss the audit of those bodies found for the same call
   (:func:`exact_causes`), when it accounts for at least half the tokens lost and the log records no model switch
   or compaction at that call (what the user did names the cause, not inferred when the body confirms it; the
   body's first change is added to it); then
   the provider's own diagnosis,
   when the log kept it (Anthropic ``diagnostics.cache_miss_reason``, OpenAI ``prompt_cache_diagnostics``;
   :func:`~agentcache.model._provider.cause_of`): neither is inferred;
2. the call used another model than the one before (``options.model``: a cache is per model);
3. the log recorded a compaction since the last call, or the call is itself a compaction run, whose request is
   the conversation re-framed for summarising (``messages.compacted``);
4. the pause since the last call exceeded the TTL of the entry it needed (``ttl.expired``; the TTL is read from the
   usage: a call whose writes are all 1h leaves a 1h entry, any 5m write a 5m tail; OpenAI's in-memory retention);
5. a new process took the session over (``session.resumed``: ``--continue``, ``--resume``, a restart);
6. otherwise ``unexplained``, with where the reads stopped: no further than a fresh session of the same agent and
   model reads (the tools and system prompt: something in the messages changed), nothing at all, or part-way
   through the messages.

Each such cause is marked ``inferred``: it is what the usage and the log's events are consistent with, not a
comparison of bytes. The first call of a session loses nothing (nothing of its own was cached); it is marked as a
session start, or a subagent's.
"""

from __future__ import annotations

from collections.abc import Callable, Mapping, Sequence
from dataclasses import dataclass

from ..loaders import UsageRecord
from ..model._causes import (
    MESSAGES_COMPACTED,
    OPTIONS_MODEL,
    SESSION_RESUMED,
    TTL_EXPIRED,
    UNEXPLAINED,
)
from ..model._provider import cause_of
from ..model._rules import anthropic_rules, openai_rules
from ..model._usage import CacheUsage, served_by
from ..simulate import SimUsage
from ._report import AuditReport, MissRecord

__all__ = [
    "MIN_LOSS",
    "CallLoss",
    "ExactCauses",
    "cached_after",
    "duration",
    "entry_ttl",
    "exact_causes",
    "infer_losses",
    "provider_loss",
    "read_instead",
    "usd_beyond_reading",
]

#: Losses smaller than this many tokens are not misses (one OpenAI minimum prompt; the smallest Anthropic minimum
#: cacheable prefix): breakpoint positions and 128-token steps make such differences without any cause.
MIN_LOSS = 1024
_OPENAI_STEP = 128


@dataclass(frozen=True, slots=True)
class CallLoss:
    """What one call lost against the prefix its session had cached, in tokens, and why.

    ``expected``: the cached prefix the call could have read. ``lost``: ``expected`` − read (at least 0).
    ``cause``: the cause name when ``lost`` is a miss (at least :data:`MIN_LOSS`), else None. ``where``: what the
    reads reached, when known. ``detail``: the evidence in words (``"7m 12s pause > 5m TTL"``). ``gap``: seconds
    since the session's previous call (None: unknown). ``ttl``: the TTL of the entry the call needed (seconds).
    ``inferred``: False only when the provider named the cause. ``start``: ``"session"`` or ``"subagent"`` for a
    session's first call, else None."""

    expected: int = 0
    lost: int = 0
    cause: str | None = None
    where: str | None = None
    detail: str | None = None
    gap: float | None = None
    ttl: float | None = None
    inferred: bool = True
    start: str | None = None


def cached_after(usage: CacheUsage) -> int:
    """Tokens of the prompt cached once a call with ``usage`` is done: Anthropic's read + written prefix (up to
    the last breakpoint); OpenAI's whole prompt in 128-token steps when it is at least 1,024 tokens long
    (developers.openai.com/api/docs/guides/prompt-caching); an engine's read + processed prompt."""
    if served_by(usage) == "openai":
        return (usage.prompt_tokens // _OPENAI_STEP) * _OPENAI_STEP if usage.prompt_tokens >= MIN_LOSS else 0
    if served_by(usage) == "anthropic":
        return usage.cache_read_tokens + usage.cache_write_tokens
    return usage.prompt_tokens


def entry_ttl(usage: CacheUsage, model: str, before: float | None) -> float | None:
    """Seconds the entry a call leaves lives without use: Anthropic 1h when all its writes were 1h, 5m when any was
    5m, ``before`` (the entry it read, refreshed) when it wrote nothing; OpenAI's in-memory retention; None for a
    cache whose retention agentcache does not know."""
    provider = served_by(usage)
    if provider == "anthropic":
        rules = anthropic_rules(model)
        if usage.cache_write_tokens == 0:
            return before if before is not None else rules.ttl_5m_seconds
        five = usage.cache_write_tokens - usage.cache_write_1h_tokens
        return rules.ttl_5m_seconds if five > 0 else rules.ttl_1h_seconds
    if provider == "openai":
        return openai_rules(model).in_memory_ttl_seconds
    return None


#: A call's exact cause from its request body: ``call_id`` → ``(cause, where, tokens lost)``.
ExactCauses = Mapping[str, tuple[str, str | None, int]]


def exact_causes(simulated: AuditReport) -> dict[str, tuple[str, str | None, int]]:
    """Each call of an audit of request bodies (its ``call_ids``: requests rebuilt from an agent's log) that lost
    reuse: the break (its cause and first divergent unit) or the ``as_sent`` arm's miss (its cause and where) that
    lost the most tokens on it (a pause past the TTL can cost more than a late divergence the same call made)."""
    best: dict[str, tuple[int, str, str | None]] = {}

    def keep(call: str | None, tokens: int, cause: str, where: str | None) -> None:
        if call is not None and (call not in best or tokens > best[call][0]):
            best[call] = (tokens, cause, where)

    for m in simulated.misses:
        if m.arm == "as_sent":
            keep(simulated.call_ids.get((m.session, m.request)), m.tokens_lost, m.cause, m.where)
    for b in simulated.breaks:
        keep(simulated.call_ids.get((b.session, b.request)), b.tokens_lost, b.cause, b.first_divergent)
    return {call: (cause, where, tokens) for call, (tokens, cause, where) in best.items()}


def infer_losses(
    calls: Sequence[UsageRecord], static_read: int | None = None, exact: ExactCauses | None = None
) -> list[CallLoss]:
    """One :class:`CallLoss` per call of one session (``calls`` in time order). ``static_read``: the most a fresh
    session of the same agent and model reads (its tools and system prompt, written by earlier sessions), to
    tell reads that stopped there; None when unknown. ``exact``: the causes found in the calls' request bodies,
    where known (:func:`exact_causes`)."""
    out: list[CallLoss] = []
    prev: UsageRecord | None = None
    ttl: float | None = None
    for call in calls:
        if prev is None:
            start = "subagent" if call.kind == "subagent" else "session"
            out.append(CallLoss(start=start))
        else:
            out.append(_loss(prev, call, ttl, static_read, (exact or {}).get(call.call_id)))
        ttl = entry_ttl(call.usage, call.model, ttl)
        prev = call
    return out


def _loss(
    prev: UsageRecord,
    call: UsageRecord,
    ttl: float | None,
    static_read: int | None,
    exact: tuple[str, str | None, int] | None,
) -> CallLoss:
    usage = call.usage
    expected = min(cached_after(prev.usage), usage.prompt_tokens)
    if served_by(usage) == "openai":
        expected = (expected // _OPENAI_STEP) * _OPENAI_STEP if usage.prompt_tokens >= MIN_LOSS else 0
    lost = max(0, expected - usage.cache_read_tokens)
    gap = call.at - prev.at if call.at is not None and prev.at is not None else None
    base = CallLoss(expected=expected, lost=lost, gap=gap, ttl=ttl)
    if lost < MIN_LOSS:
        return base
    acted = call.model != prev.model or "compacted" in call.events or call.kind == "compaction"
    explains = exact is not None and exact[2] * 2 >= lost  # the body explains most of the loss
    if exact is not None and explains and not acted:
        return CallLoss(expected, lost, exact[0], exact[1], "the request body (byte-level)", gap, ttl, False)
    cause, where, detail, inferred = _why(prev, call, gap, ttl, static_read)
    if exact is not None and acted:  # what the user did names the cause; the body says what it changed first
        detail = f"{detail}; the request body first differs at {exact[1] or 'the start'} ({exact[0]})"
        inferred = inferred and not explains  # the bodies confirm what the log records
    return CallLoss(expected, lost, cause, where, detail, gap, ttl, inferred)


def _why(
    prev: UsageRecord, call: UsageRecord, gap: float | None, ttl: float | None, static_read: int | None
) -> tuple[str, str | None, str | None, bool]:
    """``(cause, where, detail, inferred)`` of a miss (see the module docstring for the order)."""
    read = call.usage.cache_read_tokens
    diagnosis = call.usage.diagnosis
    named = cause_of(diagnosis) if diagnosis is not None else None
    if named is not None and diagnosis is not None:
        return named, None, f"the provider's diagnosis: {diagnosis.reason}", False
    if call.model != prev.model:
        return OPTIONS_MODEL, "options", f"model {prev.model} → {call.model}", True
    if "compacted" in call.events:
        return MESSAGES_COMPACTED, "messages", "the log records a compaction before this call", True
    if call.kind == "compaction":
        return MESSAGES_COMPACTED, "messages", "a compaction run: the conversation re-sent to be summarised", True
    if gap is not None and ttl is not None and gap > ttl:
        return TTL_EXPIRED, None, f"{duration(gap)} pause > {duration(ttl)} TTL", True
    if "resumed" in call.events:
        after = f", {duration(gap)} after the last call" if gap is not None else ""
        return SESSION_RESUMED, None, f"the first call of a new process (continue, resume or restart){after}", True
    if read == 0:
        return UNEXPLAINED, "tools or system", "nothing was read: the start of the prompt changed, or evicted", True
    if static_read is not None and read <= static_read * 1.02:
        where = "messages"
        return UNEXPLAINED, where, f"reads stopped at the static prefix ({read:,} tokens): the messages changed", True
    return UNEXPLAINED, "messages", f"reads stopped at {read:,} of {call.usage.prompt_tokens:,} tokens", True


def provider_loss(
    session: str, request: int, readable: SimUsage, usage: CacheUsage, price: Callable[[CacheUsage], float | None]
) -> MissRecord | None:
    """The ``reported`` arm's miss on one request, or None: tokens the upstream did not read although the client's
    own requests could (``readable``: the ``as_sent`` arm's simulated usage, which already loses what the client's
    breaks, markers and pauses lose). Simulated counts are estimates, so the readable prefix is scaled to the
    upstream's token count; a shortfall of at least :data:`MIN_LOSS` is a miss. Its cause is the provider's own
    diagnosis when the response carried one, else ``unexplained`` (inferred: the upstream dropped or never kept an
    entry the traffic allowed), with where the reads stopped; ``usd_lost`` is what ``price`` (USD of a usage)
    charges beyond reading the lost tokens."""
    scale = usage.prompt_tokens / readable.prompt_tokens if readable.prompt_tokens else 0.0
    could = min(usage.prompt_tokens, round(readable.cache_read_tokens * scale))
    lost = could - usage.cache_read_tokens
    if lost < MIN_LOSS:
        return None
    usd = usd_beyond_reading(usage, lost, price) or 0.0
    diagnosis = usage.diagnosis
    named = cause_of(diagnosis) if diagnosis is not None else None
    if named is not None and diagnosis is not None:
        detail = f"the provider's diagnosis: {diagnosis.reason}"
        return MissRecord(session, request, "reported", named, lost, usd_lost=usd, detail=detail)
    read = usage.cache_read_tokens
    where = "tools or system" if read == 0 else "messages"
    detail = (
        f"reads stopped at {read:,} of {usage.prompt_tokens:,} tokens where the requests as sent could read "
        f"{could:,}: the upstream dropped the entry early (evicted, another replica or a shorter TTL)"
    )
    return MissRecord(session, request, "reported", UNEXPLAINED, lost, False, where, True, usd, detail)


def usd_beyond_reading(usage: CacheUsage, lost: int, price: Callable[[CacheUsage], float | None]) -> float | None:
    """What ``lost`` tokens of ``usage`` cost beyond reading them from the cache, USD (at least 0):
    ``price(usage)`` less ``price`` of the same usage with them read (:func:`read_instead`); None when ``price``
    knows no price."""
    paid, instead = price(usage), price(read_instead(usage, lost))
    return max(0.0, paid - instead) if paid is not None and instead is not None else None


def read_instead(usage: CacheUsage, lost: int) -> CacheUsage:
    """``usage`` with ``lost`` tokens read rather than written again. The lost tokens directly follow what was read,
    so they are the first written (1h spans come before 5m ones: Anthropic requires 1h breakpoints first), then
    the uncached remainder."""
    from_write = min(lost, usage.cache_write_tokens)
    from_uncached = min(lost - from_write, usage.uncached_tokens)
    w1h = max(0, usage.cache_write_1h_tokens - from_write)
    return CacheUsage(
        usage.prompt_tokens,
        usage.cache_read_tokens + from_write + from_uncached,
        usage.cache_write_tokens - from_write,
        usage.uncached_tokens - from_uncached,
        usage.source,
        w1h,
        usage.output_tokens,
    )


def duration(seconds: float) -> str:
    """``"7m 12s"``, ``"1h 03m"``, ``"42s"``: a pause as a person reads it."""
    s = round(seconds)
    if s < 60:
        return f"{s}s"
    if s < 3600:
        return f"{s // 60}m" + (f" {s % 60:02d}s" if s % 60 else "")
    return f"{s // 3600}h" + (f" {(s % 3600) // 60:02d}m" if s % 3600 >= 60 else "")
