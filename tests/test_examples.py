"""The examples run as scripts, with the real SDKs, against a real llama.cpp ``llama-server`` (SmolLM2-135M), and
against a fake upstream that asks for tools (SmolLM2 never calls one) so the tool and subagent paths run too.
Plus the llama.cpp comparison: over a real tau-bench session, a wrapped client whose tool list is shuffled every
turn keeps the cached tokens of an unshuffled one, while the unwrapped shuffled client loses them.
"""

from __future__ import annotations

import importlib.util
import itertools
import json
import subprocess
import sys
from collections.abc import Iterator
from pathlib import Path
from typing import Any

import pytest

from tests import needs

pytest.importorskip("anthropic")
pytest.importorskip("openai")

from agentcache.serve.llama import LlamaServer, find_llama_server, smollm2_model_path

from .test_wrap_upstream import FakeUpstream, Reply, anthropic_message, chat_completion

ROOT = Path(__file__).resolve().parent.parent
EXAMPLES = ROOT / "examples"
TEMPLATE = ROOT / "agentcache" / "serve" / "llama" / "templates" / "tools_first.jinja"
LLAMA_SERVER, SMOLLM2 = find_llama_server(), smollm2_model_path()
needs_llama = pytest.mark.skipif(
    LLAMA_SERVER is None or SMOLLM2 is None,
    reason=needs.LLAMA,
)


@pytest.fixture
def upstream() -> Iterator[FakeUpstream]:
    up = FakeUpstream()
    yield up
    up.close()


def run_example(name: str, *args: str, timeout: float = 600) -> dict[str, Any]:
    """Run ``examples/<name>`` as a script with ``--json``; its summary."""
    done = subprocess.run(
        [sys.executable, str(EXAMPLES / name), *args, "--json"],
        capture_output=True,
        text=True,
        timeout=timeout,
        cwd=ROOT,
    )
    assert done.returncode == 0, done.stderr[-3000:]
    result: dict[str, Any] = json.loads(done.stdout.strip().splitlines()[-1])
    return result


def rows_of(result: dict[str, Any], session: str) -> list[dict[str, Any]]:
    return [r for r in result["turns"] if r["session"] == session]


# ---- tool and subagent paths, against a fake upstream ---------------------------------------------------------


def tool_use(name: str, args: dict[str, Any], call_id: str) -> dict[str, Any]:
    return {"type": "tool_use", "id": call_id, "name": name, "input": args}


def test_anthropic_agent_runs_tools_and_a_subagent(upstream: FakeUpstream) -> None:
    def reply(content: list[dict[str, Any]]) -> Any:
        body = anthropic_message(content=content)
        body["stop_reason"] = "tool_use" if any(c["type"] == "tool_use" for c in content) else "end_turn"
        return lambda path, b: Reply(body=body)

    upstream.script += [
        reply([tool_use("delegate", {"task": "Weather in Lisbon and Oslo"}, "t1")]),  # lead
        reply([tool_use("get_weather", {"city": "Lisbon"}, "t2")]),  # researcher
        reply([{"type": "text", "text": "Lisbon 21 C, Oslo 4 C."}]),  # researcher
        reply([tool_use("calculate", {"expression": "(21 - 4) * 9 / 5"}, "t3")]),  # lead
        reply([{"type": "text", "text": "Lisbon is warmer by 30.6 F."}]),  # lead
        reply([{"type": "text", "text": "OK"}]),  # reviewer
    ]
    result = run_example("anthropic_agent.py", "--base-url", upstream.url, "--model", "claude-opus-4-8")
    assert result["answer"] == "Lisbon is warmer by 30.6 F." and result["review"] == "OK"
    assert [r["turn"] for r in rows_of(result, "atlas")] == [0, 1, 2]
    assert len(rows_of(result, "atlas/researcher")) == 2 and len(rows_of(result, "atlas/reviewer")) == 1
    assert all(r["break"] is None for r in result["turns"])  # every turn extends its own session's history
    assert ("fork", "atlas/researcher", "researcher") in [tuple(e) for e in result["events"]]
    bodies = [s.body for s in upstream.seen]
    assert json.loads(bodies[2]["messages"][-1]["content"][0]["content"])["temperature_c"] == 21  # tool result
    assert bodies[3]["messages"][1]["content"][0] == {
        "type": "tool_use",
        "id": "t1",
        "name": "delegate",
        "input": {"task": "Weather in Lisbon and Oslo"},
    }
    assert json.loads(bodies[4]["messages"][-1]["content"][0]["content"]) == {"result": 30.6}
    # The subagent's first request starts with the lead's tools and system prompt, byte for byte.
    assert bodies[1]["tools"] == bodies[0]["tools"] and bodies[1]["system"] == bodies[0]["system"]


