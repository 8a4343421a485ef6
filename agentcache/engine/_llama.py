"""llama.cpp ``llama-server``'s prompt reuse, exact to the token: which slot a request lands in and how many of
its prompt tokens the server takes from cache (``usage.prompt_tokens_details.cached_tokens`` / ``timings.cache_n``).

Read from the server source this project builds (llama-cpp-python 0.3.36's vendored llama.cpp,
``tools/server/server-context.cpp`` and ``server-task.cpp``; ``llama-server --help`` for the defaults):

* **Slot selection** (``get_available_slot``). A request pinned with ``id_slot`` takes that slot. Otherwise,
  when ``--slot-prompt-similarity`` (default 0.10) is not 0, the idle, non-empty slot whose token content has
  the longest common prefix with the prompt, as a fraction of the prompt, above the threshold (strictly; the
  first such slot on ties); else the least recently used idle slot (a slot never used counts as oldest; on
  ties the last one).
* **The host-memory prompt cache** (``--cache-ram``, default 8192 MiB; ``server_prompt_cache``). When the slot
  was chosen by LRU, or a pinned slot fails the similarity test, or the kept fraction of the slot's content
  (``f_keep``) is below 0.5, the slot's content is saved to the cache (unless a cached prompt already starts
  with all of it; cached prompts that are a prefix of it are dropped) and the cached prompt that keeps at
  least a quarter of itself and beats the slot on both kept fraction and prompt similarity is loaded into the
  slot (and leaves the cache). Oldest entries go first when the cache is full.
* **Idle slots** (``--cache-idle-slots``, on by default with the prompt cache). After a request is given a
  slot, every idle slot is saved to the prompt cache; with ``--kv-unified`` they are also cleared.
* **Reuse** (``update_slots``, ``cache_prompt`` on): the common prefix of the slot's tokens and the prompt,
  less one when it is the whole prompt (at least one token is evaluated) — ``--cache-reuse`` chunk shifting
  (default 0, off) is not modelled.
* **What a slot holds after a response**: the prompt and the generated tokens that were fed back, i.e. all
  but the last one sampled (the last token is sampled but never decoded).

Not modelled: ``--cache-reuse`` chunk shifting, SWA/recurrent checkpoints (SmolLM2 and other full-attention
models need none), LoRA switches, multimodal prompts, the byte-size limit of the prompt cache (give
``ram_limit_tokens`` instead: MiB / KV bytes per token), context shift.
"""

from __future__ import annotations

from collections.abc import Sequence
from dataclasses import dataclass, field

from ._prompt import common_prefix

__all__ = ["LlamaCppCache", "LlamaPrediction"]

#: ``llama-server --slot-prompt-similarity`` default (``common/common.h``: ``slot_prompt_similarity = 0.1f``).
DEFAULT_SIMILARITY = 0.1
#: A slot chosen by similarity is saved to the prompt cache when it keeps less than this fraction of itself.
KEEP_SAVE_BELOW = 0.5
#: A cached prompt is only loaded when the new prompt keeps at least this fraction of it ("don't trash large
#: prompts", ``server_prompt_cache::load``).
KEEP_LOAD_MIN = 0.25


@dataclass(slots=True)
class _Slot:
    id: int
    tokens: tuple[int, ...] = ()
    t_last: int = -1
    busy: bool = False
    echo: int = 0  # generated tokens the slot holds that are not known yet (``end(..., echoed=True)``)


@dataclass(frozen=True, slots=True)
class LlamaPrediction:
    """What the server will do with one request: the ``slot`` it runs in (None when every slot is busy and
    the server would defer it) and ``cached_tokens`` of its prompt taken from cache; ``loaded``: the slot's
    content came from the host-memory prompt cache."""

    slot: int | None
    cached_tokens: int
    prompt_tokens: int
    loaded: bool = False


