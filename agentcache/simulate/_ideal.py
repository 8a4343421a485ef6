"""The ``ideal`` arm: every token already sent earlier in the cache scope counts as reused.

Two passes, because the cheapest schedule writes a token only if a later request reads it:
:meth:`IdealSimulator.run` records each request's reuse; :meth:`IdealSimulator.finish` prices them,
charging the cache write (Anthropic 1.25×) to the first request that sent a block that is read later.
No markers, minimum length, TTL or routing apply: this is the bound on reuse for both other arms.
"""

from __future__ import annotations

from dataclasses import dataclass

from ..model._canonical import CanonicalRequest
from ..model._rules import anthropic_rules, normalize_model, openai_rules
from ._base import SeenIndex, SimUsage


@dataclass(slots=True)
class _Block:
    sender: int
    tokens: int
    needed: bool = False


class IdealSimulator:
    """Records requests in time order; ``finish()`` returns one :class:`SimUsage` per request. ``provider``: whose
    prices apply (``anthropic``, ``openai``, or an engine's: none); a request recorded with its own ``provider``
    (an audit of traffic that mixes APIs) is priced by that one."""

    def __init__(self, provider: str, model: str | None = None):
        self.provider = provider
        self._model = model
        self._seen: dict[str, SeenIndex] = {}
        self._blocks: dict[tuple[str, bytes], _Block] = {}
        self._reqs: list[tuple[str, str, int, int]] = []  # (provider, model, prompt, read)

    def run(self, req: CanonicalRequest, provider: str | None = None) -> int:
        """Record ``req`` (priced by ``provider``'s rules, default the simulator's); returns the tokens it reuses (its
        matched prefix)."""
        model = self._model or req.model
        scope = normalize_model(model)
        seen = self._seen.setdefault(scope, SeenIndex())
        depth = seen.depth(req)
        rid = len(self._reqs)
        for i, h in enumerate(req.chain):
            blk = self._blocks.get((scope, h))
            if blk is None:
                self._blocks[(scope, h)] = _Block(rid, req.blocks[i].tokens, i < depth)
            elif i < depth:
                blk.needed = True
        seen.add(req)
        read = req.tokens_before(depth)
        self._reqs.append((provider or self.provider, model, req.tokens, read))
        return read

    def finish(self) -> list[SimUsage]:
        """Price every recorded request (see module docstring)."""
        written = [0] * len(self._reqs)
        for blk in self._blocks.values():
            if blk.needed:
                written[blk.sender] += blk.tokens
        out: list[SimUsage] = []
        for rid, (provider, model, prompt, read) in enumerate(self._reqs):
            if provider == "anthropic":
                write = min(written[rid], prompt - read)
                uncached = prompt - read - write
                cost = anthropic_rules(model).cost(uncached, read, write, 0)
            elif provider == "openai":
                write, uncached = 0, prompt - read
                cost = openai_rules(model).cost(uncached, read)
            else:  # a local engine: no price
                write, uncached, cost = 0, prompt - read, 0.0
            out.append(SimUsage(prompt, read, write, uncached, cost))
        return out