def test_openai_agent_runs_tools_and_a_subagent(upstream: FakeUpstream) -> None:
    def call(name: str, args: dict[str, Any], call_id: str) -> Any:
        fn = {"id": call_id, "type": "function", "function": {"name": name, "arguments": json.dumps(args)}}
        return lambda path, b: Reply(body=chat_completion(tool_calls=[fn]))

    def text(t: str) -> Any:
        return lambda path, b: Reply(body=chat_completion(t))

    upstream.script += [
        call("delegate", {"task": "Weather in Oslo"}, "c1"),
        call("get_weather", {"city": "Oslo"}, "c2"),
        text("Oslo 4 C."),
        text("Oslo is at 4 C."),
    ]  # then the default: a streamed "Hello."
    result = run_example("openai_agent.py", "--base-url", upstream.url + "/v1", "--model", "gpt-4o")
    assert result["answer"] == "Oslo is at 4 C." and result["review"] == "Hello."
    assert [r["session"] for r in result["turns"]] == [
        "atlas",
        "atlas/researcher",
        "atlas/researcher",
        "atlas",
        "atlas/reviewer",
    ]
    assert all(r["break"] is None for r in result["turns"])
    bodies = [s.body for s in upstream.seen]
    assert bodies[2]["messages"][-1] == {
        "role": "tool",
        "tool_call_id": "c2",
        "content": json.dumps({"city": "Oslo", "temperature_c": 4, "conditions": "sleet"}),
    }
    assert bodies[4]["stream"] is True and bodies[4]["stream_options"] == {"include_usage": True}
    assert result["turns"][-1]["cached_tokens"] == 1152  # the reviewer's usage came from its stream


# ---- against a real llama-server ------------------------------------------------------------------------------


@pytest.fixture(scope="module")
def llama(tmp_path_factory: pytest.TempPathFactory) -> Iterator[LlamaServer]:
    if LLAMA_SERVER is None or SMOLLM2 is None:
        pytest.skip(needs.LLAMA)
    log = tmp_path_factory.mktemp("llama-examples") / "server.log"
    with LlamaServer(SMOLLM2, chat_template_file=TEMPLATE, extra_args=["--jinja"], log_path=log) as server:
        yield server


def assert_subagent_reused_prefix(result: dict[str, Any], child: str) -> None:
    first = rows_of(result, child)[0]
    # Its tools and system prompt were already in the server's cache from the lead's requests.
    assert first["cached_tokens"] >= 0.6 * first["prompt_tokens"] > 200, first


@pytest.mark.llama
@needs_llama
def test_anthropic_agent_against_llama_server(llama: LlamaServer) -> None:
    result = run_example(
        "anthropic_agent.py",
        "--base-url",
        llama.base_url,
        "--model",
        "smollm2",
        "--max-tokens",
        "32",
        "--max-turns",
        "2",
    )
    assert rows_of(result, "atlas") and result["lineage_totals"]["requests"] == len(result["turns"])
    assert_subagent_reused_prefix(result, "atlas/reviewer")


@pytest.mark.llama
@needs_llama
def test_openai_agent_against_llama_server(llama: LlamaServer) -> None:
    result = run_example(
        "openai_agent.py",
        "--base-url",
        llama.base_url + "/v1",
        "--model",
        "smollm2",
        "--max-tokens",
        "32",
        "--max-turns",
        "2",
    )
    assert rows_of(result, "atlas")
    assert_subagent_reused_prefix(result, "atlas/reviewer")
    assert rows_of(result, "atlas/reviewer")[0]["cached_tokens"] is not None  # read from the stream's usage chunk


@pytest.mark.llama
@needs_llama
def test_llamacpp_agent_starts_its_own_server() -> None:
    result = run_example("llamacpp_agent.py", "--max-tokens", "24")
    lead = rows_of(result, "atlas")
    assert len(lead) >= 3
    for prev, cur in itertools.pairwise(lead):
        # The client reshuffles its tools every call; the server still reuses the whole previous prompt.
        assert cur["cached_tokens"] >= prev["prompt_tokens"] - 4, (prev, cur)
    assert any("tools.reordered" in r["repairs"] for r in lead)
    assert_subagent_reused_prefix(result, "atlas/researcher")


def _shuffle_module() -> Any:
    spec = importlib.util.spec_from_file_location("llamacpp_shuffle", ROOT / "benchmarks" / "llamacpp_shuffle.py")
    assert spec is not None and spec.loader is not None
    module = importlib.util.module_from_spec(spec)
    sys.modules[spec.name] = module  # dataclasses resolve annotations through sys.modules
    spec.loader.exec_module(module)
    return module


