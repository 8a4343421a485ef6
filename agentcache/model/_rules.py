"""Provider cache rules and per-model prices, loaded from ``agentcache/data/models.toml``.

The data file carries the source of every number. Model ids are matched after normalisation:
lower case, ``.`` → ``-``, a trailing ``-YYYYMMDD`` / ``-latest`` and a ``provider/`` prefix removed,
then the longest table key that is a prefix of the id wins (``claude-sonnet-4-5-20250929`` →
``claude-sonnet-4-5``), unless what follows the key is another version number (``claude-opus-4-8`` is not
``claude-opus-4``): such an id is unknown and gets the provider's default model.
"""

from __future__ import annotations

import re
import tomllib
from dataclasses import dataclass
from functools import cache, lru_cache
from importlib import resources
from typing import Any

from .._exceptions import ConfigError

PROVIDERS = ("anthropic", "openai")


@dataclass(frozen=True, slots=True)
class AnthropicRules:
    """Anthropic cache rules for one model. Token counts in tokens, times in seconds, prices in USD/MTok."""

    model: str
    input_usd_per_mtok: float
    min_cacheable_tokens: int
    max_breakpoints: int
    lookback_blocks: int
    ttl_5m_seconds: float
    ttl_1h_seconds: float
    write_5m_multiplier: float
    write_1h_multiplier: float
    read_multiplier: float
    known: bool = True

    def cost(self, uncached: int, read: int, write_5m: int, write_1h: int) -> float:
        """Input-side cost in USD of one request with these token counts."""
        rate = self.input_usd_per_mtok / 1e6
        return rate * (
            uncached
            + read * self.read_multiplier
            + write_5m * self.write_5m_multiplier
            + write_1h * self.write_1h_multiplier
        )


@dataclass(frozen=True, slots=True)
class OpenAIRules:
    """OpenAI automatic prompt-cache rules for one model (tokens, seconds, USD/MTok)."""

    model: str
    input_usd_per_mtok: float
    cached_usd_per_mtok: float
    min_cacheable_tokens: int
    hit_increment_tokens: int
    routing_prefix_tokens: int
    requests_per_minute_per_key: int
    in_memory_ttl_seconds: float
    extended_ttl_seconds: float
    known: bool = True
    breakpoints: bool = False
    max_breakpoints_written: int = 4
    max_explicit_with_implicit: int = 3
    breakpoint_ttl_seconds: float = 1800.0

    def cost(self, uncached: int, read: int) -> float:
        """Input-side cost in USD of one request."""
        return (uncached * self.input_usd_per_mtok + read * self.cached_usd_per_mtok) / 1e6


@cache
def _table() -> dict[str, Any]:
    raw = resources.files("agentcache").joinpath("data/models.toml").read_text()
    return tomllib.loads(raw)


def normalize_model(model: str) -> str:
    """Canonical model key (see module docstring)."""
    m = model.lower().strip().split("/")[-1].replace(".", "-")
    m = re.sub(r"-(\d{8}|latest)$", "", m)
    return m


def _covers(key: str, model: str) -> bool:
    """Whether table key ``key`` names normalised id ``model``: the same id, or ``key`` followed by a suffix
    that is not another version number (``claude-opus-4-8`` is a newer model than ``claude-opus-4``, not a
    variant of it, so it must not get Opus 4's price)."""
    if model == key:
        return True
    if not model.startswith(key + "-"):
        return False
    nxt = model[len(key) + 1 :].split("-", 1)[0]
    return not (nxt.isdigit() and len(nxt) <= 2)


def _lookup(provider: str, model: str | None) -> tuple[str, dict[str, Any], bool]:
    if provider not in PROVIDERS:
        raise ConfigError(f"unknown provider {provider!r}; expected one of {PROVIDERS}")
    section = _table()[provider]
    models: dict[str, Any] = section["models"]
    key = normalize_model(model) if model else ""
    best = max((k for k in models if _covers(k, key)), key=len, default=None)
    if best is None:
        return section["default_model"], models[section["default_model"]], False
    return best, models[best], True


@lru_cache(maxsize=512)  # every request asks; the table is fixed for the process
def anthropic_rules(model: str | None) -> AnthropicRules:
    """Rules for ``model`` (the provider default's numbers, with ``known=False``, if not in the table)."""
    name, m, known = _lookup("anthropic", model)
    s = _table()["anthropic"]
    return AnthropicRules(
        model=name,
        input_usd_per_mtok=float(m["input_usd_per_mtok"]),
        min_cacheable_tokens=int(m["min_cacheable_tokens"]),
        max_breakpoints=int(s["max_breakpoints"]),
        lookback_blocks=int(s["lookback_blocks"]),
        ttl_5m_seconds=float(s["ttl_5m_seconds"]),
        ttl_1h_seconds=float(s["ttl_1h_seconds"]),
        write_5m_multiplier=float(s["write_5m_multiplier"]),
        write_1h_multiplier=float(s["write_1h_multiplier"]),
        read_multiplier=float(s["read_multiplier"]),
        known=known,
    )


@lru_cache(maxsize=512)
def openai_rules(model: str | None) -> OpenAIRules:
    """Rules for ``model`` (the provider default's numbers, with ``known=False``, if not in the table)."""
    name, m, known = _lookup("openai", model)
    s = _table()["openai"]
    return OpenAIRules(
        model=name,
        input_usd_per_mtok=float(m["input_usd_per_mtok"]),
        cached_usd_per_mtok=float(m["cached_usd_per_mtok"]),
        min_cacheable_tokens=int(m.get("min_cacheable_tokens", s["min_cacheable_tokens"])),
        hit_increment_tokens=int(s["hit_increment_tokens"]),
        routing_prefix_tokens=int(s["routing_prefix_tokens"]),
        requests_per_minute_per_key=int(s["requests_per_minute_per_key"]),
        in_memory_ttl_seconds=float(s["in_memory_ttl_seconds"]),
        extended_ttl_seconds=float(s["extended_ttl_seconds"]),
        known=known,
        breakpoints=supports_breakpoints(model),
        max_breakpoints_written=int(s["breakpoints"]["max_written"]),
        max_explicit_with_implicit=int(s["breakpoints"]["max_explicit_with_implicit"]),
        breakpoint_ttl_seconds=float(s["breakpoints"]["ttl_seconds"]),
    )


def supports_breakpoints(model: str | None) -> bool:
    """True when OpenAI ``model`` takes ``prompt_cache_breakpoint`` / ``prompt_cache_options``
    (gpt-5.6 and later, per the capability table in models.toml)."""
    m = re.match(r"gpt-(\d+)(?:[.-](\d+))?", (model or "").lower().split("/")[-1])
    if m is None:
        return False
    major, minor = (int(x) for x in str(_table()["openai"]["breakpoints"]["min_version"]).split("."))
    return (int(m.group(1)), int(m.group(2) or 0)) >= (major, minor)


def default_model(provider: str) -> str:
    """The provider's default model id in the table."""
    if provider not in PROVIDERS:
        raise ConfigError(f"unknown provider {provider!r}; expected one of {PROVIDERS}")
    return str(_table()[provider]["default_model"])
