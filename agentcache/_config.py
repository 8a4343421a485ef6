"""Settings: environment variables ``AGENTCACHE_*`` and an optional TOML file.

Precedence: explicit arguments > environment > TOML file (``AGENTCACHE_CONFIG`` or ``--config``) >
defaults. Configure once at start-up (:func:`configure`); :func:`reset_settings` is for tests.
"""

from __future__ import annotations

import tomllib
from pathlib import Path
from typing import Any, Literal

from pydantic import Field, ValidationError, field_validator
from pydantic_settings import BaseSettings, SettingsConfigDict

from ._exceptions import ConfigError


class Settings(BaseSettings):
    """agentcache's behaviour switches. Every field is also ``AGENTCACHE_<NAME>`` in the environment.

    ``markers``: ``merge`` keeps the client's valid Anthropic markers in the slots agentcache's own
    tail/read markers leave; ``own`` lets agentcache place all of them.
    ``ttl_policy``: ``auto`` picks 5m or 1h per session from observed gaps and prices; ``5m``/``1h``
    pin it. ``keep_warm``: act on keep-warm decisions (proxy/wrappers; off by default).
    ``move_volatile``: opt-in; moves a volatile system line (date, time, UUID) after the last
    breakpoint. This changes the prompt, so it is off by default.
    ``openai_cache_key``: ``lineage`` sets a ``prompt_cache_key`` per session lineage when the client
    sends none; ``off`` never adds one. ``openai_rpm_per_key``: requests/min one key may carry before
    sessions are sharded over several keys (OpenAI's published ~15). ``openai_key_families``: static-prefix
    (tools + system) families the key planner remembers per cache scope, least recently used dropped (~1 KB
    each; an agent with a timestamp in its system prompt makes one per request).
    ``target``: whose cache rules every session plans for, whatever the door declares or detects: ``auto``
    (default: declared > detected > the request's API), ``anthropic``, ``openai``, ``engine``, or an engine
    name (``sglang``, ``llama.cpp``, ``vllm``). ``detect_engines``: ask an endpoint that is not a provider host
    whether it is a local engine (``GET /v1/models``, ``/props``) before choosing provider rules.
    ``models``: model rows to add to or override in the price table, ``{provider: {model id: {field: value}}}``
    with the fields of ``agentcache/data/models.toml`` (in a config file: ``[models.anthropic."my-model"]``);
    installed process-wide by :func:`configure`. ``provider_diagnostics``: opt-in; asks the provider why each
    request missed its cache (Anthropic cache diagnostics, OpenAI prompt cache diagnostics) by adding the
    previous response's id to the request (and Anthropic's ``cache-diagnosis-2026-04-07`` beta header).
    ``coalesce``: hold a request (proxy; ``wrap()`` around async clients) whose new shared prefix a sibling is
    writing until that sibling's first response byte (:mod:`agentcache.session._coalesce`); ``coalesce_timeout``:
    the most seconds one hold lasts.
    """

    model_config = SettingsConfigDict(env_prefix="AGENTCACHE_", extra="ignore")

    markers: Literal["merge", "own"] = "merge"
    ttl_policy: Literal["auto", "5m", "1h"] = "auto"
    keep_warm: bool = False
    move_volatile: bool = False
    openai_cache_key: Literal["lineage", "off"] = "lineage"
    openai_rpm_per_key: float = Field(default=15.0, gt=0)
    openai_key_families: int = Field(default=4096, gt=0)
    target: str = "auto"
    detect_engines: bool = True
    models: dict[str, dict[str, dict[str, Any]]] = Field(default_factory=dict)
    provider_diagnostics: bool = False
    coalesce: bool = True
    coalesce_timeout: float = Field(default=3.0, ge=0)

    @field_validator("models", mode="before")
    @classmethod
    def _check_models(cls, value: Any) -> Any:
        from .model._rules import check_models

        return check_models(value)

    @field_validator("target")
    @classmethod
    def _check_target(cls, value: str) -> str:
        from .model._types import parse_engine

        key = value.strip().lower()
        if key not in ("auto", "anthropic", "openai", "engine"):
            parse_engine(key)  # raises ConfigError (a ValueError) listing the engines
        return key


_settings: Settings | None = None


def load_settings(path: str | Path | None = None, **overrides: Any) -> Settings:
    """Settings from ``path`` (TOML; keys as the field names, optionally under ``[agentcache]``),
    the environment, and ``overrides``. Raises ConfigError for a bad file or value."""
    data: dict[str, Any] = {}
    if path is not None:
        try:
            raw = tomllib.loads(Path(path).read_text(encoding="utf-8"))
        except (OSError, UnicodeDecodeError, tomllib.TOMLDecodeError) as exc:
            raise ConfigError(f"cannot read config {path}: {exc}") from None
        if "agentcache" in raw:
            data = raw["agentcache"]
            if not isinstance(data, dict):
                raise ConfigError(f"{path}: [agentcache] must be a table")
        else:  # top-level keys (and the [models] table); other tables ([proxy], ...) belong to other readers
            data = {k: v for k, v in raw.items() if not isinstance(v, dict) or k == "models"}
        unknown = sorted(set(data) - set(Settings.model_fields))
        if unknown:
            raise ConfigError(
                f"{path}: unknown setting(s) {', '.join(unknown)}; known: {', '.join(Settings.model_fields)}"
            )
    try:
        # Environment beats the file: pass file values only where no env var is set.
        env = Settings()
        merged = {**data, **{k: v for k, v in env.model_dump().items() if k in env.model_fields_set}}
        return Settings.model_validate({**merged, **overrides})
    except ValidationError as exc:
        raise ConfigError(_explain(exc, path)) from None
    except ValueError as exc:
        raise ConfigError(f"invalid settings: {exc}") from None


def _explain(exc: ValidationError, path: str | Path | None) -> str:
    """One line per bad value of ``exc``: the setting, where it can come from, the value and what is expected."""
    parts = []
    for err in exc.errors(include_url=False):
        name = ".".join(str(p) for p in err["loc"]) or "settings"
        where = f"AGENTCACHE_{name.upper()}" + (f" or {name} in {path}" if path is not None else "")
        parts.append(f"invalid setting {name} ({where}): {err.get('input')!r}: {err['msg']}")
    return "; ".join(parts)


def configure(path: str | Path | None = None, **overrides: Any) -> Settings:
    """Load and install the process-wide settings (once, at start-up)."""
    global _settings
    _settings = load_settings(path, **overrides)
    _install(_settings)
    return _settings


def _install(settings: Settings) -> None:
    """Apply the process-wide parts of ``settings``: the price table's model rows."""
    from .model._rules import install_models

    install_models(settings.models)


def get_settings() -> Settings:
    """The process-wide settings (defaults + environment when :func:`configure` was not called)."""
    global _settings
    if _settings is None:
        _settings = load_settings()
        _install(_settings)
    return _settings


def reset_settings() -> None:
    """Forget the process-wide settings (tests)."""
    global _settings
    _settings = None
    from .model._rules import install_models

    install_models({})
