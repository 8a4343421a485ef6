"""Replay recorded sessions against a real endpoint: sessions in parallel (at most ``concurrency`` at once),
each session's requests in recorded order, streaming.

``via="agentcache"`` sends every request through the session core (one :class:`~agentcache.Sessions` manager, a
session per recorded session: the repairs and planning of the endpoint's target, each turn committed once the
request was answered), as ``wrap()`` and the proxy do. Session affinity gives the engine what session-aware
caching needs: on llama.cpp a slot per session (``id_slot``, from a pool of the server's ``total_slots``), on
SGLang a stable ``session_id`` on every request and ``POST /close_session`` when the session closes after its
last request (:class:`~agentcache.SGLangSink`, the same lifecycle path as the proxy's). ``via="direct"`` sends
the recorded bodies as they are (converted to the target wire format when needed).

The endpoint kind (``llama.cpp``, ``sglang`` or ``other``) is asked of the endpoint
(:func:`agentcache.targets.aprobe`) unless given; the model name from the same answer unless given (else each
body keeps its recorded model). The target: a recognised engine gets the engine target (repairs only); any other
endpoint the provider rules of the wire format sent.
"""

from __future__ import annotations

import asyncio
import time
from collections.abc import Callable, Sequence
from dataclasses import dataclass
from typing import Any

import httpx

from .._config import get_settings
from .._log import get_logger
from ..adapters import endpoint_for
from ..engine import LlamaCppCache, LlamaPrediction, LlamaServerRenderer
from ..loaders import Record
from ..model._types import Engine, parse_engine
from ..session import Session, Sessions, SGLangSink, Turn
from ..targets import aprobe, resolve_target
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
    ``vocab_size``: for ``api="sglang"``. ``label``: the name of this config in reports. ``predict``: on a
    llama.cpp endpoint, predict each turn's cached tokens with the engine model (the server's own
    ``/apply-template`` and ``/tokenize``, :class:`agentcache.engine.LlamaCppCache`; asks for ``logprobs`` on
    OpenAI Chat to learn the generated token ids)."""

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
    predict: bool = True

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
    """``(engine kind, served model id, llama.cpp total slots)`` of the endpoint ``client`` is based at
    (:func:`agentcache.targets.aprobe`); the kind is ``llama.cpp``, ``sglang`` or ``other``."""
    info = await aprobe(client.get, str(client.base_url))
    kind = info.engine.value if info.engine in (Engine.LLAMA_CPP, Engine.SGLANG) else "other"
    return kind, info.model, info.slots


class _Session:
    """Replays one session's requests in order, through the session core with ``via="agentcache"``."""

    def __init__(self, run: _Run, records: list[Record]) -> None:
        self.run = run
        self.records = records
        self.name = records[0].session
        self.session: Session | None = run.sessions.session(self.name) if run.sessions is not None else None

    def _body(self, record: Record, slot: int | None) -> tuple[dict[str, Any], Turn | None]:
        cfg, run = self.run.config, self.run
        endpoint = endpoint_for(cfg.target)
        wire = endpoint.plans_as
        body = convert(record.api, record.body, wire)
        if run.model is not None:
            body["model"] = run.model
        turn = None
        if self.session is not None and cfg.via == "agentcache":
            try:
                turn = self.session.begin(wire, body, base_url=run.base_url)
                body = dict(turn.body)
            except Exception:  # fail open: the request goes as it is
                log.warning("replay.pipeline_failed", session=self.name, exc_info=True)
        elif self.session is not None:  # direct, with session affinity: pinning only
            body = annotate_only(run, body, self.session)
        body = endpoint.replay_body(
            body,
            cfg.max_tokens,
            # the generated token ids, which stay in the slot
            want_ids=run.engine_model is not None,
            token_ids=lambda b: to_token_ids(wire, b, cfg.vocab_size or 32000),
        )
        if slot is not None:
            body["id_slot"] = slot
        return body, turn

    async def play(self) -> None:
        run = self.run
        async with run.limit:
            slot = await run.slots.get() if run.slots is not None else None
            try:
                for i, record in enumerate(self.records):
                    result = TurnResult(self.name, i, slot=slot)
                    try:
                        body, turn = self._body(record, slot)
                    except Exception as exc:  # an unconvertible record is an error of this turn only
                        result.error = f"cannot build the request: {type(exc).__name__}: {exc}"
                        run.done(result)
                        continue
                    prediction = await run.predict(body, slot, result)
                    await send_turn(run.client, run.config.target, body, result, headers=run.headers, clock_zero=run.t0)
                    await run.observe(prediction, result)
                    if turn is not None:
                        if result.ok:
                            turn.succeed(result.usage)
                        else:
                            turn.fail(result.error or "failed")
                    run.done(result)
            finally:
                if slot is not None and run.slots is not None:
                    run.slots.put_nowait(slot)
                if self.session is not None:
                    self.session.close()  # SGLang: /close_session for every generation it pinned


def annotate_only(run: _Run, body: dict[str, Any], session: Session) -> dict[str, Any]:
    """``body`` with the session pinning of the run's sinks (``via="direct"`` with affinity)."""
    for sink in run.sinks:
        body = sink.annotate(body, session.signal, run.base_url)
    return body


