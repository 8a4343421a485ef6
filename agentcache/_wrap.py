"""``agentcache.wrap(client, session=...)``: the two-line way in for agent loops.

``wrap`` returns a thin proxy of an ``anthropic.Anthropic``/``AsyncAnthropic`` or ``openai.OpenAI``/
``AsyncOpenAI`` client (Bedrock/Vertex/Azure variants included). It intercepts exactly:

* Anthropic ``messages.create`` (``stream=True`` too) and the ``messages.stream(...)`` helper;
* OpenAI ``chat.completions.create`` and ``responses.create`` (``stream=True`` too);
* the same ``create`` methods reached through the SDK's ``with_raw_response`` and ``with_streaming_response``
  views, on the resource (``client.messages.with_raw_response.create``) or the client
  (``client.with_raw_response.responses.create``): the view is the SDK's own class built around the
  intercepted resource, and the SDK's own ``APIResponse``/``LegacyAPIResponse`` (or streaming context
  manager) comes back, usage read from the body the caller reads (:mod:`agentcache._wrap_raw`). LangChain's
  ChatAnthropic and ChatOpenAI call these;
* the client's low-level ``post`` to those APIs' paths (``/v1/messages``, ``/chat/completions``, ``/responses``)
  with a JSON ``body``: litellm (1.110) sends its OpenAI requests this way.

For each call: the SDK keyword arguments *are* the wire body, minus the SDK-only ones (``extra_headers``,
``extra_query``, ``extra_body``, ``timeout``, and helper/header arguments such as ``output_format``,
``workspace_id``) which are kept aside. Pydantic objects in the body (e.g. an assistant turn's
``response.content``) are dumped exactly as the SDK dumps them, and ``NOT_GIVEN``/``omit`` removed. The
body goes through :meth:`Session.begin` (repairs, routing key, breakpoints, sink annotations); the real
SDK method is called with the prepared fields (a field the SDK method does not declare goes in
``extra_body``) plus the SDK-only arguments, and its own return value comes back untouched (a
stream is the SDK's own object, tapped for usage: :mod:`agentcache._wrap_stream`). Success commits the
turn and records usage and ``session.last_report``; an SDK exception records a retry (``attempt`` + 1,
same generation) and is re-raised unchanged. The SDK's own retries (``max_retries``) happen inside one
call and are not attempts. An async client's ``create`` is coalesced with its siblings (setting ``coalesce``,
:mod:`agentcache.session._coalesce`): while another request of the manager writes the same new prefix, it waits
for that request's first byte (at most ``coalesce_timeout`` seconds) before it is sent.

Passed through unchanged: other resources and methods (``beta``, ``parse``, ``count_tokens``, the raw
views' other methods...), positional arguments, unknown keyword arguments (the SDK
raises its own ``TypeError``), values that are not JSON (files, bytes), and requests on a session closed
explicitly. Fail open: if agentcache itself fails, the original method gets the original arguments and
a warning is logged (exception type only; details at debug level).

The target whose cache rules apply is resolved once per client and API by
:func:`agentcache.targets.resolve_target`, as in every door: the ``target`` setting, else ``provider=`` (or the
session manager's), else an engine the base URL answers as (llama.cpp, SGLang, vLLM: asked once per origin,
never for a provider host), else the provider of the SDK's API. So an Anthropic client pointed at a gateway
(LiteLLM, OpenRouter, a company gateway) keeps Anthropic's rules, and a local engine gets repairs only.
"""

from __future__ import annotations

import functools
import inspect
from collections.abc import Callable, Mapping
from dataclasses import dataclass
from typing import Any, TypeVar, cast

from ._exceptions import ConfigError
from ._log import get_logger
from ._wrap_kwargs import Passthrough, sdk_of, send_kwargs, split_kwargs, wants_raw, wire_value
from ._wrap_raw import tap_raw_response
from ._wrap_stream import StreamManagerProxy, is_async_callable, tap_stream
from .adapters import WIRES, Wire
from .model._usage import normalize_usage
from .session import Session, Sessions, Turn
from .session._coalesce import Ticket
from .session._pipeline import with_headers
from .targets import Target, probe, resolve_target

__all__ = ["WrappedClient", "default_sessions", "reset_default_sessions", "wrap"]

C = TypeVar("C")
log = get_logger("agentcache.wrap")

