"""Shared parts of the example agents: the tools, the system prompt, and a recorder of turn reports.

The examples are ordinary agent loops; agentcache appears only where the client is created
(``agentcache.wrap(sdk_client, session=...)``) and where a subagent starts (``session.fork(...)``).
"""

from __future__ import annotations

import argparse
import ast
import json
import logging
import operator
import os
from dataclasses import dataclass, field
from typing import Any

import structlog

import agentcache

SYSTEM = """You are Atlas, a travel-planning assistant inside a command-line tool.
Rules:
- Use the tools for facts: get_weather for weather, calculate for arithmetic. Never guess numbers.
- For a research question that needs several steps, call delegate with a short, self-contained task;
  a research subagent with the same tools works on it and returns its findings.
- Answer in at most three sentences, in plain English, with units on every number.
- If a tool fails, say so and continue with what you know."""

TOOL_SPECS: list[dict[str, Any]] = [
    {
        "name": "get_weather",
        "description": "Current weather for a city: temperature in Celsius and conditions.",
        "schema": {
            "type": "object",
            "properties": {"city": {"type": "string", "description": "City name, e.g. Lisbon"}},
            "required": ["city"],
        },
    },
    {
        "name": "calculate",
        "description": "Evaluate an arithmetic expression with + - * / ** and parentheses.",
        "schema": {
            "type": "object",
            "properties": {"expression": {"type": "string", "description": "e.g. (21 * 9 / 5) + 32"}},
            "required": ["expression"],
        },
    },
    {
        "name": "delegate",
        "description": "Hand a self-contained research task to a subagent and get its findings back.",
        "schema": {
            "type": "object",
            "properties": {"task": {"type": "string", "description": "What the subagent should find out"}},
            "required": ["task"],
        },
    },
]

WEATHER = {"lisbon": (21, "sunny"), "oslo": (4, "sleet"), "nairobi": (24, "scattered showers")}
_OPS = {
    ast.Add: operator.add,
    ast.Sub: operator.sub,
    ast.Mult: operator.mul,
    ast.Div: operator.truediv,
    ast.Pow: operator.pow,
    ast.USub: operator.neg,
}


def anthropic_tools() -> list[dict[str, Any]]:
    """The tools in Anthropic's format."""
    return [{"name": t["name"], "description": t["description"], "input_schema": t["schema"]} for t in TOOL_SPECS]


def openai_tools() -> list[dict[str, Any]]:
    """The tools in OpenAI's function format."""
    return [
        {
            "type": "function",
            "function": {"name": t["name"], "description": t["description"], "parameters": t["schema"]},
        }
        for t in TOOL_SPECS
    ]


def _eval(node: ast.AST) -> float:
    if isinstance(node, ast.Expression):
        return _eval(node.body)
    if isinstance(node, ast.Constant) and isinstance(node.value, int | float):
        return float(node.value)
    if isinstance(node, ast.BinOp) and type(node.op) in _OPS:
        return float(_OPS[type(node.op)](_eval(node.left), _eval(node.right)))
    if isinstance(node, ast.UnaryOp) and type(node.op) in _OPS:
        return float(_OPS[type(node.op)](_eval(node.operand)))
    raise ValueError("unsupported expression")


def run_tool(name: str, args: dict[str, Any]) -> str:
    """Run a local tool (not ``delegate``); errors come back as text for the model."""
    try:
        if name == "get_weather":
            city = str(args.get("city", "")).strip()
            temp, sky = WEATHER.get(city.lower(), (15, "overcast"))
            return json.dumps({"city": city, "temperature_c": temp, "conditions": sky})
        if name == "calculate":
            return json.dumps({"result": _eval(ast.parse(str(args.get("expression", "")), mode="eval"))})
        return json.dumps({"error": f"unknown tool {name}"})
    except (ValueError, SyntaxError, ZeroDivisionError, OverflowError) as exc:
        return json.dumps({"error": str(exc)})


