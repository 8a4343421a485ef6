"""Volatile spans: dates, times, UUIDs, hex ids, epoch stamps, temp paths and counters.

Used to tell ``system.volatile`` (only such tokens changed) from ``system.changed``.
"""

from __future__ import annotations

import re
from dataclasses import dataclass

_DAYS = r"(?:Mon|Tues|Wednes|Thurs|Fri|Satur|Sun)day|\b(?:Mon|Tue|Wed|Thu|Fri|Sat|Sun)\b"
_MONTHS = (
    r"\b(?:January|February|March|April|May|June|July|August|September|October|November|December"
    r"|Jan|Feb|Mar|Apr|Jun|Jul|Aug|Sep|Sept|Oct|Nov|Dec)\b"
)
PATTERNS: tuple[tuple[str, re.Pattern[str]], ...] = (
    ("uuid", re.compile(r"\b[0-9a-fA-F]{8}-[0-9a-fA-F]{4}-[0-9a-fA-F]{4}-[0-9a-fA-F]{4}-[0-9a-fA-F]{12}\b")),
    ("datetime", re.compile(r"\b\d{4}-\d{2}-\d{2}[T ]\d{1,2}:\d{2}(?::\d{2}(?:\.\d+)?)?(?:Z|[+-]\d{2}:?\d{2})?")),
    ("date", re.compile(r"\b\d{4}[-/.]\d{1,2}[-/.]\d{1,2}\b|\b\d{1,2}[-/.]\d{1,2}[-/.]\d{2,4}\b")),
    ("time", re.compile(r"\b\d{1,2}:\d{2}(?::\d{2}(?:\.\d+)?)?(?:\s?[AaPp][Mm])?\b")),
    ("weekday", re.compile(_DAYS)),
    ("month", re.compile(_MONTHS)),
    ("epoch", re.compile(r"\b1[5-9]\d{8}(?:\d{3})?(?:\.\d+)?\b")),
    ("hex", re.compile(r"\b(?=[0-9a-fA-F]*\d)(?=[0-9a-fA-F]*[a-fA-F])[0-9a-fA-F]{12,}\b")),
    ("tmp_path", re.compile(r"(?:/tmp|/var/folders|/private/var|C:\\Users\\[^\\]+\\AppData\\Local\\Temp)[^\s'\"]*")),
)
_COUNTER = re.compile(r"\d+")


@dataclass(frozen=True, slots=True)
class VolatileSpan:
    """A volatile region of the new text: ``[start, end)`` character offsets, the kinds found in it,
    and its text."""

    start: int
    end: int
    kinds: tuple[str, ...]
    text: str


def mask(text: str) -> str:
    """``text`` with every volatile match replaced by ``<kind>``."""
    for kind, pat in PATTERNS:
        text = pat.sub(f"<{kind}>", text)
    return text


def volatile_diff(old: str, new: str) -> VolatileSpan | None:
    """The changed span if ``old`` and ``new`` differ only in volatile tokens, else None.

    Equal texts return None too (nothing changed).
    """
    if old == new:
        return None
    kinds: list[str] = []
    if mask(old) != mask(new):
        # Last resort: a bare counter ("turn 7" → "turn 8") is the only difference.
        lo, hi_old, hi_new = _trim(old, new)
        if not (_COUNTER.fullmatch(old[lo:hi_old] or "x") and _COUNTER.fullmatch(new[lo:hi_new] or "x")):
            return None
        kinds.append("counter")
    lo, _, hi = _trim(old, new)
    # Widen to the volatile matches that overlap the changed region of the new text.
    start, end = lo, hi
    for kind, pat in PATTERNS:
        for m in pat.finditer(new):
            if m.start() < max(hi, lo + 1) and m.end() > lo:
                start, end = min(start, m.start()), max(end, m.end())
                if kind not in kinds:
                    kinds.append(kind)
    start = min(start, end)
    return VolatileSpan(start, end, tuple(kinds), new[start:end])


def _trim(old: str, new: str) -> tuple[int, int, int]:
    """Common-prefix length, and the end of the differing region in old and in new."""
    lo = 0
    n = min(len(old), len(new))
    while lo < n and old[lo] == new[lo]:
        lo += 1
    # Back off into a token so "15:00:03" vs "15:00:25" widens to the whole number.
    while lo > 0 and new[lo - 1].isalnum():
        lo -= 1
    s = 0
    while s < n - lo and old[len(old) - 1 - s] == new[len(new) - 1 - s]:
        s += 1
    hi_old, hi_new = len(old) - s, len(new) - s
    while hi_new < len(new) and hi_old < len(old) and new[hi_new].isalnum():
        hi_new += 1
        hi_old += 1
    return lo, hi_old, hi_new
