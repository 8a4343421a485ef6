"""Usage read from a response body's bytes as they stream past: the framing (decompression, SSE lines, the JSON
body) in front of a :class:`~agentcache.model._usage_stream.UsageAccumulator`. Shared by the proxy's relay
(:mod:`agentcache.proxy._forward`) and ``wrap()``'s raw and streaming responses (:mod:`agentcache._wrap_raw`);
standard library only.
"""

from __future__ import annotations

import json
import zlib
from typing import Any

from ._usage import CacheUsage
from ._usage_stream import UsageAccumulator

__all__ = ["TAP_LIMIT", "UsageTap"]

#: The largest JSON response body (or SSE line) the tap holds to read usage from.
TAP_LIMIT = 8 * 1024 * 1024
_USAGE_MARKERS = UsageAccumulator.SSE_USAGE_MARKERS


class UsageTap:
    """Reads usage from a response body as it streams past, holding at most one SSE line (or a JSON body up
    to :data:`TAP_LIMIT`). Only the framing lives here: decompression (gzip, deflate), SSE line splitting and
    the JSON parsing of the ``data:`` lines that can carry usage (or of the whole body); what the events mean
    is a :class:`~agentcache.model._usage_stream.UsageAccumulator`'s. Never raises: anything unreadable just yields
    no usage."""

    def __init__(self, api: str, content_type: str, content_encoding: str = "") -> None:
        self.api = api
        self.sse = "text/event-stream" in content_type.lower()
        enc = content_encoding.strip().lower()
        self._decoder: Any = None
        self._ok = True
        if enc == "gzip":
            self._decoder = zlib.decompressobj(16 + zlib.MAX_WBITS)
        elif enc == "deflate":
            self._decoder = zlib.decompressobj()
        elif enc not in ("", "identity"):
            self._ok = False
        self._buf = bytearray()
        self._acc = UsageAccumulator(api)

    @property
    def ended(self) -> bool:
        """The api's terminal event went past (Anthropic ``message_stop``, Chat ``[DONE]``, Responses
        ``response.completed`` / ``incomplete`` / ``failed``: ``TERMINAL_EVENTS``)."""
        return self._acc.ended

    def feed(self, chunk: bytes) -> None:
        """Take one raw (possibly compressed) chunk."""
        if not self._ok or not chunk:
            return
        try:
            data = self._decoder.decompress(chunk) if self._decoder is not None else chunk
            if self.sse:
                self._feed_sse(data)
            else:
                self._buf += data
                if len(self._buf) > TAP_LIMIT:
                    self._ok = False
                    self._buf.clear()
        except Exception:  # unreadable: no usage, but the bytes still reach the client
            self._ok = False

    def _feed_sse(self, data: bytes) -> None:
        self._buf += data
        end = self._buf.rfind(b"\n")
        if end < 0:
            if len(self._buf) > TAP_LIMIT:
                self._buf.clear()
            return
        lines = bytes(self._buf[:end]).split(b"\n")
        del self._buf[: end + 1]
        acc = self._acc
        ends = acc.sse_end_markers
        for line in lines:
            if not line.startswith(b"data:"):
                continue
            # Substring tests only (plain loops: cheaper than any()): the many delta lines that carry no usage
            # are never parsed.
            for marker in ends:
                if marker in line:
                    acc.end()
                    break
            for marker in _USAGE_MARKERS:
                if marker in line:
                    break
            else:
                continue
            try:
                obj = json.loads(line[5:])
            except ValueError:
                continue
            if isinstance(obj, dict):
                acc.add_event(obj)

    def result(self) -> CacheUsage | None:
        """The usage read so far (call after the last chunk), or None."""
        if not self._ok:
            return None
        if self.sse:
            return self._acc.usage
        try:
            if self._decoder is not None:
                self._buf += self._decoder.flush()
            doc = json.loads(bytes(self._buf)) if self._buf else None
        except Exception:
            return None
        if not isinstance(doc, dict):
            return None
        self._acc.add_body(doc)
        return self._acc.usage

    def wire(self) -> dict[str, Any] | None:
        """The response's usage-bearing fields as the wire had them (see
        :meth:`~agentcache.model._usage_stream.UsageAccumulator.wire`), once :meth:`result` has read the last chunk;
        None when nothing could be read."""
        return self._acc.wire() if self._ok else None
