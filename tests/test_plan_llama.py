"""The planner against a real llama.cpp ``llama-server`` (SmolLM2-135M): a thrash case.

llama.cpp keeps one cached sequence per slot, not a radix tree. With one slot (``--parallel 1``), no host prompt
cache (``--cache-ram 0``) and two sessions taking turns, the slot thrashes: each request reuses only what it
shares with the other session's last prompt. The planner, given the server's own token ids (``/apply-template``
+ ``/tokenize``, :class:`~agentcache.plan.ServerRenderer`), an L1 the size of the slot, page size 1 and
``slot`` eviction (a one-entry cache), must predict llama.cpp's reported ``cached_tokens`` turn by turn. What
this validates is the planner's matching on real token ids and the one-slot eviction; SGLang's radix tree,
session-aware eviction and HiCache tiers hold by contract (the semantics read from the sglang 0.5.23 wheel,
``agentcache/engine/_radix.py``), as there is no GPU here.
"""

from __future__ import annotations

from typing import Any

import httpx
import pytest

from agentcache.engine import TieredRadixCache
from agentcache.loaders import Record
from agentcache.plan import ServerRenderer
from agentcache.serve.llama import LlamaServer, find_llama_server, smollm2_model_path
from tests import needs

LLAMA_SERVER = find_llama_server()
SMOLLM2 = smollm2_model_path()
pytestmark = [
    pytest.mark.llama,
    pytest.mark.skipif(LLAMA_SERVER is None or SMOLLM2 is None, reason=needs.LLAMA),
]

SLOT_CTX = 2048
RULES = {
    "a": "You are a billing assistant for an airline. Refund only unused tickets; quote fares in euros; never "
    "change a booking without the booking code and the passenger's last name; answer in two sentences at most.",
    "b": "You review Python patches. Point at the line, name the bug, propose the smallest fix. Prefer the "
    "standard library; keep the file's style; never reformat untouched code; flag missing tests in one line.",
}


def _bodies(session: str, turns: int) -> list[dict[str, Any]]:
    messages: list[dict[str, Any]] = [{"role": "system", "content": RULES[session] * 3}]
    out = []
    for t in range(turns):
        messages.append({"role": "user", "content": f"Question {t} of session {session}: what now?"})
        out.append({"messages": list(messages), "max_tokens": 1, "temperature": 0})
        messages.append({"role": "assistant", "content": f"Zq{t}x answer {t}."})  # unlike any generated token
    return out


def test_one_slot_thrash_matches_llama_cpp_cached_tokens() -> None:
    a, b = _bodies("a", 3), _bodies("b", 3)
    order = [("a", a[0]), ("b", b[0]), ("a", a[1]), ("b", b[1]), ("a", a[2]), ("b", b[2])]
    order.append(("b", {**b[2], "messages": [*b[2]["messages"], {"role": "assistant", "content": "Zq2x answer 2."},
                                             {"role": "user", "content": "And then?"}]}))  # fmt: skip
    with LlamaServer(SMOLLM2, parallel=1, ctx_size=SLOT_CTX, cache_ram_mib=0) as server:
        renderer = ServerRenderer(server.base_url)
        slot = TieredRadixCache(page_size=1, l1_tokens=SLOT_CTX, eviction="slot")
        tree = TieredRadixCache(page_size=1, l1_tokens=SLOT_CTX, eviction="lru")
        rows = []
        with httpx.Client(base_url=server.base_url, timeout=120) as client:
            for i, (session, body) in enumerate(order):
                prompt = renderer(Record(session, "openai.chat", body, None, None, "thrash", i))
                keys = prompt.page_keys(1)
                predicted = slot.request(keys, prompt.tokens, session).hit
                radix = tree.request(keys, prompt.tokens, session).hit
                resp = client.post("/v1/chat/completions", json=body)
                assert resp.status_code == 200, resp.text
                usage = resp.json()["usage"]
                assert usage["prompt_tokens"] == prompt.tokens  # the renderer saw the server's own tokens
                rows.append((session, prompt.tokens, usage["prompt_tokens_details"]["cached_tokens"], predicted, radix))
        renderer.close()
    shown = "\n".join(
        f"{s} prompt={p} llama.cpp={c} planner(slot)={x} planner(radix lru)={r}" for s, p, c, x, r in rows
    )
    cached = [r[2] for r in rows]
    assert [r[3] for r in rows] == cached, shown
    # The slot thrashes (a switch of session reuses only the template's head) except on the same-session turn.
    assert all(c < 20 for c in cached[1:6]) and cached[6] == rows[5][1], shown
    # A radix tree of the same size keeps both sessions: what llama.cpp's one slot cannot.
    assert sum(r[4] for r in rows) > 3 * sum(cached), shown
