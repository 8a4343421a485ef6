"""Shared fixtures: real tau-bench bulk text (airline policy and tools) for synthetic sequences."""

from __future__ import annotations

import copy
import json
from pathlib import Path
from typing import Any

import pytest

ROOT = Path(__file__).resolve().parent.parent
DATA = ROOT / "data"
CASES = Path(__file__).resolve().parent / "cases"


def _taubench() -> list[dict[str, Any]]:
    with open(DATA / "tau-bench" / "gpt-4o-airline.json") as f:
        runs: list[dict[str, Any]] = json.load(f)
    return runs


_RUNS = _taubench()
_TOOLS: list[dict[str, Any]] = json.loads((DATA / "tau-bench" / "airline_tools.json").read_text())


@pytest.fixture(scope="session")
def taubench_runs() -> list[dict[str, Any]]:
    """The 200 real tau-bench runs."""
    return _RUNS


def policy() -> str:
    """The airline policy (real system prompt of every tau-bench run)."""
    text: str = _RUNS[0]["traj"][0]["content"]
    return text


def openai_tools() -> list[dict[str, Any]]:
    """The 14 real airline tools in OpenAI function format (a deep copy)."""
    return copy.deepcopy(_TOOLS)


def anthropic_tools() -> list[dict[str, Any]]:
    """The same tools as Anthropic ``{name, description, input_schema}``."""
    return [
        {
            "name": t["function"]["name"],
            "description": t["function"]["description"],
            "input_schema": t["function"]["parameters"],
        }
        for t in openai_tools()
    ]


def real_turns(run: int = 0) -> list[dict[str, Any]]:
    """OpenAI chat messages of one real run, system message excluded."""
    msgs: list[dict[str, Any]] = copy.deepcopy(_RUNS[run]["traj"][1:])
    return msgs


def anthropic_messages(n: int, run: int = 0) -> list[dict[str, Any]]:
    """``n`` alternating Anthropic messages made from real tau-bench turn text (content blocks)."""
    texts = [m.get("content") or json.dumps(m.get("tool_calls")) for m in real_turns(run)]
    out = []
    for i in range(n):
        role = "user" if i % 2 == 0 else "assistant"
        out.append({"role": role, "content": [{"type": "text", "text": f"{texts[i % len(texts)]} (turn {i})"}]})
    return out
