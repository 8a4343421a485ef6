"""A prompt as an engine's cache sees it: token ids, their common prefix with another prompt, and their pages.

Shared by the engine models: :func:`common_prefix` is the reuse test of llama.cpp's slots
(:mod:`._llama`) and of two prompts; :meth:`Prompt.page_keys` is the page rounding of SGLang's radix tree
(:mod:`._radix`): only whole pages are cached and matched.

A :class:`Prompt` is kept compact: either runs of synthetic ids (one run per canonical block, as the planner's
default renderer makes them) or real ids from an engine's tokenizer. Two prompts share a page key exactly when
they share those token ids.
"""

from __future__ import annotations

from array import array
from collections.abc import Hashable, Sequence
from dataclasses import dataclass

from ..model._build import shared_run

__all__ = ["Prompt", "common_prefix", "ids_prompt", "shared_prefix"]


def common_prefix(a: Sequence[int], b: Sequence[int]) -> int:
    """Length of the longest common prefix of two token-id sequences (``server_tokens::get_common_prefix``)."""
    return shared_run(a, b)


@dataclass(frozen=True, slots=True)
class Prompt:
    """One request's token ids. ``runs``: ``(first id, count)`` pairs (ids ``first .. first+count-1``), or
    ``ids``: explicit ids (an ``array('q')``). Exactly one of the two is set."""

    runs: tuple[tuple[int, int], ...] = ()
    ids: array[int] | None = None

    @property
    def tokens(self) -> int:
        """Number of tokens."""
        return len(self.ids) if self.ids is not None else sum(n for _, n in self.runs)

    def page_keys(self, page_size: int) -> list[Hashable]:
        """One hashable key per whole page of ``page_size`` tokens (a trailing partial page has none)."""
        if self.ids is not None:
            ids = self.ids
            return [ids[i : i + page_size].tobytes() for i in range(0, len(ids) - page_size + 1, page_size)]
        keys: list[Hashable] = []
        piece: list[tuple[int, int]] = []
        room = page_size
        for first, count in self.runs:
            at = 0
            while at < count:
                take = min(room, count - at)
                piece.append((first + at, take))
                at += take
                room -= take
                if room == 0:
                    keys.append(piece[0][0] if page_size == 1 else tuple(piece))
                    piece, room = [], page_size
        return keys


def shared_prefix(a: Prompt, b: Prompt) -> int:
    """Tokens at the start of ``a`` and ``b`` that are the same ids."""
    if a.ids is not None and b.ids is not None:
        return common_prefix(a.ids, b.ids)
    n = 0
    for (fa, ca), (fb, cb) in zip(a.runs, b.runs, strict=False):
        if fa != fb:
            break
        n += min(ca, cb)
        if ca != cb:
            break
    return n


def ids_prompt(ids: Sequence[int]) -> Prompt:
    """A prompt of explicit token ``ids`` (tests, callers with their own tokenizer)."""
    return Prompt(ids=array("q", ids))
