"""What the provider itself says about a cache miss, and how it compares with agentcache's own cause.

Two providers compare a request with an earlier response of the same client and name the first divergence:

* Anthropic cache diagnostics (platform.claude.com/docs/en/build-with-claude/cache-diagnostics; anthropic SDK
  2.15.0 ``types/diagnostics.py``, ``types/cache_miss_*.py``): the request carries
  ``diagnostics: {"previous_message_id": "msg_..." | null}`` (null on the first turn opts in) and, while the
  feature is in beta, the ``anthropic-beta: cache-diagnosis-2026-04-07`` header. The response carries
  ``diagnostics: {"cache_miss_reason": {"type", "cache_missed_input_tokens"}}``; ``diagnostics`` is null when no
  divergence was found, ``cache_miss_reason`` null while the comparison is still pending. Types:
  ``model_changed``, ``system_changed``, ``tools_changed``, ``messages_changed`` (with
  ``cache_missed_input_tokens``), ``previous_message_not_found`` (no stored record of that id; the request need
  not have changed) and ``unavailable`` (no diagnosis, also when only ``thinking`` / ``tool_choice`` differ).
* OpenAI prompt cache diagnostics (developers.openai.com/api/docs/guides/prompt-caching/diagnostics; openai SDK
  3.57.0 ``types/responses/response.py``, Responses API, gpt-5.6 and later): the request carries
  ``prompt_cache_options.comparison_response_id``; the response ``prompt_cache_diagnostics``: ``{"type":
  "cache_miss", "reason", "cache_missed_tokens"}`` with ``reason`` one of ``model_changed``,
  ``prompt_cache_key_changed``, ``tools_changed``, ``text_format_changed``, ``reasoning_effort_changed``,
  ``verbosity_changed``, ``context_compacted``, ``input_changed``, ``service_tier_changed``; or ``{"type":
  "cache_hit"}``, ``{"type": "comparison_response_not_found"}``, ``{"type": "unavailable"}``.

:func:`read_diagnosis` reads either into one :class:`ProviderDiagnosis` (``reason`` is the provider's own word;
``none`` when Anthropic found no divergence, ``pending`` while it is still comparing). :func:`expected_reasons`
maps agentcache's cause names (docs/design.md, "Why reuse was lost") onto the provider's categories, and
:class:`ProviderMiss` records both side by side with whether they agree.
"""

from __future__ import annotations

from collections.abc import Mapping
from dataclasses import dataclass
from typing import Any

__all__ = [
    "ANTHROPIC_BETA",
    "ANTHROPIC_REASONS",
    "OPENAI_REASONS",
    "ProviderDiagnosis",
    "ProviderMiss",
    "cause_of",
    "compare",
    "expected_reasons",
    "read_diagnosis",
    "reason_label",
]

#: The beta header value of Anthropic cache diagnostics.
ANTHROPIC_BETA = "cache-diagnosis-2026-04-07"

#: Anthropic ``cache_miss_reason.type`` values, plus ``none`` (no divergence) and ``pending``.
ANTHROPIC_REASONS = frozenset(
    {
        "model_changed",
        "system_changed",
        "tools_changed",
        "messages_changed",
        "previous_message_not_found",
        "unavailable",
        "none",
        "pending",
    }
)
#: OpenAI ``prompt_cache_diagnostics`` reasons and types.
OPENAI_REASONS = frozenset(
    {
        "model_changed",
        "prompt_cache_key_changed",
        "tools_changed",
        "text_format_changed",
        "reasoning_effort_changed",
        "verbosity_changed",
        "context_compacted",
        "input_changed",
        "service_tier_changed",
        "cache_hit",
        "comparison_response_not_found",
        "unavailable",
    }
)
#: Answers that say nothing about this request's prefix (the comparison could not be made).
UNINFORMATIVE = frozenset({"pending", "unavailable", "previous_message_not_found", "comparison_response_not_found"})


@dataclass(frozen=True, slots=True)
class ProviderDiagnosis:
    """The provider's answer for one response. ``provider``: ``anthropic`` or ``openai``. ``reason``: its reason
    or type (see the module docstring). ``missed_tokens``: its estimate of the input tokens after the divergence
    (``cache_missed_input_tokens`` / ``cache_missed_tokens``), None when not given."""

    provider: str
    reason: str
    missed_tokens: int | None = None


@dataclass(frozen=True, slots=True)
class ProviderMiss:
    """One turn's two diagnoses side by side. ``ours``: agentcache's cause for what was sent against what the
    session sent before (the pair the provider compares), None when the request extended it. ``agrees``: the
    provider's ``reason`` is one :func:`expected_reasons` gives for ``ours``; None when the provider could not
    compare (``pending``, ``unavailable``, a baseline it no longer has) and ``ours`` does not predict that."""

    provider: str
    reason: str
    missed_tokens: int | None
    ours: str | None
    agrees: bool | None


def _int(value: Any) -> int | None:
    return value if isinstance(value, int) and not isinstance(value, bool) and value >= 0 else None