#: The SDK views whose methods return the raw HTTP response (``XWithRawResponse(resource)`` in both SDKs).
_RAW_VIEWS = frozenset({"with_raw_response", "with_streaming_response"})
#: The low-level ``post`` paths that are an intercepted API, per SDK (litellm posts to them directly).
_POST_APIS: dict[str, dict[str, str]] = {}
#: The SDK resources that are an intercepted API, per ``(SDK, attribute)``: the methods intercepted there (name →
#: wire API) and the sub-resources holding them (``chat.completions``), as :class:`_Resource` takes them.
_RESOURCES: dict[tuple[str, str], tuple[dict[str, str], dict[str, dict[str, str]]]] = {}


def _learn_sdk(wire: Wire) -> None:
    """Enter ``wire``'s SDK resource, methods and ``post`` path in :data:`_POST_APIS` and :data:`_RESOURCES`."""
    _POST_APIS.setdefault(wire.sdk, {})[wire.sdk_path] = wire.api
    top, *sub = wire.sdk_resource
    methods = dict.fromkeys(wire.sdk_methods, wire.api)
    _RESOURCES[wire.sdk, top] = ({}, {sub[0]: methods}) if sub else (methods, {})


for _wire in WIRES:
    _learn_sdk(_wire)


def _prepare_failed(api: str, exc: Exception) -> None:
    """Log why a request goes out unchanged: a :class:`Passthrough` it is not for agentcache to plan, anything else
    a failure of ours (fail open)."""
    if isinstance(exc, Passthrough):
        log.debug("wrap.passthrough", api=api, reason=str(exc))
        return
    log.warning("wrap.failed_open", stage="prepare", api=api, error=type(exc).__name__)
    log.debug("wrap.failed_open_detail", api=api, detail=repr(exc), exc_info=True)


@dataclass(slots=True)
class _Plan:
    turn: Turn
    args: tuple[Any, ...]
    kwargs: dict[str, Any]
    stream: bool
    raw: bool


def _raw_view(view: Any, owner: Any) -> Any:
    """The SDK's own raw/streaming ``view`` class rebuilt around ``owner`` (our proxy), so its methods call
    the intercepted ones; the SDK's view itself if that fails."""
    try:
        return type(view)(owner)
    except Exception as exc:  # fail open
        log.warning("wrap.failed_open", stage="raw_view", error=type(exc).__name__)
        return view


