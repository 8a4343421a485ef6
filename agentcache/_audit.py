"""``audit``: recorded traffic → what its prompt caching cost, what it could cost, and why each prefix broke.

The audit is a door like the others: every recorded request goes through the session core (one
:class:`~agentcache.Sessions` manager, one session per recorded session, the same repairs and policies the
wrappers and the proxy apply), and every committed turn into the per-arm :class:`~agentcache.analysis.Ledger`
the proxy's live report uses too. Records are replayed in time order (``at``; recorded order where absent), all
sessions through one shared simulated cache per arm (docs/design.md, "Cache scope"):

* ``as_sent``: the requests exactly as recorded;
* ``agentcache``: after safe repairs and policies (breakpoints on Anthropic, routing keys on OpenAI);
* ``ideal``: every token already sent earlier in the scope, after safe repairs, counts as reused;
* ``reported``: when the records carry the usage the provider reported (JSONL ``usage`` / ``response``, OpenHands'
  LiteLLM responses), that usage, priced by the provider that served it; beside it, per request, the
  ``as_sent`` arm's difference from it when that arm simulates the same provider (``simulator_error``);
* with ``compare``: one arm per baseline strategy, Anthropic marker strategies on Anthropic rules, OpenAI
  ``prompt_cache_key`` strategies on OpenAI rules (:mod:`agentcache.analysis._key_arms`).

Sessions stay open for the whole audit (no idle timeout): the audit reports what the traffic did.

The report names every model the requests used and whether the price table knows it (``models``), and, when
the recorded responses carry the provider's own cache diagnostics (Anthropic ``diagnostics``, OpenAI
``prompt_cache_diagnostics``), each provider-diagnosed miss beside agentcache's cause for the same recorded pair
of requests, with their agreement (``provider_diagnostics``).
"""

from __future__ import annotations

from collections.abc import Callable, Iterable
from typing import Any

from ._config import Settings
from ._exceptions import ConfigError, InputError
from ._log import get_logger
from .analysis._key_arms import key_strategies
from .analysis._ledger import Ledger
from .analysis._report import AuditReport, ModelRecord, ProviderMissRecord
from .loaders import Record
from .model._provider import compare, read_diagnosis
from .model._rules import anthropic_rules, default_model, lookup_model, normalize_model, openai_rules, unknown_model
from .model._types import Api, TargetKind
from .model._usage import CacheUsage, normalize_usage, served_by
from .policies import STRATEGIES
from .session import Identity, MemoryStore, Sessions
from .simulate import Concurrency
from .targets import Target, resolve_target

__all__ = ["audit"]

log = get_logger("agentcache.audit")