class _Run:
    """State shared by the sessions of one replay."""

    def __init__(
        self,
        config: ReplayConfig,
        client: httpx.AsyncClient,
        on_turn: Callable[[TurnResult], None] | None,
        engine_model: LlamaCppCache | None = None,
    ):
        self.config = config
        self.client = client
        self.on_turn = on_turn
        self.results: list[TurnResult] = []
        self.kind = "other"
        self.model: str | None = config.model
        self.slots: asyncio.Queue[int] | None = None
        self.limit = asyncio.Semaphore(max(1, config.concurrency))
        self.t0 = time.perf_counter()
        self.headers = self._headers()
        self.base_url = config.base_url
        self.sessions: Sessions | None = None
        self.sinks: list[SGLangSink] = []
        self.engine_model: LlamaCppCache | None = engine_model
        self.renderer: LlamaServerRenderer | None = None

    def _headers(self) -> dict[str, str]:
        cfg = self.config
        return endpoint_for(cfg.target).replay_headers(cfg.api_key)

    async def prepare(self) -> None:
        kind, model, slots = await detect_endpoint(self.client)
        self.kind = self.config.engine if self.config.engine != "auto" else kind
        if self.model is None and model is not None and self.kind in ("llama.cpp", "sglang"):
            self.model = model
        if self.config.pinned and self.kind == "sglang":
            self.sinks.append(SGLangSink(self.base_url, post=self._post))
        if self.config.via == "agentcache" or self.sinks:
            wire = endpoint_for(self.config.target).plans_as
            engine = parse_engine(self.kind) if self.kind in ("llama.cpp", "sglang") else None
            settings = get_settings()
            target = resolve_target(wire, setting=settings.target, detected=engine)
            self.sessions = Sessions(provider=target, settings=settings, sinks=list(self.sinks), idle_timeout=None)
        if self.kind == "llama.cpp" and self.config.predict and not endpoint_for(self.config.target).sends_token_ids:
            self.renderer = LlamaServerRenderer(client=self.client)
            if self.engine_model is None:  # the server's defaults, with --parallel given (no unified KV)
                self.engine_model = LlamaCppCache(slots=slots or 1)
        else:
            self.engine_model = None
        if self.config.pinned and self.kind == "llama.cpp":
            self.slots = asyncio.Queue()
            for slot in range(slots or max(1, self.config.concurrency)):
                self.slots.put_nowait(slot)

    async def predict(self, body: dict[str, Any], slot: int | None, result: TurnResult) -> LlamaPrediction | None:
        """The engine model's prediction for ``body`` (sent to ``slot`` when pinned), into ``result``; None
        when not predicting or the rendering failed (logged; the request goes anyway)."""
        if self.engine_model is None or self.renderer is None:
            return None
        try:
            ids = await self.renderer.render(self.config.target, body)
        except httpx.HTTPStatusError as exc:  # the endpoint cannot render: no predictions for this run
            log.warning("replay.render_unavailable", status=exc.response.status_code, path=exc.request.url.path)
            self.engine_model = self.renderer = None
            return None
        except Exception:  # fail open: no prediction for this turn, the request goes on
            log.warning("replay.render_failed", session=result.session, turn=result.turn, exc_info=True)
            return None
        prediction = self.engine_model.begin(ids, slot)
        result.predicted_cached_tokens = prediction.cached_tokens if prediction.slot is not None else None
        result.predicted_slot = prediction.slot
        return prediction

    async def observe(self, prediction: LlamaPrediction | None, result: TurnResult) -> None:
        """Tell the engine model what the response generated (its slot keeps those tokens)."""
        if prediction is None or self.engine_model is None or prediction.slot is None:
            return
        if not result.ok and result.status is not None and 400 <= result.status < 500:
            self.engine_model.reject(prediction)  # refused before a slot was taken
            return
        ids = list(result.generated_ids)
        if not ids and result.generated_text and self.renderer is not None:
            try:
                ids = await self.renderer.tokenize(result.generated_text)
            except Exception:
                log.warning("replay.tokenize_failed", session=result.session, exc_info=True)
        self.engine_model.end(prediction.slot, ids, result.output_tokens if result.ok else 0)

    async def _post(self, path: str, doc: dict[str, Any]) -> int:
        response = await self.client.post(path, json=doc, headers=self.headers)
        return response.status_code

    def done(self, result: TurnResult) -> None:
        self.results.append(result)
        if self.on_turn is not None:
            self.on_turn(result)

    async def finish(self) -> None:
        for sink in self.sinks:
            await sink.aflush(10.0)


async def run_replay(
    records: Sequence[Record],
    config: ReplayConfig,
    *,
    on_turn: Callable[[TurnResult], None] | None = None,
    transport: httpx.AsyncBaseTransport | None = None,
    engine_model: LlamaCppCache | None = None,
) -> ReplayResult:
    """Replay ``records`` per ``config``; ``on_turn`` is called after each request; ``transport``: for tests;
    ``engine_model``: the llama.cpp cache model to predict with, for a server started with other settings
    than the defaults (``--kv-unified``, ``--slot-prompt-similarity``, ``--cache-ram 0``); its state is the
    server's at the start (a fresh model: empty slots)."""
    groups = group_sessions(records, config.max_sessions, config.max_turns)
    timeout = httpx.Timeout(config.timeout, connect=30.0)
    # Expire idle connections before servers do (llama.cpp's HTTP server closes them after 5 s).
    limits = httpx.Limits(max_connections=max(1, config.concurrency) * 2 + 4, keepalive_expiry=1.0)
    async with httpx.AsyncClient(
        base_url=config.base_url, timeout=timeout, limits=limits, trust_env=False, transport=transport
    ) as client:
        run = _Run(config, client, on_turn, engine_model)
        await run.prepare()
        run.t0 = time.perf_counter()
        await asyncio.gather(*(_Session(run, group).play() for group in groups))
        await run.finish()
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
