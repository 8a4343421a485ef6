"""Drive real agent CLIs non-interactively against a base URL, each in its own throw-away home and work directory.

The binaries come from PATH or from the npm cache ``${AGENTCACHE_CACHE_DIR:-~/.cache/agentcache}/npm`` that
``.ci/run`` fills (``npm install --prefix``). A driver never touches the user's own configuration: Claude Code gets
``CLAUDE_CONFIG_DIR``, Codex ``CODEX_HOME``, opencode the ``XDG_*`` directories, all under the run's home.

Each client runs four scenarios in one home (see :data:`SCENARIOS`): a fresh run, a continue/resume of it, a fresh
run with the same opening prompt, and a run whose agent spawns a subagent. The fake upstream's directives
(:mod:`tests.clients.fake_upstream`) make each loop through one tool call.
"""

from __future__ import annotations

import json
import os
import re
import shutil
import subprocess
from dataclasses import dataclass
from pathlib import Path
from typing import ClassVar

#: (scenario, prompt, continues the previous conversation). True conversations: fresh and both continues are one
#: (two follow-ups: Claude Code re-sends older prompts as strings from the second on), the second fresh run
#: another, the subagent run a third (plus its subagent, linked to it).
SCENARIOS: tuple[tuple[str, str, bool], ...] = (
    ("fresh", "Print a marker. agentcache-script:shell", False),
    ("continue", "Print it again. agentcache-script:shell", True),
    ("continue2", "Print it once more. agentcache-script:shell", True),
    ("same_prompt", "Print a marker. agentcache-script:shell", False),
    ("subagent", "Delegate to a subagent. agentcache-script:task", False),
)
ANSI = re.compile(r"\x1b\[[0-9;]*[A-Za-z]")
API_KEY_ANTHROPIC = "sk-ant-agentcache-clients-test"
API_KEY_OPENAI = "sk-agentcache-clients-test"
RUN_TIMEOUT = 120.0


def npm_bin_dir() -> Path:
    """Where ``.ci/run`` installs the npm clients' executables."""
    root = os.environ.get("AGENTCACHE_CACHE_DIR") or str(Path.home() / ".cache" / "agentcache")
    return Path(root) / "npm" / "node_modules" / ".bin"


def find_binary(name: str) -> str | None:
    """The client's executable on PATH or in the npm cache, or ``None``."""
    return shutil.which(name) or shutil.which(name, path=str(npm_bin_dir()))


@dataclass
class RunOutput:
    """One CLI invocation: exit code and its stdout (ANSI colours stripped)."""

    returncode: int
    stdout: str
    stderr: str


class Client:
    """One agent CLI. Subclasses set ``name``/``binary``/``route`` and build the command and environment."""

    name = ""
    binary = ""
    route = ""  # the fake upstream route the client's generation requests use

    def __init__(self, home: Path) -> None:
        self.home = home
        self.work = home / "work"
        self.work.mkdir(parents=True, exist_ok=True)

    def executable(self) -> str:
        found = find_binary(self.binary)
        if found is None:
            raise FileNotFoundError(self.binary)
        return found

    def configure(self, base_url: str) -> None:
        """Write the client's configuration pointing at ``base_url`` (no ``/v1``)."""

    def env(self, base_url: str) -> dict[str, str]:
        keep = ("PATH", "LANG", "TERM", "SYSTEMROOT", "TMPDIR")
        env = {k: v for k, v in os.environ.items() if k in keep}
        env["PATH"] = f"{npm_bin_dir()}{os.pathsep}{env.get('PATH', '/usr/bin:/bin')}"
        env["HOME"] = str(self.home)
        env["NO_COLOR"] = "1"
        return env

    def command(self, prompt: str, resume: bool) -> list[str]:
        raise NotImplementedError

    def run(self, base_url: str, prompt: str, resume: bool = False) -> RunOutput:
        """Run one prompt to completion (raises ``subprocess.TimeoutExpired`` after :data:`RUN_TIMEOUT`)."""
        self.configure(base_url)
        proc = subprocess.run(
            self.command(prompt, resume),
            cwd=self.work,
            env=self.env(base_url),
            stdin=subprocess.DEVNULL,
            capture_output=True,
            text=True,
            timeout=RUN_TIMEOUT,
        )
        return RunOutput(proc.returncode, ANSI.sub("", proc.stdout).strip(), proc.stderr)


