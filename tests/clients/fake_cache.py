"""Provider-like prompt-cache accounting for the scripted fake upstream, independent of agentcache's simulators.

* :class:`AnthropicCache`: Anthropic's rules as documented (platform.claude.com/docs/en/build-with-claude/
  prompt-caching): blocks in prefix order tools → system → messages; an entry is written at each ``cache_control``
  breakpoint; a breakpoint reads the longest entry ending at or before it within 20 blocks; entries live 5m or 1h
  (the breakpoint's ``ttl``), refreshed on a hit; usage reports ``input_tokens`` (uncached remainder),
  ``cache_read_input_tokens``, ``cache_creation_input_tokens`` and its ``ephemeral_5m``/``ephemeral_1h`` split.
* :class:`OpenAICache`: OpenAI's automatic caching (developers.openai.com/api/docs/guides/prompt-caching): prompts
  of 1024 tokens or more; the longest prefix seen before, in 128-token steps; entries forgotten after
  ``ttl`` seconds without use.

Tokens are pseudo-tokens (bytes of the block's JSON / 4, at least 1). Time is a virtual clock (:class:`Clock`):
real time plus an offset a test advances, so TTLs expire without waiting.
"""

from __future__ import annotations

import hashlib
import json
import threading
import time
from dataclasses import dataclass, field
from typing import Any

LOOKBACK = 20
TTL = {"5m": 300.0, "1h": 3600.0}


@dataclass
class Clock:
    """Real time plus ``offset`` seconds (advanced by tests to make entries expire)."""

    offset: float = 0.0

    def now(self) -> float:
        return time.time() + self.offset

    def advance(self, seconds: float) -> None:
        self.offset += seconds


def _tokens(value: Any) -> int:
    return max(1, len(json.dumps(value, sort_keys=True)) // 4)


def _strip(value: Any) -> Any:
    if isinstance(value, dict):
        return {k: _strip(v) for k, v in value.items() if k != "cache_control"}
    if isinstance(value, list):
        return [_strip(v) for v in value]
    return value


def anthropic_blocks(body: dict[str, Any]) -> list[tuple[Any, dict[str, Any] | None]]:
    """``(block without markers, its cache_control or None)`` in prefix order: each tool, each system block, each
    message content block (a string content is one block)."""
    out: list[tuple[Any, dict[str, Any] | None]] = []
    for tool in body.get("tools") or []:
        out.append((_strip(tool), tool.get("cache_control") if isinstance(tool, dict) else None))
    system = body.get("system")
    if isinstance(system, str):
        out.append((system, None))
    for block in system if isinstance(system, list) else []:
        out.append((_strip(block), block.get("cache_control") if isinstance(block, dict) else None))
    for msg in body.get("messages") or []:
        content = msg.get("content")
        parts = content if isinstance(content, list) else [content]
        for part in parts:
            marker = part.get("cache_control") if isinstance(part, dict) else None
            out.append(({"role": msg.get("role"), "part": _strip(part)}, marker))
    return out


@dataclass
class AnthropicCache:
    """See the module docstring. ``entries``: prefix digest → expiry (virtual seconds) and TTL."""

    clock: Clock = field(default_factory=Clock)
    entries: dict[str, tuple[float, str]] = field(default_factory=dict)
    lock: threading.Lock = field(default_factory=threading.Lock)

    def usage(self, body: dict[str, Any]) -> dict[str, Any]:
        """The usage Anthropic would report for ``body`` (also writing and refreshing entries)."""
        blocks = anthropic_blocks(body)
        if isinstance(body.get("cache_control"), dict) and blocks:  # top-level automatic caching: the last block
            blocks[-1] = (blocks[-1][0], body["cache_control"])
        digests, sizes, h = [], [], hashlib.sha256()
        for block, _ in blocks:
            h.update(json.dumps(block, sort_keys=True).encode())
            digests.append(h.copy().hexdigest())
            sizes.append(_tokens(block))
        marks = [i for i, (_, m) in enumerate(blocks) if isinstance(m, dict)]
        now = self.clock.now()
        with self.lock:
            read_end = self._read(digests, marks, now)
            w5 = w1 = 0
            for i in marks:
                if i < read_end:
                    continue
                ttl = str(blocks[i][1].get("ttl") or "5m")  # type: ignore[union-attr]
                self.entries[digests[i]] = (now + TTL.get(ttl, 300.0), ttl)
            if marks and marks[-1] >= read_end:
                # Tokens from the read point to the last breakpoint are written, each span at its breakpoint's TTL.
                start = read_end
                for i in (m for m in marks if m >= read_end):
                    span = sum(sizes[start : i + 1])
                    if str(blocks[i][1].get("ttl") or "5m") == "1h":  # type: ignore[union-attr]
                        w1 += span
                    else:
                        w5 += span
                    start = i + 1
        read = sum(sizes[:read_end])
        total = sum(sizes)
        return {
            "input_tokens": total - read - w5 - w1,
            "cache_creation_input_tokens": w5 + w1,
            "cache_read_input_tokens": read,
            "cache_creation": {"ephemeral_5m_input_tokens": w5, "ephemeral_1h_input_tokens": w1},
            "output_tokens": 8,
        }

    def _read(self, digests: list[str], marks: list[int], now: float) -> int:
        """Blocks read from the cache (an index past the last block read), refreshing the entry read."""
        for m in reversed(marks):
            for j in range(m, max(-1, m - LOOKBACK), -1):
                entry = self.entries.get(digests[j])
                if entry is not None and entry[0] > now:
                    self.entries[digests[j]] = (now + TTL[entry[1]], entry[1])
                    return j + 1
        return 0


@dataclass
class OpenAICache:
    """See the module docstring. ``seen``: prefix digest → last use (virtual seconds)."""

    clock: Clock = field(default_factory=Clock)
    ttl: float = 600.0
    seen: dict[str, float] = field(default_factory=dict)
    lock: threading.Lock = field(default_factory=threading.Lock)

    def account(self, units: list[Any]) -> tuple[int, int]:
        """``(cached, total)`` tokens of a prompt made of ``units`` (instructions, tools, each input item)."""
        now = self.clock.now()
        h = hashlib.sha256()
        total = longest = 0
        with self.lock:
            for unit in units:
                h.update(json.dumps(_strip(unit), sort_keys=True).encode())
                total += _tokens(unit)
                key = h.hexdigest()
                last = self.seen.get(key)
                if last is not None and now - last <= self.ttl:
                    longest = total
                self.seen[key] = now
        cached = (longest // 128) * 128 if total >= 1024 else 0
        return cached, total
