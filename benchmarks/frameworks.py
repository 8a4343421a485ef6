"""Engine-cached tokens per agent framework: direct vs through ``agentcache proxy`` vs through ``agentcache.wrap``.

    python benchmarks/frameworks.py                      # 4 frameworks x 3 routes, 3 user turns: ~5-15 min on 2 CPUs
    python benchmarks/frameworks.py --turns 4 --json out.json

Each cell runs one of the framework examples (``examples/langchain_agent.py`` with ChatOpenAI and with
ChatAnthropic, ``examples/openai_agents_sdk.py``, ``examples/litellm_agent.py``) as a script with ``--via
direct|proxy|wrap``, each on a fresh ``llama-server`` the example starts itself (SmolLM2-135M, one slot, the
tools-first template ``agentcache/serve/llama/templates/tools_first.jinja``), so no cell reuses another's cache.
The workload is the same short conversation in every cell: the examples' system prompt, ``--turns`` user
questions, and five registry tools handed over in a new order every user turn (an unordered tool registry).

The figures are the server's own: per request the prompt and cached tokens it reported (llama.cpp
``prompt_tokens`` / ``prompt_tokens_details.cached_tokens``, or Anthropic ``input_tokens`` +
``cache_read_input_tokens``), as each framework hands them back (``usage_metadata``, ``raw_responses``,
``usage``); reuse = cached / prompt over the whole run.
"""

from __future__ import annotations

import argparse
import json
import subprocess
import sys
from pathlib import Path
from typing import Any

ROOT = Path(__file__).resolve().parent.parent
EXAMPLES = ROOT / "examples"
#: (label, example script, extra arguments)
FRAMEWORKS = (
    ("LangChain ChatOpenAI + create_agent", "langchain_agent.py", ["--chat", "openai"]),
    ("LangChain ChatAnthropic + create_agent", "langchain_agent.py", ["--chat", "anthropic"]),
    ("OpenAI Agents SDK (Chat Completions model)", "openai_agents_sdk.py", []),
    ("litellm.completion", "litellm_agent.py", []),
)
ROUTES = ("direct", "proxy", "wrap")


def run_cell(script: str, extra: list[str], via: str, turns: int, max_tokens: int) -> dict[str, Any]:
    """One example run; its JSON summary."""
    argv = [sys.executable, str(EXAMPLES / script), *extra, "--via", via, "--turns", str(turns)]
    done = subprocess.run(
        [*argv, "--max-tokens", str(max_tokens), "--json"], capture_output=True, text=True, timeout=1800, cwd=ROOT
    )
    if done.returncode != 0:
        raise SystemExit(f"{script} --via {via} failed:\n{done.stderr[-2000:]}")
    result: dict[str, Any] = json.loads(done.stdout.strip().splitlines()[-1])
    return result


def table(cells: dict[tuple[str, str], dict[str, Any]]) -> str:
    """Markdown: one row per framework, cached / prompt tokens (reuse) per route."""
    lines = ["| framework | " + " | ".join(ROUTES) + " |", "|---|" + "---:|" * len(ROUTES)]
    for label, _, _ in FRAMEWORKS:
        row = []
        for via in ROUTES:
            c = cells.get((label, via))
            row.append("—" if c is None else f"{c['cached_tokens']:,} / {c['prompt_tokens']:,} ({c['reuse']:.1%})")
        lines.append(f"| {label} | " + " | ".join(row) + " |")
    return "\n".join(lines)


def main(argv: list[str] | None = None) -> int:
    p = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    p.add_argument("--turns", type=int, default=3)
    p.add_argument("--max-tokens", type=int, default=1, help="tokens to generate per request (prefill is measured)")
    p.add_argument("--only", help="run only the frameworks whose label contains this")
    p.add_argument("--json", type=Path, help="also write every cell's summary as JSON")
    a = p.parse_args(argv)
    cells: dict[tuple[str, str], dict[str, Any]] = {}
    for label, script, extra in FRAMEWORKS:
        if a.only and a.only.lower() not in label.lower():
            continue
        for via in ROUTES:
            cells[label, via] = run_cell(script, extra, via, a.turns, a.max_tokens)
            print(f"{label} / {via}: {cells[label, via]['requests']}", file=sys.stderr)
    print(table(cells))
    if a.json:
        a.json.write_text(json.dumps({f"{k[0]} / {k[1]}": v for k, v in cells.items()}, indent=1))
    return 0


if __name__ == "__main__":
    sys.exit(main())
