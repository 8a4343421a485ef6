"""``agentcache proxy --record DIR``: every pipeline request written as one JSON line, for ``agentcache audit DIR``.

**The line** is the audit's JSONL format (:mod:`agentcache.loaders._jsonl`), one request per line, with more
fields that the loader reads or leaves alone::

    {"recorded_by": "agentcache-proxy/<version>", "session": "<id>", "parent"?: "<id>", "tenant": "<hash>",
     "api": "anthropic.messages", "at": <unix seconds, when the request arrived>, "route": "/v1/messages",
     "upstream": "https://api.anthropic.com/v1/messages", "status": 200, "outcome": "complete",
     "timings": {"first_byte_s": <s>, "total_s": <s>}, "headers"?: {...}, "usage"?: {...}, "response"?: {...},
     "body": {...}, "sent": {...}}

``body`` is the request body as the client sent it (its bytes, byte for byte: what the audit's ``as_sent`` arm
simulates), ``sent`` the body agentcache sent upstream. ``session``/``parent`` are the session the proxy resolved
(:mod:`agentcache.proxy._caller`: a subagent's parent), ``tenant`` the salted hash of the caller's API key (never
the key). ``usage`` is the response's usage as the upstream reported it (for a stream, what the usage tap read off
its events), ``response`` its ``id`` with that usage and the provider's cache diagnostics
(:meth:`~agentcache.model._bodytap.UsageTap.wire`; the generated text is not kept). ``timings``: seconds from the
request sent upstream to the first body byte, and to the last. ``outcome``: how the response ended
(:class:`~agentcache.proxy._forward.StreamOutcome`: ``complete``, ``client_gone``, ``upstream_error``...).

**Sessions across files.** The JSONL loader prefixes a line's session with its file's stem, so that sessions of
unrelated files never merge; a recording rotates through many files, and one session spans them. ``recorded_by``
marks a line as the proxy's: the loader keeps its ``session`` (and reads its ``parent``) as written. The ids are the
proxy's own (a Claude Code session id, ``<session>/<agent id>`` for its subagents: the same ids its transcripts
use); sessions of different tenants with the same explicit id would merge.

**Bounded.** Files are ``agentcache-proxy-<UTC start of the file>-<sequence>.jsonl`` (chronological by name); a
file is closed before a line would take it past ``record_max_mb`` (a single larger line gets a file of its own)
and, after each line, the oldest files of that name in the directory (earlier runs' too; nothing else is ever
touched) are deleted while all of them hold more than ``record_max_total_mb``. The file being written is never
deleted.

**Private.** The directory is created with mode 0700 (an existing one keeps its mode), each file with 0600: the
files hold the users' prompts, unredacted (their own traffic, on their own disk). No header is written but
``anthropic-beta``, ``anthropic-version``, ``openai-beta`` and ``user-agent`` (they change what a request means or
who sent it): never an API key or auth header. Log lines name the directory and counts, never prompt text.

**Off the request path.** A line is queued after the response's last byte (the relay's ``done`` callback) and
written by one writer thread: file writes block, so they never run on the event loop, and one thread keeps the
lines of a file whole and in order and the rotation simple (``anyio.to_thread`` per line would need a lock around
every write and takes slots of the threadpool other work shares). The queue is bounded (4096 lines, 64 MiB of
bodies): when it is full the line is dropped and counted, the request is never held. A write that fails (disk full,
permission denied, the directory gone) loses that line only: it is counted, the partial line is cut off, and the
next line opens a new file (re-creating the directory). Counts: ``agentcache_proxy_record_lines_total{outcome}``
(``written``, ``dropped``, ``failed``, ``skipped``); a warning is logged at the first failure of a run and an info
line when lines are written again (with how many were lost), not one line per request.

**Not recorded** (counted ``skipped``): a request the upstream answered with no 2xx (it wrote no cache, and the
proxy commits no turn for it), and one the proxy could not give a session (its own failure, sent on unchanged). A
request whose upstream never answered, or with a compressed body (relayed untouched), is not seen at all.
"""

from __future__ import annotations

import json
import queue
import threading
import time
from collections.abc import Mapping
from dataclasses import dataclass
from pathlib import Path
from typing import TYPE_CHECKING, Any

import httpx