class WrappedClient:
    """The proxy :func:`wrap` returns: the SDK client with ``messages``, ``chat.completions`` and
    ``responses`` intercepted (see the module docstring); every other attribute is the client's.
    ``agentcache_session`` is the session; ``agentcache_unwrap()`` the original client."""

    def __init__(self, client: Any, session: Session, sdk: str, provider: str | None) -> None:
        self._ac_client, self._ac_session, self._ac_sdk = client, session, sdk
        base = getattr(client, "base_url", None)
        self._ac_base_url = str(base) if base is not None else None
        self._ac_provider = provider
        self._ac_targets: dict[str, Target] = {}

    def _ac_target(self, api: str) -> Target:
        """The target for this client's requests of ``api`` (resolved once; see the module docstring)."""
        target = self._ac_targets.get(api)
        if target is None:
            manager = self._ac_session.manager
            settings = manager.settings
            detected = None
            declared = self._ac_provider or manager.provider
            if settings.target == "auto" and declared is None and settings.detect_engines and self._ac_base_url:
                detected = probe(self._ac_base_url).engine
            target = resolve_target(
                api, setting=settings.target, declared=declared, detected=detected, model=manager.model
            )
            self._ac_targets[api] = target
        return target

    @property
    def agentcache_session(self) -> Session:
        """The session every intercepted call belongs to."""
        return self._ac_session

    def agentcache_unwrap(self) -> Any:
        """The original SDK client."""
        return self._ac_client

    def __getattr__(self, name: str) -> Any:
        attr = getattr(self._ac_client, name)
        resource = _RESOURCES.get((self._ac_sdk, name))
        if resource is not None:
            return _Resource(attr, self, *resource)
        if name in ("with_options", "copy"):
            return lambda *a, **kw: WrappedClient(attr(*a, **kw), self._ac_session, self._ac_sdk, self._ac_provider)
        if name in _RAW_VIEWS:
            return _raw_view(attr, self)
        if name == "post" and callable(attr):
            return self._intercept(attr, self._plan_post, "post")
        return attr

    def __setattr__(self, name: str, value: Any) -> None:
        # The client's own settings (``max_retries``, ``api_key``... litellm sets them) go to the client.
        if name.startswith("_ac_"):
            object.__setattr__(self, name, value)
        else:
            setattr(self._ac_client, name, value)

    def __enter__(self) -> WrappedClient:
        self._ac_client.__enter__()
        return self

    def __exit__(self, *exc: Any) -> Any:
        return self._ac_client.__exit__(*exc)

    async def __aenter__(self) -> WrappedClient:
        await self._ac_client.__aenter__()
        return self

    async def __aexit__(self, *exc: Any) -> Any:
        return await self._ac_client.__aexit__(*exc)

    def __repr__(self) -> str:
        return f"agentcache.wrap({self._ac_client!r}, session={self._ac_session.session_id!r})"

    # ---- one intercepted call ---------------------------------------------------------------

    def _plan(self, api: str, method: Any, args: tuple[Any, ...], kwargs: Mapping[str, Any]) -> _Plan | None:
        """Prepare an SDK method call (keyword arguments only); None means send it unchanged (never raises)."""
        if args:
            return None
        try:
            body, side = split_kwargs(method, kwargs)
            turn = self._ac_session.begin(api, body, base_url=self._ac_base_url, target=self._ac_target(api))
            raw = wants_raw(side.get("extra_headers"))
            out = send_kwargs(method, turn.body, side)
            if turn.prepared.headers:  # planned headers (provider diagnostics' beta header)
                out["extra_headers"] = with_headers(side.get("extra_headers"), turn.prepared.headers)
            return _Plan(turn, (), out, bool(body.get("stream")), raw)
        except Exception as exc:
            _prepare_failed(api, exc)
        return None

    def _plan_post(self, method: Any, args: tuple[Any, ...], kwargs: Mapping[str, Any]) -> _Plan | None:
        """Prepare a low-level ``post(path, body=..., options=...)`` to an intercepted API's path; None means
        send it unchanged (another path, files, a body that is not JSON; never raises)."""
        path = args[0] if len(args) == 1 else None
        api = _POST_APIS[self._ac_sdk].get(path) if isinstance(path, str) else None
        body = kwargs.get("body")
        if api is None or not isinstance(body, Mapping) or kwargs.get("files") or kwargs.get("content"):
            return None
        try:
            wire = wire_value(body)
            turn = self._ac_session.begin(api, wire, base_url=self._ac_base_url, target=self._ac_target(api))
            options = kwargs.get("options")
            raw = wants_raw(options.get("headers") if isinstance(options, Mapping) else None)
            stream = bool(kwargs.get("stream")) or bool(wire.get("stream"))
            out = {**kwargs, "body": turn.body}
            if turn.prepared.headers and isinstance(options, Mapping):  # planned headers, as above
                out["options"] = {**options, "headers": with_headers(options.get("headers"), turn.prepared.headers)}
            return _Plan(turn, args, out, stream, raw)
        except Exception as exc:
            _prepare_failed(api, exc)
        return None

    def _finish(self, plan: _Plan, name: str, result: Any, ticket: Ticket | None = None) -> Any:
        """Complete the turn for an SDK ``result`` and return the result (never raises). ``ticket``: the request's
        coalescing ticket: its first byte is the stream's first event, else the SDK's return."""
        try:
            if name == "stream":
                return StreamManagerProxy(result, plan.turn)
            if plan.stream and not plan.raw:
                return tap_stream(result, plan.turn, ticket)
            if ticket is not None:
                ticket.first_byte()
            if plan.raw:
                return tap_raw_response(result, plan.turn)
            plan.turn.succeed(normalize_usage(result, plan.turn.api))
        except Exception as exc:  # fail open
            log.warning("wrap.failed_open", stage="response", api=plan.turn.api, error=type(exc).__name__)
        finally:
            if ticket is not None and not (plan.stream and not plan.raw):
                ticket.release()
        return result

    def _intercept(
        self, method: Any, planner: Callable[[Any, tuple[Any, ...], Mapping[str, Any]], _Plan | None], name: str
    ) -> Callable[..., Any]:
        """``method`` with each call prepared by ``planner`` (``(method, args, kwargs) -> plan or None``)."""

        def call(*args: Any, **kwargs: Any) -> Any:
            plan = planner(method, args, kwargs)
            if plan is None:
                return method(*args, **kwargs)
            try:
                result = method(*plan.args, **plan.kwargs)
            except Exception as exc:
                plan.turn.fail(exc)
                raise
            if name != "stream" and inspect.isawaitable(result):  # an async method behind a sync decorator
                return self._settle(plan, name, result)
            return self._finish(plan, name, result)

        if not is_async_callable(method):
            return call

        async def acall(*args: Any, **kwargs: Any) -> Any:
            plan = planner(method, args, kwargs)
            if plan is None:
                return await method(*args, **kwargs)
            ticket = self._ac_claim(plan.turn)
            try:
                if ticket is not None and ticket.held:  # a sibling is writing this prefix: wait for its first byte
                    await ticket.wait()
                result = await method(*plan.args, **plan.kwargs)
            except BaseException as exc:
                if ticket is not None:
                    ticket.release()
                if isinstance(exc, Exception):
                    plan.turn.fail(exc)
                raise
            return self._finish(plan, name, result, ticket)

        return acall

    def _ac_claim(self, turn: Turn) -> Ticket | None:
        """The coalescing ticket of ``turn`` (:mod:`agentcache.session._coalesce`), or None; never raises."""
        try:
            return self._ac_session.manager.claim(turn)
        except Exception as exc:  # fail open
            log.warning("wrap.failed_open", stage="coalesce", error=type(exc).__name__)
            return None

    async def _settle(self, plan: _Plan, name: str, pending: Any) -> Any:
        try:
            result = await pending
        except Exception as exc:
            plan.turn.fail(exc)
            raise
        return self._finish(plan, name, result)


