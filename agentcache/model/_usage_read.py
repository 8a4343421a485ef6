"""Usage in every reported shape read into one :class:`CacheUsage` (the formats: :mod:`agentcache.model._usage`).

:func:`read_usage` takes the shape a wire's responses use (:data:`UsageForm`, a wire's
:attr:`~agentcache.adapters._base.Wire.usage_form`), or sniffs it when unknown; this module knows usage shapes,
not APIs (the wires say which shape is theirs).
"""

from __future__ import annotations

from collections.abc import Mapping
from dataclasses import dataclass, field, replace
from typing import Any, Literal

from ._provider import ProviderDiagnosis, read_diagnosis

__all__ = ["CacheUsage", "UsageForm", "as_dict", "read_field", "read_usage", "served_by"]

#: The shape of a whole response's ``usage``: ``anthropic`` (``input_tokens`` is the uncached remainder),
#: ``responses`` (``input_tokens`` is the whole prompt), ``chat`` (``prompt_tokens``; also DeepSeek, SGLang,
#: llama.cpp and LiteLLM fields beside it).
UsageForm = Literal["anthropic", "chat", "responses"]


@dataclass(frozen=True, slots=True)
class CacheUsage:
    """One request's prompt-cache usage, in tokens.

    ``prompt_tokens``: the whole prompt. ``cache_read_tokens``: read from the cache.
    ``cache_write_tokens``: written to the cache (Anthropic; OpenAI ``cache_write_tokens``), of which
    ``cache_write_1h_tokens`` with a 1h TTL. ``uncached_tokens``: processed without the cache.
    ``output_tokens``: generated tokens, None when not reported. ``tiers``: where the read tokens
    lived, per engine tier (SGLang ``device``/``host``/``storage``), empty when not reported.
    ``source``: the format read (see the module docstring). ``response_id``: the response's ``id`` (Anthropic
    ``msg_...``, OpenAI Responses ``resp_...``) when the whole response was read, else None. ``diagnosis``: the
    provider's own cache-miss diagnosis in the response (:mod:`agentcache.model._provider`), None when absent.
    ``response_model``: the model the response says answered (its ``model``), None when not read; not part of
    :meth:`to_dict` (recordings and reports name the requested model).
    """

    prompt_tokens: int
    cache_read_tokens: int
    cache_write_tokens: int
    uncached_tokens: int
    source: str
    cache_write_1h_tokens: int = 0
    output_tokens: int | None = None
    tiers: Mapping[str, int] = field(default_factory=dict)
    response_id: str | None = None
    diagnosis: ProviderDiagnosis | None = None
    response_model: str | None = None

    @property
    def hit_rate(self) -> float:
        """``cache_read_tokens / prompt_tokens`` (0 for an empty prompt)."""
        return self.cache_read_tokens / self.prompt_tokens if self.prompt_tokens else 0.0

    def to_dict(self) -> dict[str, Any]:
        """JSON-ready dict (``tiers`` only when reported)."""
        out: dict[str, Any] = {
            "source": self.source,
            "prompt_tokens": self.prompt_tokens,
            "cache_read_tokens": self.cache_read_tokens,
            "cache_write_tokens": self.cache_write_tokens,
            "cache_write_1h_tokens": self.cache_write_1h_tokens,
            "uncached_tokens": self.uncached_tokens,
            "output_tokens": self.output_tokens,
        }
        if self.tiers:
            out["tiers"] = dict(self.tiers)
        if self.response_id is not None:
            out["response_id"] = self.response_id
        if self.diagnosis is not None:
            out["diagnosis"] = {"provider": self.diagnosis.provider, "reason": self.diagnosis.reason}
        return out


#: The cache whose rules produced usage read in each format (``source``): ``litellm`` is LiteLLM's OpenAI form of
#: Anthropic's usage. DeepSeek's own cache is none of the simulated ones.
_SOURCE_PROVIDER = {
    "anthropic": "anthropic",
    "litellm": "anthropic",
    "openai.chat": "openai",
    "openai.responses": "openai",
    "sglang": "engine",
    "llama.cpp": "engine",
}


def served_by(usage: CacheUsage) -> str | None:
    """The target name (``anthropic``, ``openai``, ``engine``) whose cache rules the reported ``usage`` follows,
    from the format it was read in; None for a cache agentcache does not simulate (DeepSeek). An Anthropic-form
    usage from llama.cpp's ``/v1/messages`` reads as ``anthropic``: the fields alone cannot tell them apart."""
    return _SOURCE_PROVIDER.get(usage.source)


