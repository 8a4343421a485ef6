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
import sys
from dataclasses import dataclass, field
from typing import Any, NoReturn

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


def sdk_missing(module: str) -> NoReturn:
    """Exit with one line naming the missing SDK and how to install it (agentcache's ``sdk`` extra), instead of
    an ImportError traceback."""
    raise SystemExit(
        f"{os.path.basename(sys.argv[0])}: this example needs the {module} SDK: pip install 'agentcache[sdk]' "
        "(from a clone: pip install -e '.[sdk]')"
    )


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


# ---- the framework examples (langchain_agent.py, openai_agents_sdk.py, litellm_agent.py) ------------------------

#: More tools for the framework examples' registry (with get_weather and calculate): enough tool text for the
#: tool order to matter to a prefix cache.
MORE_TOOL_SPECS: list[dict[str, Any]] = [
    {
        "name": "local_time",
        "description": "The current local time in a city, as HH:MM in 24-hour format, with its UTC offset.",
        "schema": {
            "type": "object",
            "properties": {"city": {"type": "string", "description": "City name, e.g. Oslo"}},
            "required": ["city"],
        },
    },
    {
        "name": "convert_currency",
        "description": "Convert an amount between two ISO 4217 currencies at today's reference rate.",
        "schema": {
            "type": "object",
            "properties": {
                "amount": {"type": "number", "description": "The amount to convert"},
                "source": {"type": "string", "description": "Currency code to convert from, e.g. EUR"},
                "target": {"type": "string", "description": "Currency code to convert to, e.g. NOK"},
            },
            "required": ["amount", "source", "target"],
        },
    },
    {
        "name": "packing_list",
        "description": "A short packing list for a trip, given the city, the number of nights and the weather.",
        "schema": {
            "type": "object",
            "properties": {
                "city": {"type": "string", "description": "Destination city"},
                "nights": {"type": "integer", "description": "Number of nights"},
                "conditions": {"type": "string", "description": "Expected weather, e.g. sleet"},
            },
            "required": ["city", "nights"],
        },
    },
]
QUESTIONS = [
    "How warm is it in Lisbon right now?",
    "And in Oslo? Give the difference in Celsius.",
    "Convert that difference to Fahrenheit degrees.",
    "What should I pack for three nights in Oslo?",
]
TOOLS_FIRST_TEMPLATE = os.path.join(
    os.path.dirname(agentcache.__file__), "serve", "llama", "templates", "tools_first.jinja"
)


def registry_specs(turn: int, seed: int = 7) -> list[dict[str, Any]]:
    """The registry's tools as an unordered registry hands them out: a different order on every user turn (led by
    a different tool each turn, the rest shuffled), as frameworks that collect tools from plugins or a dict do."""
    import random

    specs = [*TOOL_SPECS[:2], *MORE_TOOL_SPECS]
    lead = specs[turn % len(specs)]
    rest = [s for s in specs if s is not lead]
    random.Random(seed * 1000 + turn).shuffle(rest)
    return [lead, *rest]


def local_tool(name: str, args: dict[str, Any]) -> str:
    """Run a registry tool (the two of :func:`run_tool` and the three of :data:`MORE_TOOL_SPECS`)."""
    if name == "local_time":
        return json.dumps({"city": args.get("city"), "time": "14:05", "utc_offset": "+01:00"})
    if name == "convert_currency":
        return json.dumps({"amount": round(float(args.get("amount") or 0) * 11.6, 2), "currency": args.get("target")})
    if name == "packing_list":
        return json.dumps({"items": ["rain jacket", "wool sweater", "boots"]})
    return run_tool(name, args)