def audit(
    records: Iterable[Record],
    provider: str | None = None,
    model: str | None = None,
    progress: Callable[[int], None] | None = None,
    compare: bool = False,
    settings: Settings | None = None,
    ttft: float | None = None,
) -> AuditReport:
    """Audit ``records`` under ``provider``'s rules (``anthropic``, ``openai`` or ``engine``; when None, the
    provider whose usage the records carry (:func:`~agentcache.model._usage.served_by`: LiteLLM's Anthropic
    fields name Anthropic), else the first record's API).

    ``model`` prices every request as that model (default: each request's own model when the provider table
    knows it, else the provider's default). ``progress(n)`` is called after every request. ``compare`` adds one
    arm per baseline strategy: on Anthropic rules the marker strategies (``anthropic_auto``, ``langchain``,
    ``litellm``, ``no_markers``), on OpenAI rules the ``prompt_cache_key`` strategies (``no_key``,
    ``conversation_key``, ``random_key``, ``lineage_keys``, and ``breakpoints`` where a request's model takes
    them). Records carrying usage add the ``reported`` arm and ``report.simulator_errors``. ``ttft``: model
    concurrency (seconds from a request's start to its first byte, when an entry it writes becomes readable;
    Anthropic rules) and add the ``agentcache_coalesced`` arm (agentcache with its coalescer:
    :mod:`agentcache.session._coalesce`). A record whose body cannot be read is skipped and listed in
    ``report.errors`` (InputError naming its file and record). Raises ConfigError for an unknown provider or model,
    ``compare`` on an engine (it has no strategies to compare), or ``ttft`` off Anthropic rules.
    """
    recs = _time_order(list(records))
    usages = [_usage(r) for r in recs]
    setting = settings.target if settings is not None else None
    per_record = _targets(recs, usages, setting, model) if provider is None else None
    declared = provider or next((p for u in usages if u is not None and (p := served_by(u)) is not None), None)
    target = resolve_target(recs[0].api if recs else "openai.chat", setting=setting, declared=declared, model=model)
    name = target.name
    if per_record is not None and (compare or ttft is not None):
        raise ConfigError("--compare and --ttft need one provider's rules: these records mix APIs, pass --provider")
    if name != TargetKind.ENGINE:
        rules_for = anthropic_rules if name == TargetKind.ANTHROPIC else openai_rules
        if model is not None and not rules_for(model).known:
            raise unknown_model(str(name), model)
    strategies: tuple[str, ...] = ()
    if compare and name == TargetKind.ANTHROPIC:
        strategies = STRATEGIES
    elif compare and name == TargetKind.OPENAI:
        strategies = key_strategies({model or str(r.body.get("model") or "") for r in recs})
    elif compare:
        raise ConfigError("--compare compares provider strategies (Anthropic markers, OpenAI keys), not an engine's")
    # Each request is priced as its own model (unless ``model``); one the table does not know gets the provider
    # default's numbers (its name still decides capabilities such as OpenAI breakpoints).
    if ttft is not None and (name != TargetKind.ANTHROPIC or ttft < 0):
        raise ConfigError("--ttft models concurrency in Anthropic's cache: use --provider anthropic and seconds >= 0")
    sessions = Sessions(
        provider=target if per_record is None else None, settings=settings, idle_timeout=None, store=_unbounded()
    )
    conc = Concurrency(ttft, hold=settings.coalesce_timeout if settings else 3.0) if ttft is not None else None
    reported = any(u is not None for u in usages)
    rpm = settings.openai_rpm_per_key if settings is not None else 15.0
    ledger = Ledger(
        target,
        model=model,
        strategies=strategies,
        ideal=True,
        reported=reported,
        sim_errors=reported,
        rpm_per_key=rpm,
        overflow=bool(recs) and all(r.at is not None for r in recs),  # real times: OpenAI's overflow can be told
        keep_turns=True,
        concurrency=conc,
    )
    counts: dict[str, int] = {}
    errors: list[InputError] = []
    provider_misses: list[ProviderMissRecord] = []
    call_ids: dict[tuple[str, int], str] = {}
    for n, (rec, usage) in enumerate(zip(recs, usages, strict=True)):
        try:
            own = per_record[n] if per_record is not None else None
            identity = Identity(session=rec.session, parent=_parent(rec))
            turn = sessions.begin(rec.api, rec.body, identity=identity, now=0.0, at=rec.at, target=own)
            turn.commit()
            turn.finish(usage)
            i = counts.get(rec.session, 0)
            if rec.response is not None:
                _provider_miss(rec, i, turn.prepared.divergence, provider_misses)
            ledger.record(rec.session, i, turn.prepared, usage=usage, parent=_parent(rec), target=own)
            if isinstance(call := rec.meta.get("call_id"), str):
                call_ids[rec.session, i] = call
        except (InputError, ConfigError) as exc:  # one bad record never stops the audit
            errors.append(InputError(str(exc), source=rec.source or None, record=rec.index))
            continue
        except Exception as exc:  # nor does a bug of ours on one record: it is named, the others audited
            log.debug("audit.record_failed", source=rec.source, record=rec.index, exc_info=True)
            message = f"cannot audit ({type(exc).__name__}: {exc})"
            errors.append(InputError(message, source=rec.source or None, record=rec.index))
            continue
        counts[rec.session] = i + 1
        if progress is not None:
            progress(n + 1)
    ledger.finish()
    if per_record is not None:
        report = ledger.report("mixed", model or "mixed")
    else:
        report = ledger.report(name, _report_model(recs, name, model))
    report.errors = errors
    failed = {(e.source or "", e.record) for e in errors}
    kept = [n for n, r in enumerate(recs) if (r.source or "", r.index) not in failed]
    providers = [str(per_record[n].name) if per_record is not None else str(name) for n in kept]
    report.models = _models_seen([recs[n] for n in kept], providers, model)
    report.provider_misses = provider_misses
    report.call_ids = call_ids
    return report