from .. import __version__
from .._log import get_logger
from ..model._bodytap import UsageTap
from ._forward import StreamOutcome
from ._record_files import RotatingFiles

if TYPE_CHECKING:
    from prometheus_client import Counter

    from ..session import Turn
    from ._config import ProxyConfig

__all__ = ["RECORDED_BY", "Exchange", "Recorder", "encode", "exchange_of"]

log = get_logger("agentcache.proxy")

#: The ``recorded_by`` value of every line this proxy writes.
RECORDED_BY = f"agentcache-proxy/{__version__}"
#: The only request headers written (lower case): none of them carries a credential.
KEPT_HEADERS = ("anthropic-beta", "anthropic-version", "openai-beta", "user-agent")
#: The write queue's bounds: lines, and bytes of bodies.
QUEUE_ITEMS = 4096
QUEUE_BYTES = 64 * 1024 * 1024
#: Seconds :meth:`Recorder.close` waits for the queued lines to be written.
CLOSE_TIMEOUT = 5.0
_MIB = 1024 * 1024


@dataclass(frozen=True, slots=True)
class Exchange:
    """One finished pipeline request as the recorder writes it: ``head``, every field of the line but the bodies
    (JSON-ready, final: nothing mutates it after it is queued); ``body``, the client's bytes; ``sent``, the bytes
    sent upstream."""

    head: dict[str, Any]
    body: bytes
    sent: bytes

    @property
    def size(self) -> int:
        """Bytes of the two bodies (what the queue's byte bound counts)."""
        return len(self.body) + len(self.sent)


def exchange_of(
    turn: Turn | None,
    *,
    api: str,
    route: str,
    headers: Mapping[str, str],
    body: bytes,
    sent: bytes,
    at: float,
    status: int,
    url: httpx.URL,
    started: float,
    outcome: StreamOutcome,
    tap: UsageTap | None,
) -> Exchange | None:
    """The line of one finished pipeline request (see the module docstring), or None when it is not recorded (no
    session, or no 2xx answer). ``at``: unix seconds when it arrived; ``started``: ``perf_counter()`` when it was
    sent upstream; ``url``: where it went (written without query or credentials)."""
    if turn is None or not 200 <= status < 300:
        return None
    sess = turn.session
    head: dict[str, Any] = {"recorded_by": RECORDED_BY, "session": sess.session_id}
    if sess.parent:
        head["parent"] = sess.parent
    first = outcome.first_byte_s
    head.update(
        tenant=sess.tenant,
        api=api,
        at=at,
        route=route,
        upstream=f"{url.scheme}://{url.netloc.decode('ascii', 'replace')}{url.path}",
        status=status,
        outcome=outcome.status,
        timings={
            "first_byte_s": None if first is None else round(first, 6),
            "total_s": round(time.perf_counter() - started, 6),
        },
    )
    kept = {name: headers[name] for name in KEPT_HEADERS if name in headers}
    if kept:
        head["headers"] = kept
    wire = tap.wire() if tap is not None and outcome.usage is not None else None  # a cut stream: no usage
    if wire is not None:
        if isinstance(wire.get("usage"), dict):
            head["usage"] = wire["usage"]
        head["response"] = wire
    return Exchange(head, body, sent)


def json_text(raw: bytes) -> bytes:
    """``raw``, a JSON text the proxy parsed, as UTF-8 JSON on one line: the same bytes, with line breaks as spaces
    (in valid JSON they are only ever whitespace between tokens); a text in another encoding (``json`` also reads
    UTF-16 and UTF-32) re-encoded, a UTF-8 byte order mark dropped."""
    if raw.startswith(b"\xef\xbb\xbf"):
        raw = raw[3:]
    try:
        raw.decode("utf-8")
    except UnicodeDecodeError:
        return json.dumps(json.loads(raw), separators=(",", ":")).encode()
    if b"\n" in raw or b"\r" in raw:
        raw = raw.replace(b"\r", b" ").replace(b"\n", b" ")
    return raw


def encode(ex: Exchange) -> bytes:
    """``ex`` as one JSONL line (ending with a newline); the bodies go last, spliced in as their bytes."""
    head = json.dumps(ex.head, separators=(",", ":"))  # ASCII: an odd id from upstream cannot break the line
    return b"".join((head[:-1].encode(), b',"body":', json_text(ex.body), b',"sent":', json_text(ex.sent), b"}\n"))


