"""Replay recorded sessions against a real endpoint: sessions in parallel (at most ``concurrency`` at once),
each session's requests in recorded order, streaming.

``via="agentcache"`` sends every request through the session's :class:`~agentcache.session._pipeline.SessionPipeline`
(repairs and cache planning, committed once the request was sent) and gives the engine what session-aware
caching needs: on llama.cpp a slot per session (``id_slot``, from a pool of the server's ``total_slots``), on
SGLang a stable ``session_id`` on every request and ``POST /close_session`` after the session's last request.
``via="direct"`` sends the recorded bodies as they are (converted to the target wire format when needed).

The endpoint kind (``llama.cpp``, ``sglang`` or ``other``) comes from ``GET /v1/models`` (``owned_by``) unless
given; the model name from the same answer unless given (else each body keeps its recorded model).
"""

from __future__ import annotations

import asyncio
import time
from collections.abc import Callable, Sequence
from dataclasses import dataclass
from typing import Any

import httpx

from .._config import Settings, get_settings
from .._log import get_logger
from ..loaders import Record
from ..session._pipeline import Prepared, ScopeMemory, SessionPipeline
from ._client import TurnResult, send_turn
from ._convert import TARGET_APIS, convert, to_token_ids
from ._report import ReplayResult

__all__ = ["ReplayConfig", "detect_endpoint", "group_sessions", "replay", "run_replay"]

log = get_logger("agentcache.replay")


@dataclass(frozen=True, slots=True)
class ReplayConfig:
    """One replay. ``endpoint``: base URL (a trailing ``/v1`` is dropped). ``api``: ``openai``, ``anthropic`` or
    ``sglang`` (native ``/generate`` with token ids, for models without a tokenizer). ``via``: ``agentcache`` or
    ``direct``. ``affinity``: pin sessions (llama.cpp ``id_slot``, SGLang ``session_id``); default: on with
    ``via="agentcache"``. ``max_tokens``: per request. ``max_turns``/``max_sessions``: keep the first N of each.
    ``engine``: ``auto``, ``llama.cpp``, ``sglang`` or ``other``. ``model``: override the model name.
    ``vocab_size``: for ``api="sglang"``. ``label``: the name of this config in reports."""

    endpoint: str
    api: str = "openai"
    concurrency: int = 4
    via: str = "direct"
    affinity: bool | None = None
    max_tokens: int = 16
    max_turns: int | None = None
    max_sessions: int | None = None
    engine: str = "auto"
    model: str | None = None
    api_key: str | None = None
    timeout: float = 600.0
    vocab_size: int | None = None
    label: str = ""

    @property
    def base_url(self) -> str:
        url = self.endpoint.rstrip("/")
        return url[:-3] if url.endswith("/v1") else url

    @property
    def target(self) -> str:
        return TARGET_APIS[self.api]

    @property
    def pinned(self) -> bool:
        return self.via == "agentcache" if self.affinity is None else self.affinity


def group_sessions(records: Sequence[Record], max_sessions: int | None, max_turns: int | None) -> list[list[Record]]:
    """Records per session, sessions in order of first appearance, requests in recorded order; the first
    ``max_sessions`` sessions and the first ``max_turns`` requests of each."""
    sessions: dict[str, list[Record]] = {}
    for record in records:
        sessions.setdefault(record.session, []).append(record)
    groups = list(sessions.values())[: max_sessions or None]
    return [g[: max_turns or None] for g in groups]


async def detect_endpoint(client: httpx.AsyncClient) -> tuple[str, str | None, int | None]:
    """``(engine kind, served model id, llama.cpp total slots)`` from ``/v1/models`` and llama.cpp's ``/props``."""
    kind, model, slots = "other", None, None
    try:
        response = await client.get("/v1/models")
        data = response.json().get("data") or [] if response.status_code == 200 else []
        if data:
            model = data[0].get("id")
            owner = str(data[0].get("owned_by", "")).lower()
            kind = "llama.cpp" if "llama" in owner else "sglang" if "sglang" in owner else "other"
    except (httpx.HTTPError, ValueError, AttributeError):
        pass
    try:
        response = await client.get("/props")
        if response.status_code == 200:
            props = response.json()
            if "total_slots" in props:
                kind, slots = "llama.cpp", int(props["total_slots"])
    except (httpx.HTTPError, ValueError, AttributeError, TypeError):
        pass
    return kind, model, slots