def as_dict(obj: Any) -> dict[str, Any] | None:
    """``obj`` as a dict: itself, or ``model_dump()`` of an SDK/pydantic object; else None."""
    if isinstance(obj, Mapping):
        return dict(obj)
    dump = getattr(obj, "model_dump", None)
    if callable(dump):
        try:
            value = dump()
        except Exception:  # a foreign object with an incompatible model_dump: unreadable
            return None
        return dict(value) if isinstance(value, Mapping) else None
    return None


def _int(value: Any) -> int:
    """A token count: ints (not bools) and integral floats; anything else counts as 0."""
    if isinstance(value, bool):
        return 0
    if isinstance(value, int):
        return max(value, 0)
    if isinstance(value, float) and value.is_integer():
        return max(int(value), 0)
    return 0


def _opt_int(value: Any) -> int | None:
    return None if value is None else _int(value)


def _sub(d: Mapping[str, Any], key: str) -> dict[str, Any]:
    return as_dict(d.get(key)) or {}


def _tiers(details: Any) -> dict[str, int]:
    d = as_dict(details) or {}
    return {k: _int(v) for k, v in d.items() if v is not None and k in ("device", "host", "storage")}


def _make(
    prompt: int, read: int, write: int, source: str, *, w1h: int = 0, out: int | None = None, tiers: Any = None
) -> CacheUsage:
    prompt = max(prompt, read + write)
    return CacheUsage(prompt, read, write, prompt - read - write, source, w1h, out, _tiers(tiers))


def from_anthropic(usage: Mapping[str, Any]) -> CacheUsage:
    """Anthropic Messages ``usage`` (``input_tokens`` is the uncached remainder)."""
    read = _int(usage.get("cache_read_input_tokens"))
    write = _int(usage.get("cache_creation_input_tokens"))
    split = _sub(usage, "cache_creation")
    w1h = _int(split.get("ephemeral_1h_input_tokens"))
    write = max(write, _int(split.get("ephemeral_5m_input_tokens")) + w1h)
    uncached = _int(usage.get("input_tokens"))
    return _make(uncached + read + write, read, write, "anthropic", w1h=w1h, out=_opt_int(usage.get("output_tokens")))


def from_openai_chat(usage: Mapping[str, Any], timings: Mapping[str, Any] | None = None) -> CacheUsage:
    """Chat Completions ``usage``; DeepSeek's hit/miss fields, SGLang's ``cached_tokens_details``, LiteLLM's
    Anthropic cache fields and llama.cpp's ``timings`` (given separately: it sits beside ``usage``) are
    recognised."""
    details = _sub(usage, "prompt_tokens_details")
    out = _opt_int(usage.get("completion_tokens"))
    if "prompt_cache_hit_tokens" in usage or "prompt_cache_miss_tokens" in usage:
        hit, miss = _int(usage.get("prompt_cache_hit_tokens")), _int(usage.get("prompt_cache_miss_tokens"))
        return _make(max(_int(usage.get("prompt_tokens")), hit + miss), hit, 0, "deepseek", out=out)
    if timings and "cache_n" in timings:
        read, processed = _int(timings.get("cache_n")), _int(timings.get("prompt_n"))
        return _make(max(_int(usage.get("prompt_tokens")), read + processed), read, 0, "llama.cpp", out=out)
    read = _int(details.get("cached_tokens"))
    if "cache_creation_input_tokens" in usage or "cache_read_input_tokens" in usage:
        # LiteLLM in front of Anthropic: OpenAI's shape, Anthropic's cache fields beside it (the write is
        # Anthropic's ``cache_creation_input_tokens``; ``prompt_tokens`` already counts it).
        read = max(read, _int(usage.get("cache_read_input_tokens")))
        write = _int(usage.get("cache_creation_input_tokens"))
        return _make(_int(usage.get("prompt_tokens")), read, write, "litellm", out=out)
    write = _int(usage.get("cache_write_tokens") or details.get("cache_write_tokens"))
    tiers = usage.get("cached_tokens_details") or details.get("cached_tokens_details")
    source = "sglang" if tiers is not None else "openai.chat"
    return _make(_int(usage.get("prompt_tokens")), read, write, source, out=out, tiers=tiers)


def from_openai_responses(usage: Mapping[str, Any]) -> CacheUsage:
    """Responses API ``usage`` (``input_tokens`` is the whole prompt)."""
    details = _sub(usage, "input_tokens_details")
    write = _int(usage.get("cache_write_tokens") or details.get("cache_write_tokens"))
    read = _int(details.get("cached_tokens"))
    out = _opt_int(usage.get("output_tokens"))
    return _make(_int(usage.get("input_tokens")), read, write, "openai.responses", out=out)


def from_sglang_meta(meta: Mapping[str, Any]) -> CacheUsage:
    """SGLang ``/generate`` ``meta_info``."""
    out = _opt_int(meta.get("completion_tokens"))
    tiers = meta.get("cached_tokens_details")
    return _make(_int(meta.get("prompt_tokens")), _int(meta.get("cached_tokens")), 0, "sglang", out=out, tiers=tiers)