class _Burst:
    """A run of failures logs twice: a warning at its first, an info line at the next success (with how many
    lines the run lost). Used by one thread only."""

    def __init__(self, event: str) -> None:
        self.event = event
        self.count = 0

    def failed(self, **fields: Any) -> None:
        self.count += 1
        if self.count == 1:
            log.warning(self.event, **fields)

    def ok(self) -> None:
        if self.count:
            log.info("proxy.record_resumed", after=self.event, lost=self.count)
            self.count = 0


class Recorder:
    """The ``--record`` writer (see the module docstring): :meth:`submit` queues a line without blocking, one
    thread writes them to ``files``. ``counter``: ``agentcache_proxy_record_lines_total`` (label ``outcome``)."""

    def __init__(
        self, files: RotatingFiles, counter: Counter, *, queue_items: int = QUEUE_ITEMS, queue_bytes: int = QUEUE_BYTES
    ) -> None:
        self.files = files
        self._counter = counter
        self.queue_items = queue_items
        self.queue_bytes = queue_bytes
        self._queue: queue.SimpleQueue[Exchange | None] = queue.SimpleQueue()
        self._lock = threading.Lock()  # guards the queue's counts and the thread handle
        self._items = 0
        self._bytes = 0
        self._thread: threading.Thread | None = None
        self._drops = _Burst("proxy.record_queue_full")  # the event loop's
        self._failures = _Burst("proxy.record_failed")  # the writer thread's

    @classmethod
    def from_config(cls, config: ProxyConfig, counter: Counter) -> Recorder | None:
        """The recorder ``config.record_dir`` asks for, or None."""
        if config.record_dir is None:
            return None
        files = RotatingFiles(
            Path(config.record_dir), int(config.record_max_mb * _MIB), int(config.record_max_total_mb * _MIB)
        )
        return cls(files, counter)

    def start(self) -> None:
        """Start the writer thread (a daemon: a disk that hangs cannot hold the process at exit)."""
        with self._lock:
            if self._thread is not None:
                return
            self._thread = threading.Thread(target=self._run, name="agentcache-recorder", daemon=True)
            self._thread.start()
        f = self.files
        log.info("proxy.recording", directory=str(f.directory), max_file_bytes=f.max_file, max_total_bytes=f.max_total)

    def submit(self, ex: Exchange | None) -> None:
        """Queue ``ex`` for writing (None: a request not recorded, counted ``skipped``). Never blocks, never
        raises for a full queue: the line is dropped and counted."""
        if ex is None:
            self._counter.labels("skipped").inc()
            return
        size = ex.size
        with self._lock:
            room = self._thread is not None and self._items < self.queue_items
            room = room and (not self._items or self._bytes + size <= self.queue_bytes)  # one line always fits
            if room:
                self._items += 1
                self._bytes += size
        if not room:
            self._counter.labels("dropped").inc()
            self._drops.failed(queued=self._items, queued_bytes=self._bytes)
            return
        self._drops.ok()
        self._queue.put(ex)

    def close(self, timeout: float = CLOSE_TIMEOUT) -> None:
        """Write the queued lines (for at most ``timeout`` seconds), stop the writer, close the file. Blocks: the
        proxy calls it from a worker thread at shutdown."""
        with self._lock:
            thread, self._thread = self._thread, None
        if thread is None:
            return
        self._queue.put(None)
        thread.join(timeout)
        if thread.is_alive():
            log.warning("proxy.record_unfinished", queued=self._items)

    def _run(self) -> None:
        while (ex := self._queue.get()) is not None:
            try:
                self._write(ex)
            finally:
                with self._lock:
                    self._items -= 1
                    self._bytes -= ex.size
        self.files.close()

    def _write(self, ex: Exchange) -> None:
        try:
            self.files.write(encode(ex))
        except Exception as exc:  # the disk's failure (or our own): this line is lost, never the proxy
            self._counter.labels("failed").inc()
            self.files.close()
            detail = exc.strerror if isinstance(exc, OSError) else None  # never a message that could quote a body
            self._failures.failed(directory=str(self.files.directory), error=type(exc).__name__, detail=detail)
            return
        self._counter.labels("written").inc()
        self._failures.ok()