def read_diagnosis(body: Mapping[str, Any], requested: bool = False) -> ProviderDiagnosis | None:
    """The diagnosis in response ``body`` (a Messages or Responses object, or an Anthropic ``message_start``'s
    ``message``), or None when it carries none. ``requested``: the request asked for diagnostics, so an Anthropic
    response without them means no divergence (``none``). Never raises."""
    if "prompt_cache_diagnostics" in body:
        d = body.get("prompt_cache_diagnostics")
        if not isinstance(d, Mapping) or not isinstance(d.get("type"), str):
            return None
        kind = str(d["type"])
        reason = str(d.get("reason") or "unavailable") if kind == "cache_miss" else kind
        return ProviderDiagnosis("openai", reason, _int(d.get("cache_missed_tokens")))
    d = body.get("diagnostics")
    if isinstance(d, Mapping):
        miss = d.get("cache_miss_reason")
        if miss is None:
            return ProviderDiagnosis("anthropic", "pending")
        if isinstance(miss, Mapping) and isinstance(miss.get("type"), str):
            return ProviderDiagnosis("anthropic", str(miss["type"]), _int(miss.get("cache_missed_input_tokens")))
        return None
    if requested and "diagnostics" in body:  # null: asked, and no divergence found
        return ProviderDiagnosis("anthropic", "none")
    return None


#: agentcache cause (or cause family, before the dot) → the Anthropic categories that name the same divergence.
_ANTHROPIC = {
    "tools": frozenset({"tools_changed"}),
    "system": frozenset({"system_changed"}),
    "messages": frozenset({"messages_changed"}),
    "options.model": frozenset({"model_changed"}),
    # "unavailable ... includes a request whose model, system and tools match but whose other prompt-affecting
    # parameters, such as thinking or tool_choice, differ" (anthropic SDK, CacheMissUnavailable).
    "options.tool_choice": frozenset({"unavailable"}),
    "options.thinking": frozenset({"unavailable"}),
    "options.other": frozenset({"unavailable"}),
    # Same bytes: no divergence to report, or (past the fingerprint's retention, like an expired entry) no record.
    "ttl.expired": frozenset({"none", "previous_message_not_found"}),
    None: frozenset({"none"}),
}
_OPENAI = {
    "tools": frozenset({"tools_changed"}),
    "system": frozenset({"input_changed"}),
    "messages": frozenset({"input_changed", "context_compacted"}),
    "options.model": frozenset({"model_changed"}),
    "options.thinking": frozenset({"reasoning_effort_changed"}),
    "options.tool_choice": frozenset({"input_changed", "tools_changed"}),
    "options.other": frozenset({"text_format_changed", "verbosity_changed", "service_tier_changed"}),
    "cache_key.changed": frozenset({"prompt_cache_key_changed"}),
    "ttl.expired": frozenset({"cache_hit", "comparison_response_not_found"}),
    None: frozenset({"cache_hit"}),
}


def expected_reasons(provider: str, cause: str | None) -> frozenset[str]:
    """The ``provider`` reasons that name the same divergence as agentcache's ``cause`` (None: the request
    extended the one before). Empty for a cause the provider has no category for."""
    table = _ANTHROPIC if provider == "anthropic" else _OPENAI
    if cause in table:
        return table[cause]
    family = cause.split(".", 1)[0] if cause else None
    return table.get(family, frozenset())


def compare(diagnosis: ProviderDiagnosis, ours: str | None) -> ProviderMiss:
    """``diagnosis`` beside agentcache's ``ours`` (see :class:`ProviderMiss`)."""
    expected = expected_reasons(diagnosis.provider, ours)
    agrees: bool | None = diagnosis.reason in expected
    if not agrees and diagnosis.reason in UNINFORMATIVE:
        agrees = None
    return ProviderMiss(diagnosis.provider, diagnosis.reason, diagnosis.missed_tokens, ours, agrees)


def reason_label(provider: str, reason: str) -> str:
    """``reason`` as a bounded metrics label value: a documented reason of ``provider``, else ``other``."""
    known = ANTHROPIC_REASONS if provider == "anthropic" else OPENAI_REASONS
    return reason if reason in known else "other"


#: A provider reason → the agentcache cause it names (for logs that kept the provider's diagnosis but no body).
_CAUSE_OF = {
    ("anthropic", "model_changed"): "options.model",
    ("anthropic", "system_changed"): "system.changed",
    ("anthropic", "tools_changed"): "tools.changed",
    ("anthropic", "messages_changed"): "messages.edited",
    ("openai", "model_changed"): "options.model",
    ("openai", "tools_changed"): "tools.changed",
    ("openai", "input_changed"): "messages.edited",
    ("openai", "context_compacted"): "messages.compacted",
    ("openai", "prompt_cache_key_changed"): "cache_key.changed",
    ("openai", "reasoning_effort_changed"): "options.thinking",
    ("openai", "text_format_changed"): "options.other",
    ("openai", "verbosity_changed"): "options.other",
    ("openai", "service_tier_changed"): "options.other",
}


def cause_of(diagnosis: ProviderDiagnosis) -> str | None:
    """The agentcache cause the provider's reason names (``messages_changed`` → ``messages.edited``), or None
    when the reason names no divergence (``none``, ``cache_hit``, ``unavailable``, a baseline not found)."""
    return _CAUSE_OF.get((diagnosis.provider, diagnosis.reason))