@pytest.mark.llama
@needs_llama
def test_shuffled_tools_keep_llama_cpp_cached_tokens_only_when_wrapped(tmp_path: Path) -> None:
    bench = _shuffle_module()
    rows = bench.run(turns=5, tools=5, system_chars=400, content_chars=200, seed=0, log_dir=tmp_path)
    print("\n" + bench.table(rows))
    arm = {name: [r for r in rows if r.arm == name] for name in bench.ARMS}
    plain, shuffled, wrapped = arm["unshuffled"], arm["shuffled"], arm["shuffled+agentcache"]
    assert len(plain) == len(shuffled) == len(wrapped) == 5
    for t in range(1, 5):
        # Unshuffled: each turn reuses everything the previous turn sent.
        assert plain[t].cached_tokens >= plain[t - 1].prompt_tokens - 2, plain
        # Shuffled and wrapped: the same prompt sizes and the same reuse, turn by turn.
        assert wrapped[t].prompt_tokens == plain[t].prompt_tokens
        assert abs(wrapped[t].cached_tokens - plain[t].cached_tokens) <= 2, (plain, wrapped)
        # Shuffled, not wrapped: only the template's first few tokens survive the new tool order.
        assert shuffled[t].cached_tokens < 32, shuffled
    total = sum(r.prompt_tokens for r in wrapped)
    assert sum(r.cached_tokens for r in wrapped) >= 0.6 * total
    assert sum(r.cached_tokens for r in shuffled) < 0.05 * total


# ---- the framework recipes (LangChain, OpenAI Agents SDK, litellm) --------------------------------------------

FRAMEWORK_EXAMPLES = [
    ("langchain_agent.py", ["--chat", "openai"], "/v1/chat/completions"),
    ("langchain_agent.py", ["--chat", "anthropic"], "/v1/messages"),
    ("openai_agents_sdk.py", [], "/v1/chat/completions"),
    ("litellm_agent.py", [], "/v1/chat/completions"),
]
needs_frameworks = pytest.mark.skipif(
    any(importlib.util.find_spec(m) is None for m in ("langchain", "langchain_openai", "langchain_anthropic", "agents"))
    or importlib.util.find_spec("litellm") is None,
    reason=needs.extra("frameworks"),
)


def _tool_names(body: dict[str, Any]) -> list[str]:
    return [t["name"] if "name" in t else t["function"]["name"] for t in body["tools"]]


@needs_frameworks
@pytest.mark.parametrize(("script", "extra", "path"), FRAMEWORK_EXAMPLES)
def test_framework_recipes_route_every_request_through_wrap(
    upstream: FakeUpstream, script: str, extra: list[str], path: str
) -> None:
    """Against the fake upstream: wrapped, every request the framework sends is an agentcache turn and goes out
    with the tools in their first-seen order; direct, the registry's new order reaches the wire every turn."""
    wrapped = run_example(script, *extra, "--base-url", upstream.url, "--turns", "3", "--model", "gpt-4o")
    sent = [s for s in upstream.seen if s.path == path]
    assert len(sent) == len(wrapped["requests"]) == wrapped["wrapped_turns"] == 3
    assert [_tool_names(s.body) for s in sent] == [_tool_names(sent[0].body)] * 3
    assert wrapped["last_repairs"] == ["tools.reordered"]
    assert wrapped["cached_tokens"] > 0  # the fake upstream's usage reached the framework unchanged
    upstream.seen.clear()
    direct = run_example(script, *extra, "--base-url", upstream.url, "--turns", "3", "--via", "direct")
    orders = [_tool_names(s.body) for s in upstream.seen if s.path == path]
    assert direct["wrapped_turns"] is None and len({tuple(o) for o in orders}) == 3


@pytest.mark.llama
@needs_llama
@needs_frameworks
@pytest.mark.parametrize(("script", "extra", "path"), FRAMEWORK_EXAMPLES)
def test_framework_recipes_keep_llama_cpp_cached_tokens(
    llama: LlamaServer, script: str, extra: list[str], path: str
) -> None:
    """On llama-server (tools rendered first): the tool order changes every user turn, yet each wrapped request
    reuses the whole previous prompt, by the server's own count."""
    result = run_example(script, *extra, "--base-url", llama.base_url, "--turns", "2", "--max-tokens", "1")
    rows = result["requests"]
    assert len(rows) == result["wrapped_turns"] == 2
    assert rows[1]["cached_tokens"] >= rows[0]["prompt_tokens"] - 4 > 400, rows