def from_llama_timings(timings: Mapping[str, Any]) -> CacheUsage:
    """llama.cpp ``timings`` alone (``cache_n`` reused + ``prompt_n`` processed)."""
    read = _int(timings.get("cache_n"))
    return _make(read + _int(timings.get("prompt_n")), read, 0, "llama.cpp", out=_opt_int(timings.get("predicted_n")))


def _is_anthropic(u: Mapping[str, Any]) -> bool:
    return any(k in u for k in ("cache_read_input_tokens", "cache_creation_input_tokens", "cache_creation")) or (
        "input_tokens" in u and "total_tokens" not in u and "input_tokens_details" not in u
    )


#: ``(class, key)`` → whether a pydantic v2 model class neither declares ``key`` nor has it as a class attribute.
_UNDECLARED: dict[tuple[type, str], bool] = {}


def _undeclared(cls: type, key: str) -> bool:
    try:
        return _UNDECLARED[cls, key]
    except KeyError:
        declared = getattr(cls, "__pydantic_fields__", None)
        out = isinstance(declared, Mapping) and key not in declared and all(key not in c.__dict__ for c in cls.__mro__)
        _UNDECLARED[cls, key] = out
        return out


def read_field(obj: Any, key: str) -> Any:
    """``obj[key]`` for a mapping, else the attribute (SDK models expose undeclared fields too); None when
    absent. A key a pydantic v2 model does not declare (``__pydantic_fields__``) is read from its
    ``__pydantic_extra__``, without the costly ``AttributeError`` of its ``__getattr__`` when absent (stream
    taps look for llama.cpp ``timings`` on every event)."""
    if isinstance(obj, Mapping):
        return obj.get(key)
    try:
        if _undeclared(type(obj), key):
            extra = getattr(obj, "__pydantic_extra__", None)
            return extra.get(key) if isinstance(extra, Mapping) else None
        return getattr(obj, key, None)
    except Exception:  # a property that raises: treat as absent
        return None


def read_usage(data: Any, form: UsageForm | None = None) -> CacheUsage | None:
    """A response body, or its ``usage`` alone, read into a :class:`CacheUsage`.

    ``data``: a dict or SDK object (a whole response, a ``usage`` object, an SGLang ``meta_info``,
    or llama.cpp ``timings``). ``form``: the usage shape of the response's wire when known (it settles the one
    ambiguous shape, ``input_tokens`` alone); None sniffs it from the fields.
    Returns None when no usage is present. A whole response also gives its ``id`` (``response_id``), its
    ``model`` (``response_model``) and the provider's cache-miss ``diagnosis`` (Anthropic ``diagnostics``, OpenAI
    ``prompt_cache_diagnostics``). Never raises on odd input.
    """
    usage = _normalize(data, form)
    if usage is None:
        return None
    top = as_dict(data) if isinstance(data, Mapping) or hasattr(data, "model_dump") else None
    if top is None or "usage" not in top:
        return usage
    rid, model = top.get("id"), top.get("model")
    try:
        diagnosis = read_diagnosis(top)
    except Exception:  # an odd diagnostics shape carries no diagnosis
        diagnosis = None
    if isinstance(rid, str) or diagnosis is not None or isinstance(model, str):
        usage = replace(
            usage,
            response_id=rid if isinstance(rid, str) else None,
            diagnosis=diagnosis,
            response_model=model if isinstance(model, str) else None,
        )
    return usage


def _normalize(data: Any, form: UsageForm | None) -> CacheUsage | None:
    if data is None:
        return None
    meta = as_dict(read_field(data, "meta_info"))
    if meta is not None and "prompt_tokens" in meta:
        return from_sglang_meta(meta)
    timings = as_dict(read_field(data, "timings"))
    usage = as_dict(read_field(data, "usage"))
    if usage is None:
        if timings is not None and "cache_n" in timings:
            return from_llama_timings(timings)
        top = as_dict(data)  # data is itself a usage object (or meta_info, or timings)
        if top is None:
            return None
        if "prompt_tokens" in top and "cached_tokens" in top:
            return from_sglang_meta(top)
        if "cache_n" in top:
            return from_llama_timings(top)
        usage = top
    anthropic = form == "anthropic" or (form is None and _is_anthropic(usage))
    if anthropic and ("input_tokens" in usage or "cache_read_input_tokens" in usage):
        return from_anthropic(usage)
    if "input_tokens" in usage and (form == "responses" or "prompt_tokens" not in usage):
        return from_openai_responses(usage)
    if "prompt_tokens" in usage or "prompt_cache_hit_tokens" in usage:
        return from_openai_chat(usage, timings)
    return None