def _targets(
    recs: list[Record], usages: list[CacheUsage | None], setting: Any, model: str | None
) -> list[Target] | None:
    """One target per record when the records are of more than one provider's API (a proxy recording of Claude
    Code and Codex): each under its own API's rules, as the proxy planned them; None when they share one."""
    kinds = {Api(r.api).provider for r in recs}
    if len(kinds) < 2:
        return None
    out = []
    for rec, usage in zip(recs, usages, strict=True):
        declared = served_by(usage) if usage is not None else None
        out.append(resolve_target(rec.api, setting=setting, declared=declared, model=model))
    return out


def _usage(rec: Record) -> CacheUsage | None:
    """The usage the record carries (its whole response, else its ``usage``), read by the one usage parser."""
    source = rec.response if rec.response is not None else rec.usage
    return normalize_usage(source, rec.api) if source is not None else None


def _provider_miss(rec: Record, index: int, divergence: Any, out: list[ProviderMissRecord]) -> None:
    """The recorded response's own cache diagnosis beside agentcache's cause for the same recorded pair (the
    client's request against its previous one), when either calls it a miss."""
    assert rec.response is not None
    diagnosis = read_diagnosis(rec.response, requested="diagnostics" in rec.body)
    if diagnosis is None:
        return
    ours = divergence.cause if divergence is not None else None
    if index == 0 and diagnosis.reason == "none":
        return  # the opt-in first request: nothing compared
    miss = compare(diagnosis, str(ours) if ours is not None else None)
    if ours is None and miss.reason in ("none", "cache_hit"):
        return  # both say the request extended the one before
    out.append(
        ProviderMissRecord(rec.session, index, miss.provider, miss.reason, miss.missed_tokens, miss.ours, miss.agrees)
    )


def _models_seen(recs: list[Record], providers: list[str], model: str | None) -> list[ModelRecord]:
    """Each model the records name (or ``model``, when every request is priced as it) under the provider whose
    rules priced it (``providers``: one per record), with whether that provider's price table knows it; none for an
    engine (no prices)."""
    counts: dict[tuple[str, str], int] = {}
    for r, provider in zip(recs, providers, strict=True):
        if provider == TargetKind.ENGINE:
            continue
        key = (provider, model or str(r.body.get("model") or ""))
        counts[key] = counts.get(key, 0) + 1
    out = []
    for (provider, name), n in sorted(counts.items()):
        priced_as, known = lookup_model(provider, name or None)
        out.append(ModelRecord(provider, name, known, priced_as, n))
    return out


def _unbounded() -> MemoryStore:
    """A store that never evicts: the audit keeps every recorded session."""
    return MemoryStore(max_open=1 << 40, max_tombstones=1 << 20, max_bytes=1 << 62)


def _report_model(recs: list[Record], provider: str, model: str | None) -> str:
    if model is not None:
        return model
    if provider == TargetKind.ENGINE:
        models = {str(r.body.get("model")) for r in recs}
        return models.pop() if len(models) == 1 else "mixed"
    rules_for = anthropic_rules if provider == TargetKind.ANTHROPIC else openai_rules
    known = {normalize_model(str(r.body.get("model") or "")) for r in recs}
    if not all(rules_for(m).known for m in known):
        return default_model(provider)
    models = {str(r.body.get("model")) for r in recs}
    return models.pop() if len(models) == 1 else "mixed"  # the report's models list names them


def _time_order(recs: list[Record]) -> list[Record]:
    """Stable sort by ``at``; a record without ``at`` keeps the time of the record before it."""
    keyed = []
    last = 0.0
    for i, r in enumerate(recs):
        last = r.at if r.at is not None else last
        keyed.append((last, i, r))
    keyed.sort(key=lambda t: (t[0], t[1]))
    return [r for _, _, r in keyed]


def _parent(rec: Record) -> str | None:
    """The recorded parent session of ``rec`` (``meta["parent"]``: a subagent's), or None."""
    parent = rec.meta.get("parent") if isinstance(rec.meta, dict) else None
    return parent if isinstance(parent, str) and parent else None