class _Resource:
    """A proxy of one SDK resource: ``methods`` (name → wire API) intercepted, ``subs`` (name → that
    resource's methods) proxied one level down, every other attribute the resource's own."""

    def __init__(
        self,
        target: Any,
        owner: WrappedClient,
        methods: Mapping[str, str],
        subs: Mapping[str, Mapping[str, str]] | None = None,
    ) -> None:
        self._target, self._owner, self._methods, self._subs = target, owner, methods, subs or {}

    def __getattr__(self, name: str) -> Any:
        attr = getattr(self._target, name)
        if name in self._subs:
            return _Resource(attr, self._owner, self._subs[name])
        if name in _RAW_VIEWS:
            return _raw_view(attr, self)
        api = self._methods.get(name)
        if api is None or not callable(attr):
            return attr
        return self._owner._intercept(attr, functools.partial(self._owner._plan, api), name)

    def __repr__(self) -> str:
        return f"agentcache proxy of {self._target!r}"


def wrap(
    client: C,
    session: Session | None = None,
    *,
    sessions: Sessions | None = None,
    provider: str | None = None,
) -> C:
    """Wrap an Anthropic or OpenAI SDK client (sync or async) so its requests keep their cached prefix.

    ``session``: the :class:`Session` the calls belong to; default a new session of ``sessions`` (or of
    the process-wide manager, :func:`default_sessions`). ``provider``: the target to declare (``anthropic``,
    ``openai``, ``engine`` or an engine name such as ``llama.cpp``) instead of resolving it (module
    docstring). Returns a proxy that behaves as ``client`` (typed as it; ``isinstance`` checks see the proxy
    class). Wrapping a wrapped client wraps its original. Raises ConfigError for an object that is not an
    Anthropic or OpenAI client.
    """
    inner: Any = client.agentcache_unwrap() if isinstance(client, WrappedClient) else client
    sdk = sdk_of(inner)
    if sdk is None:
        raise ConfigError(f"cannot wrap {type(inner).__name__}: expected an anthropic or openai SDK client")
    if session is None:
        session = (sessions or default_sessions()).session()
    return cast(C, WrappedClient(inner, session, sdk, provider))


_default: Sessions | None = None


def default_sessions() -> Sessions:
    """The process-wide manager that ``wrap(client)`` without a session uses (created on first use)."""
    global _default
    if _default is None:
        _default = Sessions()
    return _default


def reset_default_sessions() -> None:
    """Close and forget the process-wide manager (tests)."""
    global _default
    old, _default = _default, None
    if old is not None:
        old.close_all()