def framework_args(doc: str, argv: list[str] | None, chat: bool = False) -> argparse.Namespace:
    """The command line of the framework examples: ``--via wrap|direct|proxy``, ``--base-url`` of a running
    llama-server (default: start one), turns, tokens, ``--json``; ``--chat openai|anthropic`` when ``chat``."""
    p = argparse.ArgumentParser(description=doc.split("\n")[0])
    if chat:
        p.add_argument("--chat", choices=("openai", "anthropic"), default="openai", help="the chat model's API")
    p.add_argument("--via", choices=("wrap", "direct", "proxy"), default="wrap", help="how requests reach the server")
    p.add_argument("--base-url", help="a running llama-server (default: start one on loopback)")
    p.add_argument("--model", default="smollm2")
    p.add_argument("--turns", type=int, default=len(QUESTIONS))
    p.add_argument("--max-tokens", type=int, default=32)
    p.add_argument("--seed", type=int, default=7)
    p.add_argument("--json", action="store_true", help="print the summary as one JSON object")
    p.add_argument("--verbose", action="store_true", help="log agentcache's lifecycle events")
    a = p.parse_args(argv)
    configure_logs(a.verbose)
    return a


def serve_locally(stack: Any, base_url: str | None, via: str) -> str | None:
    """The base URL (no ``/v1``) requests go to: ``base_url`` or a llama-server started here (SmolLM2, the
    tools-first template), behind an ``agentcache proxy`` subprocess when ``via == "proxy"``. None when
    llama-server or the model is missing."""
    import socket
    import subprocess
    import sys
    import time
    import urllib.request

    if base_url is None:
        from agentcache.serve.llama import LlamaServer, find_llama_server, smollm2_model_path

        model_path = smollm2_model_path()
        if find_llama_server() is None or model_path is None:
            return None
        server = LlamaServer(model_path, chat_template_file=TOOLS_FIRST_TEMPLATE, extra_args=["--jinja"])
        base_url = stack.enter_context(server).base_url
    base_url = base_url.rstrip("/")
    if via != "proxy":
        return base_url
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        port = s.getsockname()[1]
    cmd = [sys.executable, "-m", "agentcache", "proxy", "--upstream", base_url, "--port", str(port)]
    proc = subprocess.Popen(cmd, stdout=subprocess.DEVNULL, stderr=subprocess.DEVNULL)
    stack.callback(proc.wait, 30)
    stack.callback(proc.terminate)
    url = f"http://127.0.0.1:{port}"
    for _ in range(300):
        try:
            urllib.request.urlopen(url + "/agentcache/v1/health", timeout=2).close()
            return url
        except OSError:
            time.sleep(0.1)
    raise RuntimeError("agentcache proxy did not start")


def framework_summary(via: str, rows: list[tuple[int, int]], answer: str, session: Any) -> dict[str, Any]:
    """What a framework example ran: per request the prompt and cached tokens the framework reported (the
    server's own counts), totals, and what agentcache saw when it wrapped the client."""
    prompt, cached = sum(p for p, _ in rows), sum(c for _, c in rows)
    report = session.last_report if session is not None else None
    return {
        "via": via,
        "answer": answer,
        "requests": [{"prompt_tokens": p, "cached_tokens": c} for p, c in rows],
        "prompt_tokens": prompt,
        "cached_tokens": cached,
        "reuse": round(cached / prompt, 4) if prompt else 0.0,
        "wrapped_turns": session.turns if session is not None else None,
        "last_repairs": list(report.repairs) if report is not None else [],
    }


def print_framework_summary(result: dict[str, Any], as_json: bool) -> None:
    """Print a framework example's summary as JSON, or as a short table."""
    if as_json:
        print(json.dumps(result))
        return
    print(f"answer: {result['answer']}\n\nrequest  prompt  cached   (via {result['via']})")
    for i, row in enumerate(result["requests"], 1):
        print(f"{i:>7} {row['prompt_tokens']:>7} {row['cached_tokens']:>7}")
    print(f"\nengine-cached tokens: {result['cached_tokens']:,} / {result['prompt_tokens']:,} ({result['reuse']:.1%})")
