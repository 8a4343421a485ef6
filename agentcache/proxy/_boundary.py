"""The proxy's boundary: what every request goes through before a route sees it.

* **One path.** The request path is normalised once, as the upstream will read it, before anything decides on it:
  dot segments are removed (RFC 3986 §5.2.4, with ``%2E`` counted as ``.``: percent-encoded unreserved characters
  are those characters, §6.2.2.2), so ``/v1/../agentcache/v1/report`` is routed, and forwarded, as
  ``/agentcache/v1/report``: a request reaches the upstream under the path that was checked, never another (the HTTP
  client would remove the dot segments after the check). The routes and :meth:`ProxyState.url
  <agentcache.proxy._state.ProxyState.url>` read the normalised ``path`` and ``raw_path``.
* **agentcache's namespace, however it is spelt.** :func:`own_path` decides whether a path is agentcache's own as
  a lenient upstream might read it: letters in any case, ``\\`` as ``/``, repeated slashes as one, control
  characters (``%00``) dropped. Such a path is served only when it is exactly an endpoint's; any other spelling
  (``//agentcache/...``, ``/agentcache%00/...``, ``/METRICS``) is answered 404 by the namespace, never relayed with
  the caller's credentials.
* **A body read deadline.** Waiting for the next chunk of a request body takes at most ``body_timeout`` seconds
  (:class:`BodyTimeout` is raised in the route, which answers 408): a trickling client cannot hold a request, and
  the connection under it, for ever. Once the body is complete, or the response started, ``receive`` waits as long
  as it takes (for a disconnect while the response streams for minutes).
* **A date.** A response without a ``date`` header gets one (:class:`Cycle`).

The proxy's entry (:class:`~agentcache.proxy._entry.ProxyApp`) applies these to every HTTP request, in one plain
ASGI callable: :func:`normalised` and one :class:`Cycle` per request.
"""

from __future__ import annotations

import asyncio
import re
import time
from email.utils import formatdate
from typing import Any
from urllib.parse import unquote

from starlette.types import Message, Receive, Scope, Send

__all__ = ["BodyTimeout", "Cycle", "clean_path", "normalised", "own_path"]

_DOT = {b".", b"%2e", b"%2E"}
_DOTDOT = {a + b for a in _DOT for b in _DOT}


class BodyTimeout(Exception):
    """The client sent no chunk of its request body for ``body_timeout`` seconds."""


def clean_path(raw: bytes) -> bytes:
    """``raw`` (a request path, percent-encoded as sent) without dot segments (see the module docstring); other
    bytes are kept as sent. A path not starting with ``/`` (``*``) is returned as it is."""
    if not raw.startswith(b"/"):
        return raw
    segments = raw[1:].split(b"/")
    out: list[bytes] = []
    for i, seg in enumerate(segments):
        last = i == len(segments) - 1
        if seg in _DOT or seg in _DOTDOT:
            if seg in _DOTDOT and out:
                out.pop()
            if last:
                out.append(b"")  # "/a/." and "/a/b/.." end in "/a/"
        else:
            out.append(seg)
    return b"/" + b"/".join(out)


_CONTROL = re.compile(r"[\x00-\x1f\x7f]")
_SLASHES = re.compile(r"/+")


#: What a lenient reading could change in a path: without any of these, folding it is lowering its case.
_FOLDABLE = re.compile(r"[%\\\x00-\x1f\x7f]|//|/\.")


def own_path(path: str) -> bool:
    """Whether the (percent-decoded, :func:`clean_path`-normalised) ``path`` is in agentcache's namespace as a
    lenient upstream might read it: ``/agentcache``, ``/agentcache/...`` or ``/metrics``, in any case, with
    backslashes, repeated slashes, control characters or one more level of percent-encoding (see the module
    docstring)."""
    if _FOLDABLE.search(path) is None:
        return _in_namespace(path.lower())  # nothing else a lenient reading changes (most relayed paths)
    folded = path
    for _ in range(3):  # until nothing changes: "%2561" is "%61" is "a"
        before = folded
        folded = _SLASHES.sub("/", _CONTROL.sub("", unquote(folded).replace("\\", "/")).lower())
        folded = clean_path(folded.encode("utf-8", "surrogatepass")).decode("utf-8", "surrogatepass")
        if folded == before:
            break
    return _in_namespace(folded)


def _in_namespace(folded: str) -> bool:
    return folded in ("/agentcache", "/metrics", "/metrics/") or folded.startswith("/agentcache/")


def normalised(scope: Scope) -> Scope:
    """``scope`` with its path normalised once (:func:`clean_path`; a copy when that changes it, ``path`` decoded as
    uvicorn decodes it), so every route and :meth:`ProxyState.url <agentcache.proxy._state.ProxyState.url>` read the
    path that was checked."""
    raw = scope.get("raw_path") or scope["path"].encode("utf-8", "surrogatepass")
    path = clean_path(raw)
    if path == raw:
        return scope
    return {**scope, "raw_path": path, "path": unquote(path.decode("latin-1"))}


_DATE: list[Any] = [0, b""]  # [unix second, its HTTP date]: formatted once a second, not once a response


def _date() -> bytes:
    """The current time as an HTTP ``date`` value (RFC 9110 §5.6.7, IMF-fixdate)."""
    now = int(time.time())
    if _DATE[0] != now:
        _DATE[:] = [now, formatdate(now, usegmt=True).encode()]
    return _DATE[1]  # type: ignore[no-any-return]


class Cycle:
    """One request's ``receive`` and ``send`` as the proxy's routes see them: ``receive`` waits at most
    ``body_timeout`` seconds (None: no bound) for the next chunk of the request body while :attr:`waiting` (until the
    body is complete or the response started: a relayed response may start before the client finished its body,
    and ``receive`` then waits for a disconnect as long as it takes); ``send`` gives a response without a ``date``
    header one (RFC 9110 §6.6.1: the server adds none, so a relayed response keeps exactly the upstream's and the
    proxy's own answers get this one), and records :attr:`started`. Raises :class:`BodyTimeout` from ``receive``.
    One object per request, not one ASGI layer each: the per-request cost of the proxy's floor."""

    __slots__ = ("_receive", "_send", "_timeout", "started", "waiting")

    def __init__(self, receive: Receive, send: Send, body_timeout: float | None) -> None:
        self._receive, self._send, self._timeout = receive, send, body_timeout
        self.started = False
        self.waiting = body_timeout is not None

    async def receive(self) -> Message:
        """The next ASGI message from the server (see the class docstring)."""
        if not self.waiting:
            return await self._receive()
        try:
            async with asyncio.timeout(self._timeout):  # one timer handle; no cancel scope per chunk
                message: Any = await self._receive()
        except TimeoutError:
            raise BodyTimeout(f"no request body bytes for {self._timeout:g} s") from None
        if message["type"] != "http.request" or not message.get("more_body", False):
            self.waiting = False
        return message  # type: ignore[no-any-return]

    async def send(self, message: Message) -> None:
        """Hand ``message`` to the server (see the class docstring)."""
        if message["type"] == "http.response.start":
            self.started, self.waiting = True, False
            headers = message.get("headers") or ()
            if not any(k.lower() == b"date" for k, _ in headers):
                message = {**message, "headers": [*headers, (b"date", _date())]}
        await self._send(message)
