"""Settings: environment variables ``AGENTCACHE_*`` and an optional TOML file.

Precedence: explicit arguments > environment > TOML file (:func:`configure`'s ``path``; on the command line
``--config FILE`` or ``AGENTCACHE_CONFIG``, for every command that reads settings or prices) > defaults. Configure
once at start-up (:func:`configure`); :func:`reset_settings` is for tests.
"""

from __future__ import annotations

import tomllib
from collections.abc import Callable
from pathlib import Path
from typing import Any, Literal, TypeVar

from pydantic import Field, ValidationError, field_validator
from pydantic_settings import BaseSettings, SettingsConfigDict

from ._exceptions import ConfigError

#: ``target`` values other than an engine name.
_TARGET_WORDS = ("auto", "anthropic", "openai", "engine")


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
    the most seconds one hold lasts. ``otel``: export a span per turn over OTLP (:mod:`agentcache.session._otel`;
    the ``otel`` extra), configured by the standard ``OTEL_*`` variables; off by default.
    """

    model_config = SettingsConfigDict(env_prefix="AGENTCACHE_", extra="ignore")

    def __init__(self, *args: Any, **values: Any) -> None:
        """Read ``values``, then the environment. Raises ConfigError (a ValueError) naming each bad setting,
        where it can come from, its value and what is expected (never pydantic's multi-line text)."""
        try:
            super().__init__(*args, **values)
        except ValidationError as exc:
            raise invalid(exc, "AGENTCACHE_") from None

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
    otel: bool = False

    @field_validator("models", mode="before")
    @classmethod
    def _check_models(cls, value: Any) -> Any:
        from .model._rules import check_models

        return check_models(value)

    @field_validator("target")
    @classmethod
    def _check_target(cls, value: str) -> str:
        from .model._types import Engine, engine_aliases, parse_engine

        key = value.strip().lower()
        if key in _TARGET_WORDS:
            return key
        try:
            return parse_engine(key).value  # the engine's canonical name (llama -> llama.cpp)
        except ConfigError:
            engines = ", ".join(e.value for e in Engine)
            raise ValueError(
                f"expected one of {', '.join(_TARGET_WORDS)} or an engine: {engines} (aliases: {engine_aliases()})"
            ) from None


_settings: Settings | None = None


def read_toml(path: str | Path) -> dict[str, Any]:
    """The TOML document at ``path``. Raises ConfigError with one line: the file cannot be opened (the OS
    reason), is not text (a binary file), or is not TOML (the parser's line and column)."""
    try:
        data = Path(path).read_bytes()
    except OSError as exc:
        raise ConfigError(f"cannot read config {path}: {exc.strerror or exc}") from None
    try:
        text = data.decode("utf-8")
    except UnicodeDecodeError:
        raise ConfigError(f"cannot read config {path}: not a TOML text file (binary, not UTF-8)") from None
    try:
        return tomllib.loads(text)
    except tomllib.TOMLDecodeError as exc:
        raise ConfigError(f"cannot read config {path}: not valid TOML: {exc}") from None


def load_settings(path: str | Path | None = None, **overrides: Any) -> Settings:
    """Settings from ``path`` (TOML; keys as the field names, optionally under ``[agentcache]``),
    the environment, and ``overrides``. Raises ConfigError for a bad file or value."""
    data: dict[str, Any] = {}
    if path is not None:
        raw = read_toml(path)
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
    return build(Settings, data, path=path, overrides=overrides)


class SettingsInvalid(ConfigError):
    """Settings values failed validation. ``errors``: pydantic's error dicts (``loc``, ``msg``, ``input``,
    ``ctx``), kept so a loader that knows where each value came from can say so."""

    def __init__(self, message: str, errors: list[Any]):
        super().__init__(message)
        self.errors = errors


_Model = TypeVar("_Model", bound=BaseSettings)


def build(
    cls: type[_Model],
    file_values: dict[str, Any],
    *,
    path: str | Path | None = None,
    table: str | None = None,
    overrides: dict[str, Any] | None = None,
    flags: bool = False,
) -> _Model:
    """``cls`` (a settings class whose ``__init__`` raises :class:`SettingsInvalid`) from ``file_values``
    (``path``'s ``[table]``), the environment, and ``overrides``, in rising precedence. Raises ConfigError
    naming for each bad value where it came from: ``--name`` (``flags``: overrides are command-line options) or
    the argument, the environment variable, or the key in the file."""
    prefix = str(cls.model_config.get("env_prefix", ""))
    try:
        env = cls()  # the environment alone: a bad variable is named as such
    except SettingsInvalid as exc:
        raise ConfigError(explain(exc.errors, lambda name: f"{prefix}{name.upper()}")) from None
    from_env = {k: v for k, v in env.model_dump().items() if k in env.model_fields_set}
    given = overrides or {}
    try:
        return cls(**{**file_values, **from_env, **given})
    except SettingsInvalid as exc:

        def where(name: str) -> str:
            if name in given:
                return f"--{name.replace('_', '-')}" if flags else f"argument {name}"
            if name in from_env or name not in file_values:
                return f"{prefix}{name.upper()}"
            return f"{name} in {f'[{table}] of ' if table else ''}{path}"

        raise ConfigError(explain(exc.errors, where)) from None


def explain(errors: list[Any], where: Callable[[str], str]) -> str:
    """One clause per bad value in ``errors`` (pydantic's error dicts), joined by ``; ``: the setting, ``where``
    its value came from, the value and what is expected. No pydantic boilerplate or documentation links: a
    validator's own ValueError is shown as its message."""
    parts = []
    for err in errors:
        loc = [str(p) for p in err.get("loc", ())]
        name = ".".join(loc) or "settings"
        cause = (err.get("ctx") or {}).get("error")
        what = str(cause) if isinstance(cause, ValueError) else err.get("msg", "invalid")
        parts.append(f"invalid setting {name}={err.get('input')!r} ({where(loc[0] if loc else name)}): {what}")
    return "; ".join(parts)


def invalid(exc: ValidationError, env_prefix: str) -> SettingsInvalid:
    """The :class:`SettingsInvalid` for a settings class's ``__init__`` failing with ``exc``: values are named
    by their environment variable (or the keyword argument, when one was given)."""
    errors = exc.errors(include_url=False)
    return SettingsInvalid(explain(errors, lambda n: f"{env_prefix}{n.upper()} or argument {n}"), errors)


def configure(path: str | Path | None = None, **overrides: Any) -> Settings:
    """Load and install the process-wide settings (once, at start-up)."""
    return use_settings(load_settings(path, **overrides))


def use_settings(settings: Settings) -> Settings:
    """Install ``settings`` as the process-wide ones (a worker process: those its parent loaded)."""
    global _settings
    _settings = settings
    _install(settings)
    return settings


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