def parse_args(raw: Any) -> dict[str, Any]:
    """Tool arguments from a JSON string (OpenAI) or a dict (Anthropic); junk becomes ``{}``."""
    if isinstance(raw, dict):
        return raw
    try:
        value = json.loads(raw or "{}")
    except (TypeError, ValueError):
        return {}
    return value if isinstance(value, dict) else {}


@dataclass
class Recorder:
    """A lifecycle sink that keeps every event, to print what the cache did."""

    events: list[agentcache.LifecycleEvent] = field(default_factory=list)

    def __call__(self, event: agentcache.LifecycleEvent) -> None:
        self.events.append(event)

    def turns(self) -> list[dict[str, Any]]:
        """One row per committed request: session, turn, prompt and cached tokens (as reported)."""
        rows = []
        for e in self.events:
            if e.event != "turn" or e.report is None:
                continue
            u = e.report.usage
            rows.append(
                {
                    "session": e.session_signal.session_id,
                    "parent": e.session_signal.parent,
                    "turn": e.session_signal.turn,
                    "attempt": e.session_signal.attempt,
                    "prompt_tokens": u.prompt_tokens if u else None,
                    "cached_tokens": u.cache_read_tokens if u else None,
                    "repairs": list(e.report.repairs),
                    "break": e.report.reuse_boundary.cause,
                    "cost_usd": e.report.cost_usd,
                }
            )
        return rows


def summary(sessions: agentcache.Sessions, recorder: Recorder, root: str, answer: str) -> dict[str, Any]:
    """What the run did: the answer, every turn, the lifecycle events and the lineage totals."""
    totals = sessions.lineage_totals(root)
    return {
        "answer": answer,
        "turns": recorder.turns(),
        "events": [(e.event, e.session_signal.session_id, e.reason) for e in recorder.events],
        "lineage_totals": totals.to_dict() if totals else None,
    }


def configure_logs(verbose: bool) -> None:
    """Show agentcache's lifecycle events (``session.open``, ``session.turn``...) only with ``--verbose``:
    the library logs through structlog and leaves its configuration to the application."""
    level = logging.INFO if verbose else logging.WARNING
    structlog.configure(wrapper_class=structlog.make_filtering_bound_logger(level))


def print_summary(result: dict[str, Any], as_json: bool) -> None:
    """Print ``result`` as JSON, or as a short table."""
    if as_json:
        print(json.dumps(result))
        return
    print(f"answer: {result['answer']}\n")
    print(f"{'session':<28} {'turn':>4} {'prompt':>7} {'cached':>7}  repairs")
    for row in result["turns"]:
        print(
            f"{row['session']:<28} {row['turn']:>4} {row['prompt_tokens']!s:>7} {row['cached_tokens']!s:>7}  "
            f"{','.join(row['repairs']) or '-'}"
        )
    print(f"\nlineage totals: {result['lineage_totals']}")


def agent_args(
    doc: str, default_task: str, base_url_env: str, model_env: str, default_model: str, argv: list[str] | None
) -> argparse.Namespace:
    """The command line the SDK agent examples share: task, ``--base-url`` (default ``$base_url_env``),
    ``--model`` (default ``$model_env`` or ``default_model``), turn and token limits, ``--json``, ``--verbose``
    (which also turns on agentcache's lifecycle logs)."""
    p = argparse.ArgumentParser(description=doc.split("\n")[0])
    p.add_argument("task", nargs="?", default=default_task)
    p.add_argument("--base-url", default=os.environ.get(base_url_env))
    p.add_argument("--model", default=os.environ.get(model_env, default_model))
    p.add_argument("--max-turns", type=int, default=6)
    p.add_argument("--max-tokens", type=int, default=512)
    p.add_argument("--json", action="store_true", help="print the summary as one JSON object")
    p.add_argument("--verbose", action="store_true", help="log agentcache's lifecycle events")
    a = p.parse_args(argv)
    configure_logs(a.verbose)
    return a