class _Session:
    """Replays one session's requests in order."""

    def __init__(self, run: _Run, records: list[Record]) -> None:
        self.run = run
        self.records = records
        self.name = records[0].session
        cfg = run.config
        self.pipeline: SessionPipeline | None = None
        if cfg.via == "agentcache":
            provider = "anthropic" if cfg.target == "anthropic.messages" else "openai"
            self.pipeline = SessionPipeline(provider, scope=run.scope, settings=run.settings, session=self.name)

    def _body(self, record: Record, slot: int | None) -> tuple[dict[str, Any], Prepared | None]:
        cfg, run = self.run.config, self.run
        wire = "openai.chat" if cfg.target == "sglang.generate" else cfg.target
        body = convert(record.api, record.body, wire)
        if run.model is not None:
            body["model"] = run.model
        prepared = None
        if self.pipeline is not None:
            try:
                prepared = self.pipeline.prepare(wire, body)
                body = dict(prepared.body)
            except Exception:  # fail open: the request goes as it is
                log.warning("replay.pipeline_failed", session=self.name, exc_info=True)
        if cfg.target == "sglang.generate":
            ids = to_token_ids(wire, body, cfg.vocab_size or 32000)
            params = {"max_new_tokens": cfg.max_tokens, "temperature": body.get("temperature", 0.0)}
            body = {"input_ids": ids, "sampling_params": params, "stream": True}
        else:
            body.pop("max_completion_tokens", None)
            body["max_tokens"] = cfg.max_tokens
            body["stream"] = True
            if cfg.target == "openai.chat":
                body["stream_options"] = {"include_usage": True}
        if cfg.pinned and run.kind == "sglang":
            body["session_id"] = self.name
        if slot is not None:
            body["id_slot"] = slot
        return body, prepared

    async def play(self) -> None:
        run = self.run
        async with run.limit:
            slot = await run.slots.get() if run.slots is not None else None
            try:
                for i, record in enumerate(self.records):
                    result = TurnResult(self.name, i, slot=slot)
                    try:
                        body, prepared = self._body(record, slot)
                    except Exception as exc:  # an unconvertible record is an error of this turn only
                        result.error = f"cannot build the request: {type(exc).__name__}: {exc}"
                        run.done(result)
                        continue
                    await send_turn(run.client, run.config.target, body, result, headers=run.headers, clock_zero=run.t0)
                    if result.ok and prepared is not None and self.pipeline is not None:
                        self.pipeline.commit(prepared)
                    run.done(result)
            finally:
                if slot is not None and run.slots is not None:
                    run.slots.put_nowait(slot)
                if run.config.pinned and run.kind == "sglang":
                    await run.close_session(self.name)


class _Run:
    """State shared by the sessions of one replay."""

    def __init__(self, config: ReplayConfig, client: httpx.AsyncClient, on_turn: Callable[[TurnResult], None] | None):
        self.config = config
        self.client = client
        self.on_turn = on_turn
        self.results: list[TurnResult] = []
        self.scope = ScopeMemory()
        self.kind = "other"
        self.model: str | None = config.model
        self.slots: asyncio.Queue[int] | None = None
        self.limit = asyncio.Semaphore(max(1, config.concurrency))
        self.t0 = time.perf_counter()
        self.headers = self._headers()
        self.settings = get_settings()

    def _headers(self) -> dict[str, str]:
        cfg = self.config
        headers: dict[str, str] = {}
        if cfg.target == "anthropic.messages":
            headers["anthropic-version"] = "2023-06-01"
            if cfg.api_key:
                headers["x-api-key"] = cfg.api_key
        elif cfg.api_key:
            headers["authorization"] = f"Bearer {cfg.api_key}"
        return headers

    async def prepare(self) -> None:
        kind, model, slots = await detect_endpoint(self.client)
        self.kind = self.config.engine if self.config.engine != "auto" else kind
        if self.model is None and model is not None and self.kind in ("llama.cpp", "sglang"):
            self.model = model
        if self.kind in ("llama.cpp", "sglang"):
            # Engines have no routing key: never add prompt_cache_key.
            self.settings = Settings(**{**get_settings().model_dump(), "openai_cache_key": "off"})
        if self.config.pinned and self.kind == "llama.cpp":
            self.slots = asyncio.Queue()
            for slot in range(slots or max(1, self.config.concurrency)):
                self.slots.put_nowait(slot)

    def done(self, result: TurnResult) -> None:
        self.results.append(result)
        if self.on_turn is not None:
            self.on_turn(result)

    async def close_session(self, session: str) -> None:
        try:
            await self.client.post("/close_session", json={"session_id": session}, headers=self.headers)
        except httpx.HTTPError as exc:
            log.warning("replay.close_session_failed", session=session, error=str(exc))


async def run_replay(
    records: Sequence[Record],
    config: ReplayConfig,
    *,
    on_turn: Callable[[TurnResult], None] | None = None,
    transport: httpx.AsyncBaseTransport | None = None,
) -> ReplayResult:
    """Replay ``records`` per ``config``; ``on_turn`` is called after each request; ``transport``: for tests."""
    groups = group_sessions(records, config.max_sessions, config.max_turns)
    timeout = httpx.Timeout(config.timeout, connect=30.0)
    # Expire idle connections before servers do (llama.cpp's HTTP server closes them after 5 s).
    limits = httpx.Limits(max_connections=max(1, config.concurrency) * 2 + 4, keepalive_expiry=1.0)
    async with httpx.AsyncClient(
        base_url=config.base_url, timeout=timeout, limits=limits, trust_env=False, transport=transport
    ) as client:
        run = _Run(config, client, on_turn)
        await run.prepare()
        run.t0 = time.perf_counter()
        await asyncio.gather(*(_Session(run, group).play() for group in groups))
        total = time.perf_counter() - run.t0
    order = {g[0].session: i for i, g in enumerate(groups)}
    results = sorted(run.results, key=lambda r: (order.get(r.session, 0), r.turn))
    return ReplayResult(config.label or _label(config, run.kind), _config_dict(config, run), results, total)


def _label(config: ReplayConfig, kind: str) -> str:
    return f"{kind} {config.api} via {config.via}" + (" + affinity" if config.pinned and kind != "other" else "")


def _config_dict(config: ReplayConfig, run: _Run) -> dict[str, Any]:
    return {
        "endpoint": config.base_url,
        "api": config.api,
        "engine": run.kind,
        "model": run.model,
        "via": config.via,
        "affinity": config.pinned,
        "concurrency": config.concurrency,
        "max_tokens": config.max_tokens,
        "max_turns": config.max_turns,
        "max_sessions": config.max_sessions,
    }


def replay(records: Sequence[Record], config: ReplayConfig, **kwargs: Any) -> ReplayResult:
    """Blocking :func:`run_replay`."""
    return asyncio.run(run_replay(records, config, **kwargs))
