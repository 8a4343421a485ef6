"""Provider cache rules and per-model prices, loaded from ``agentcache/data/models.toml`` (every row names the
documentation page its numbers were read from, and when), with the rows of the config file's ``models`` table
laid over them (:func:`install_models`).

A model id is known when it equals a row's id or one of its listed ``aliases`` (dated snapshots such as
``claude-opus-4-5-20251101``), after :func:`normalize_model` (lower case, ``provider/`` prefix dropped, ``.`` →
``-``) on both sides. Nothing else matches: ``claude-opus-4-8`` is not ``claude-opus-4``. An unknown model gets the
provider's ``default_model`` numbers with ``known=False`` and is named once per process in a ``model.unknown``
warning on the ``agentcache.model`` logger (silent unless the host configures logging).
"""

from __future__ import annotations

import re
import tomllib
from dataclasses import dataclass
from functools import cache, lru_cache
from importlib import resources
from typing import Any

from .._exceptions import ConfigError
from .._log import get_logger
from ._bounded import bounded

PROVIDERS = ("anthropic", "openai")

log = get_logger("agentcache.model")


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
    write_usd_per_mtok: float | None = None
    long_context_tokens: int | None = None
    long_context_multiplier: float = 1.0

    def cost(self, uncached: int, read: int, write: int = 0) -> float:
        """Input-side cost in USD of one request of ``uncached`` + ``read`` + ``write`` prompt tokens: cache
        writes at the model's write price (its input price when it has none); above ``long_context_tokens`` in
        all, every input-side rate times ``long_context_multiplier`` for the whole request (gpt-6.2-sol: 2× over
        272K)."""
        write_price = self.input_usd_per_mtok if self.write_usd_per_mtok is None else self.write_usd_per_mtok
        usd = (uncached * self.input_usd_per_mtok + read * self.cached_usd_per_mtok + write * write_price) / 1e6
        long = self.long_context_tokens is not None and uncached + read + write > self.long_context_tokens
        return usd * self.long_context_multiplier if long else usd


#: Override rows from the config file (:func:`install_models`), per provider: model id → fields.
_overrides: dict[str, dict[str, dict[str, Any]]] = {}
#: ``(provider, model)`` pairs already named in an ``model.unknown`` warning (bounded: a client cannot grow it).
_warned: set[tuple[str, str]] = set()
_MAX_WARNED = 1024

#: The fields a model row may carry (see ``agentcache/data/models.toml``).
MODEL_FIELDS = frozenset(
    {
        "input_usd_per_mtok",
        "cache_read_usd_per_mtok",
        "write_5m_usd_per_mtok",
        "write_1h_usd_per_mtok",
        "cache_write_usd_per_mtok",
        "long_context_tokens",
        "long_context_multiplier",
        "min_cacheable_tokens",
        "aliases",
        "retired",
        "source",
    }
)


@cache
def _builtin() -> dict[str, Any]:
    raw = resources.files("agentcache").joinpath("data/models.toml").read_text()
    return tomllib.loads(raw)


def _table() -> dict[str, Any]:
    return _builtin()


@cache
def _models(provider: str) -> dict[str, dict[str, Any]]:
    """The provider's model rows: the built-in table with the config file's rows laid over it."""
    rows = {k: dict(v) for k, v in _builtin()[provider]["models"].items()}
    for name, fields in _overrides.get(provider, {}).items():
        rows[name] = {**rows.get(name, {}), **fields}
    return rows


@cache
def _index(provider: str) -> dict[str, str]:
    """Normalised id or alias → the table's model id."""
    out: dict[str, str] = {}
    for name, row in _models(provider).items():
        for key in (name, *row.get("aliases", ())):
            out[normalize_model(str(key))] = name
    return out


def normalize_model(model: str) -> str:
    """Canonical form of a model id for matching: lower case, a ``provider/`` prefix dropped, ``.`` → ``-``
    (``anthropic/claude-opus-4.8`` → ``claude-opus-4-8``). No version is guessed: dated snapshots match only
    as listed aliases."""
    return model.lower().strip().split("/")[-1].replace(".", "-")


def check_models(models: Any) -> dict[str, dict[str, dict[str, Any]]]:
    """Validate config-file model rows ``{provider: {model id: {field: value}}}`` (fields as in
    ``agentcache/data/models.toml``). A new model needs ``input_usd_per_mtok`` (and, for OpenAI,
    ``cache_read_usd_per_mtok``). Returns them as plain dicts; raises ValueError naming the bad entry."""
    if not isinstance(models, dict):
        raise ValueError("models must be a table of providers")
    out: dict[str, dict[str, dict[str, Any]]] = {}
    for provider, rows in models.items():
        if provider not in PROVIDERS:
            raise ValueError(f"models.{provider}: unknown provider; expected one of {', '.join(PROVIDERS)}")
        if not isinstance(rows, dict):
            raise ValueError(f"models.{provider} must be a table of models")
        builtin = _builtin()[provider]["models"]
        for name, fields in rows.items():
            where = f"models.{provider}.{name}"
            if not isinstance(fields, dict):
                raise ValueError(f"{where} must be a table")
            bad = sorted(set(fields) - MODEL_FIELDS)
            if bad:
                raise ValueError(
                    f"{where}: unknown field(s) {', '.join(bad)}; known: {', '.join(sorted(MODEL_FIELDS))}"
                )
            need = ["input_usd_per_mtok"] + (["cache_read_usd_per_mtok"] if provider == "openai" else [])
            missing = [k for k in need if k not in fields and name not in builtin]
            if missing:
                raise ValueError(f"{where}: a new model needs {', '.join(missing)}")
            for key, value in fields.items():
                numeric = key.endswith(("_per_mtok", "_tokens", "_multiplier"))
                if numeric and (isinstance(value, bool) or not isinstance(value, int | float) or value < 0):
                    raise ValueError(f"{where}.{key}: expected a number >= 0, got {value!r}")
            aliases = fields.get("aliases", [])
            if not isinstance(aliases, list) or not all(isinstance(a, str) for a in aliases):
                raise ValueError(f"{where}.aliases: expected a list of model ids")
            out.setdefault(provider, {})[str(name)] = dict(fields)
    return out