class ClaudeCode(Client):
    """``claude -p`` (Anthropic Messages via ``ANTHROPIC_BASE_URL``)."""

    name = "claude-code"
    binary = "claude"
    route = "messages"

    def env(self, base_url: str) -> dict[str, str]:
        env = super().env(base_url)
        env.update(
            IS_SANDBOX="1",  # lets --dangerously-skip-permissions run as root (CI containers)
            CLAUDE_CONFIG_DIR=str(self.home / "claude"),
            ANTHROPIC_BASE_URL=base_url,
            ANTHROPIC_API_KEY=API_KEY_ANTHROPIC,
            DISABLE_AUTOUPDATER="1",
            DISABLE_TELEMETRY="1",
            DISABLE_ERROR_REPORTING="1",
        )
        return env

    def command(self, prompt: str, resume: bool) -> list[str]:
        cont = ["--continue"] if resume else []
        return [self.executable(), "-p", *cont, prompt, "--dangerously-skip-permissions"]


class Codex(Client):
    """``codex exec`` with a custom Responses provider (``wire_api = "responses"``) in a private ``CODEX_HOME``.

    The model is pinned to ``gpt-5.2-codex``: Codex 0.171's default (``gpt-6.2-sol``) sends a "responses lite" body
    whose tools are a code-mode JavaScript tool the fake cannot script."""

    name = "codex"
    binary = "codex"
    route = "responses"

    def configure(self, base_url: str) -> None:
        codex_home = self.home / "codex"
        codex_home.mkdir(exist_ok=True)
        (codex_home / "config.toml").write_text(
            'model = "gpt-5.2-codex"\n'
            'model_provider = "agentcache"\n'
            "[model_providers.agentcache]\n"
            'name = "agentcache"\n'
            f'base_url = "{base_url}/v1"\n'
            'env_key = "AGENTCACHE_TEST_OPENAI_KEY"\n'
            'wire_api = "responses"\n'
        )

    def env(self, base_url: str) -> dict[str, str]:
        env = super().env(base_url)
        env.update(CODEX_HOME=str(self.home / "codex"), AGENTCACHE_TEST_OPENAI_KEY=API_KEY_OPENAI)
        return env

    def command(self, prompt: str, resume: bool) -> list[str]:
        base = [self.executable(), "exec", "--dangerously-bypass-approvals-and-sandbox", "--skip-git-repo-check"]
        return [*base, "resume", "--last", prompt] if resume else [*base, prompt]


class OpenCode(Client):
    """``opencode run`` with its Anthropic provider's ``baseURL`` pointed at the URL (``opencode.json``)."""

    name = "opencode"
    binary = "opencode"
    route = "messages"

    def configure(self, base_url: str) -> None:
        config = {
            "$schema": "https://opencode.ai/config.json",
            "provider": {"anthropic": {"options": {"baseURL": f"{base_url}/v1", "apiKey": API_KEY_ANTHROPIC}}},
            "model": "anthropic/claude-sonnet-4-5",
            "autoupdate": False,
            "share": "disabled",
        }
        (self.work / "opencode.json").write_text(json.dumps(config, indent=2))

    def env(self, base_url: str) -> dict[str, str]:
        env = super().env(base_url)
        for kind in ("DATA", "CONFIG", "CACHE", "STATE"):
            env[f"XDG_{kind}_HOME"] = str(self.home / "xdg" / kind.lower())
        env.update(OPENCODE_DISABLE_MODELS_FETCH="1", OPENCODE_DISABLE_AUTOUPDATE="1")
        return env

    def command(self, prompt: str, resume: bool) -> list[str]:
        cont = ["--continue"] if resume else []
        return [self.executable(), "run", *cont, prompt]


class QwenCode(Client):
    """``qwen`` one-shot (a positional prompt) in OpenAI Chat Completions mode (``--auth-type openai``, the
    ``OPENAI_*`` variables), or Anthropic Messages mode with ``auth = "anthropic"`` (``ANTHROPIC_*``); its home is
    ``~/.qwen`` under the run's home. ``--approval-mode yolo`` runs tools without asking. Not in :data:`CLIENTS`
    (the proxy comparisons there do not cover it yet)."""

    name = "qwen-code"
    binary = "qwen"
    route = "chat"
    auth = "openai"
    models: ClassVar[dict[str, str]] = {"openai": "qwen3-coder-plus", "anthropic": "claude-sonnet-4-5"}

    def env(self, base_url: str) -> dict[str, str]:
        env = super().env(base_url)
        env["QWEN_CODE_SUPPRESS_YOLO_WARNING"] = "1"
        if self.auth == "anthropic":
            env.update(ANTHROPIC_BASE_URL=base_url, ANTHROPIC_API_KEY=API_KEY_ANTHROPIC)
        else:
            env.update(OPENAI_BASE_URL=f"{base_url}/v1", OPENAI_API_KEY=API_KEY_OPENAI)
        return env

    def command(self, prompt: str, resume: bool) -> list[str]:
        cont = ["--continue"] if resume else []
        model = ["--auth-type", self.auth, "--model", self.models[self.auth]]
        return [self.executable(), *model, "--approval-mode", "yolo", *cont, prompt]


CLIENTS: dict[str, type[Client]] = {c.name: c for c in (ClaudeCode, Codex, OpenCode)}