@dataclass(slots=True)
class LlamaCppCache:
    """The prompt caches of one ``llama-server``; feed it every request in the order the server receives them.

    ``slots``: ``--parallel`` (``/props`` ``total_slots``). ``similarity``: ``--slot-prompt-similarity``.
    ``prompt_cache``: ``--cache-ram`` not 0. ``ram_limit_tokens``: tokens the prompt cache holds (None: no
    limit; the server's limit is in bytes). ``cache_idle_slots``: ``--cache-idle-slots``. ``kv_unified``:
    ``--kv-unified`` (on by default only when ``--parallel`` is not given). ``cache_prompt``: the request
    field (default on).

    ``begin(tokens)`` → :class:`LlamaPrediction` when the request starts; ``end(slot, generated)`` when its
    response is done. See the module docstring for the rules and their source.
    """

    slots: int = 1
    similarity: float = DEFAULT_SIMILARITY
    prompt_cache: bool = True
    ram_limit_tokens: int | None = None
    cache_idle_slots: bool = True
    kv_unified: bool = False
    cache_prompt: bool = True
    _slots: list[_Slot] = field(default_factory=list, repr=False)
    _ram: list[tuple[int, ...]] = field(default_factory=list, repr=False)
    _clock: int = field(default=0, repr=False)
    _undo: tuple[int, tuple[int, ...], list[tuple[int, ...]], list[tuple[int, ...]]] | None = field(
        default=None, repr=False
    )

    def __post_init__(self) -> None:
        if self.slots < 1:
            raise ValueError("slots must be at least 1")
        self._slots = [_Slot(i) for i in range(self.slots)]

    # -- the server's steps ------------------------------------------------------------------------------------

    def _select(self, prompt: tuple[int, ...], id_slot: int | None) -> tuple[_Slot | None, bool]:
        """``get_available_slot`` without the cache update: the slot and whether to update the prompt cache."""
        chosen: _Slot | None = None
        update = False
        if id_slot is not None and 0 <= id_slot < len(self._slots):
            chosen = self._slots[id_slot]
        if self.similarity != 0.0:
            best = 0.0
            for slot in self._slots:
                if id_slot is not None and slot.id != id_slot:
                    continue
                if slot.busy or not slot.tokens:
                    continue
                sim = common_prefix(slot.tokens, prompt) / len(prompt) if prompt else 0.0
                if sim > best and sim > self.similarity:
                    best, chosen = sim, slot
            # f_keep = f_sim_best * n_prompt / n_slot; a pinned slot that failed the test keeps 0
            if chosen is not None and chosen.tokens and best * len(prompt) / len(chosen.tokens) < KEEP_SAVE_BELOW:
                update = True
        if chosen is None:
            for slot in self._slots:
                if slot.busy:
                    continue
                if chosen is None or slot.t_last <= chosen.t_last:
                    chosen = slot
            if chosen is not None:
                update = True
        return chosen, update and self.prompt_cache

    def _save(self, tokens: tuple[int, ...]) -> None:
        """``server_prompt_cache::alloc``: keep ``tokens`` unless a cached prompt already starts with them."""
        if not tokens:
            return
        n = len(tokens)
        if any(len(s) >= n and s[:n] == tokens for s in self._ram):
            return
        limit = self.ram_limit_tokens
        if limit is not None and n > limit:  # an entry over the limit is skipped, the cache left as it is
            return
        self._ram = [s for s in self._ram if not (len(s) <= n and tokens[: len(s)] == s)]
        if limit is not None:  # make room first, oldest entry first
            while self._ram and sum(map(len, self._ram)) + n > limit:
                self._ram.pop(0)
        self._ram.append(tokens)

    def _trim(self) -> None:
        if self.ram_limit_tokens is None:
            return
        while self._ram and sum(map(len, self._ram)) > self.ram_limit_tokens:
            self._ram.pop(0)

    def _load(self, slot: _Slot, prompt: tuple[int, ...]) -> bool:
        """``server_prompt_cache::load``: move the best cached prompt into ``slot``; whether one was loaded."""
        lcp = common_prefix(slot.tokens, prompt)
        keep_best = lcp / len(slot.tokens) if slot.tokens else -1.0
        sim_best = lcp / len(prompt) if prompt else 0.0
        best: int | None = None
        for i, cached in enumerate(self._ram):
            cur = common_prefix(cached, prompt)
            keep, sim = cur / len(cached), (cur / len(prompt) if prompt else 0.0)
            if keep < KEEP_LOAD_MIN:
                continue
            if keep_best < keep and sim_best < sim:
                keep_best, sim_best, best = keep, sim, i
        if best is None:
            return False
        slot.tokens = self._ram.pop(best)
        return True

    # -- the public surface ------------------------------------------------------------------------------------

    def begin(self, tokens: Sequence[int], id_slot: int | None = None) -> LlamaPrediction:
        """A request with prompt ``tokens`` (ids, as ``/tokenize`` with ``add_special`` gives them) arrives,
        pinned to ``id_slot`` or not. Returns the prediction; its slot is busy until :meth:`end`."""
        prompt = tuple(tokens)
        for state in self._slots:
            if state.echo and not state.busy:
                n = len(state.tokens)
                if prompt[:n] == state.tokens:  # the reply came back: the slot held its tokens
                    state.tokens = prompt[: n + state.echo]
                state.echo = 0
        slot, update = self._select(prompt, id_slot)
        if slot is None or slot.busy:  # the server defers the request until a slot frees up
            return LlamaPrediction(None, 0, len(prompt))
        self._undo = (slot.id, slot.tokens, list(self._ram), [s.tokens for s in self._slots])
        loaded = False
        if update:
            self._save(slot.tokens)
            loaded = self._load(slot, prompt)
            self._trim()
        slot.busy = True
        if self.cache_prompt:
            cached = common_prefix(slot.tokens, prompt)
            if cached == len(prompt) and cached > 0:
                cached -= 1  # at least one prompt token is evaluated
        else:
            cached = 0
        slot.tokens = prompt
        if self.cache_idle_slots and self.prompt_cache:
            for other in self._slots:
                if not other.busy:
                    self._save(other.tokens)
                    if self.kv_unified:
                        other.tokens = ()
        return LlamaPrediction(slot.id, cached, len(prompt), loaded)

    def end(
        self, slot: int | None, generated: Sequence[int] = (), n_generated: int | None = None, *, echoed: bool = False
    ) -> None:
        """The request in ``slot`` finished having sampled ``n_generated`` tokens (default ``len(generated)``),
        whose ids begin ``generated``: the slot keeps all but the last sampled one after its prompt.

        ``echoed``: the ids are not known (a proxy that does not read the generated text); assume the next
        prompt that extends the slot's content carries the reply verbatim, as agents send it back, and take
        those ``n_generated - 1`` tokens from it."""
        if slot is None or not 0 <= slot < len(self._slots):
            return
        state = self._slots[slot]
        n = len(generated) if n_generated is None else n_generated
        state.tokens = state.tokens + tuple(generated[: max(0, n - 1)])
        state.echo = max(0, n - 1 - len(generated)) if echoed else 0
        state.busy = False
        self._clock += 1
        state.t_last = self._clock

    def reject(self, prediction: LlamaPrediction) -> None:
        """The server refused the request before giving it a slot (an HTTP 4xx on validation): undo
        :meth:`begin` (all of it when no other request began since, else only the slot's content)."""
        if prediction.slot is None:
            return
        state = self._slots[prediction.slot]
        state.busy = False
        if self._undo is not None and self._undo[0] == prediction.slot:
            _, tokens, ram, contents = self._undo
            self._ram = ram
            for other, content in zip(self._slots, contents, strict=True):
                if not other.busy:
                    other.tokens = content
            state.tokens = tokens
        self._undo = None

    def slot_tokens(self, slot: int) -> tuple[int, ...]:
        """The token ids slot ``slot`` holds now."""
        return self._slots[slot].tokens

    @property
    def tokens_held(self) -> int:
        """Token ids the model holds (slots and prompt cache), for memory accounting."""
        return sum(len(s.tokens) for s in self._slots) + sum(map(len, self._ram))

    @property
    def cached_prompts(self) -> int:
        """Prompts in the host-memory prompt cache."""
        return len(self._ram)