def install_models(models: Any) -> None:
    """Lay config-file model rows (see :func:`check_models`) over the built-in table, process-wide (the price
    table is one per process: :func:`agentcache.configure` installs the settings' ``models``). Raises
    ValueError for a bad row."""
    global _overrides
    rows = check_models(models or {})
    if rows == _overrides:
        return
    _overrides = rows
    for fn in (_models, _index, _anthropic_rules, _openai_rules):
        fn.cache_clear()
    _warned.clear()


def unknown_model(provider: str, model: str) -> ConfigError:
    """The error for ``model`` missing from ``provider``'s price table, saying how to add it: a row in the
    ``--config`` file (``AGENTCACHE_CONFIG``), not an edit of the installed package's table."""
    need = "input_usd_per_mtok" + (" and cache_read_usd_per_mtok" if provider == "openai" else "")
    return ConfigError(
        f"unknown {provider} model {model!r}: give its prices in a config file (--config FILE or AGENTCACHE_CONFIG), "
        f'a table [models.{provider}."{model}"] with {need} (other fields: {", ".join(sorted(MODEL_FIELDS))})'
    )


def _warn_unknown(provider: str, model: str, default: str) -> None:
    key = (provider, model[:200])
    if key in _warned or len(_warned) >= _MAX_WARNED:
        return
    _warned.add(key)
    log.warning("model.unknown", provider=provider, model=key[1], priced_as=default)


def _lookup(provider: str, model: str | None) -> tuple[str, dict[str, Any], bool]:
    """``(table id, row, known)`` for ``model``: the row whose id or alias equals it, or the provider's default
    model's row with ``known=False`` (named once per process in a ``model.unknown`` warning)."""
    if provider not in PROVIDERS:
        raise ConfigError(f"unknown provider {provider!r}; expected one of {PROVIDERS}")
    section = _table()[provider]
    models = _models(provider)
    name = _index(provider).get(normalize_model(model)) if model else None
    if name is None:
        default = section["default_model"]
        if model:
            _warn_unknown(provider, model, default)
        return default, models[default], False
    return name, models[name], True


def lookup_model(provider: str, model: str | None) -> tuple[str, bool]:
    """``(the table's id, known)`` of ``model`` under ``provider`` (``anthropic``/``openai``): for an unknown
    model, the default model's id and False. Raises ConfigError for another provider."""
    name, _, known = _lookup(provider, model)
    return name, known


def anthropic_rules(model: str | None) -> AnthropicRules:
    """Rules for ``model`` (the provider default's numbers, with ``known=False``, if not in the table)."""
    return _anthropic_rules(bounded(model) if model else model)


@lru_cache(maxsize=512)  # every request asks; the table is fixed for the process; the names are bounded
def _anthropic_rules(model: str | None) -> AnthropicRules:
    name, m, known = _lookup("anthropic", model)
    s = _table()["anthropic"]
    base = float(m["input_usd_per_mtok"])
    return AnthropicRules(
        model=name,
        input_usd_per_mtok=base,
        min_cacheable_tokens=int(m.get("min_cacheable_tokens", 1024)),
        max_breakpoints=int(s["max_breakpoints"]),
        lookback_blocks=int(s["lookback_blocks"]),
        ttl_5m_seconds=float(s["ttl_5m_seconds"]),
        ttl_1h_seconds=float(s["ttl_1h_seconds"]),
        write_5m_multiplier=_ratio(m, "write_5m_usd_per_mtok", base, s["write_5m_multiplier"]),
        write_1h_multiplier=_ratio(m, "write_1h_usd_per_mtok", base, s["write_1h_multiplier"]),
        read_multiplier=_ratio(m, "cache_read_usd_per_mtok", base, s["read_multiplier"]),
        known=known,
    )


def openai_rules(model: str | None) -> OpenAIRules:
    """Rules for ``model`` (the provider default's numbers, with ``known=False``, if not in the table)."""
    return _openai_rules(bounded(model) if model else model)


@lru_cache(maxsize=512)
def _openai_rules(model: str | None) -> OpenAIRules:
    name, m, known = _lookup("openai", model)
    s = _table()["openai"]
    return OpenAIRules(
        model=name,
        input_usd_per_mtok=float(m["input_usd_per_mtok"]),
        cached_usd_per_mtok=float(m["cache_read_usd_per_mtok"]),
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
        write_usd_per_mtok=float(m["cache_write_usd_per_mtok"]) if "cache_write_usd_per_mtok" in m else None,
        long_context_tokens=int(m["long_context_tokens"]) if "long_context_tokens" in m else None,
        long_context_multiplier=float(m.get("long_context_multiplier", 1.0)),
    )


def _ratio(row: dict[str, Any], key: str, base: float, default: Any) -> float:
    """A row's price ``key`` as a multiple of its base input price (the section's ``default`` when absent)."""
    if key not in row or base <= 0:
        return float(default)
    return float(row[key]) / base


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
