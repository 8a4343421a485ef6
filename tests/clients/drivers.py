"""Drive real agent CLIs non-interactively against a base URL, each in its own throw-away home and work directory.

Two builds of each client (:data:`BUILDS`): ``pinned``, the versions ``.ci/run`` pins, from PATH or the npm cache
``${AGENTCACHE_CACHE_DIR:-~/.cache/agentcache}/npm``; and ``newest``, whatever npm served when ``.ci/run`` last ran,
in ``.../npm-newest`` (else ``.../npm-latest``, the newest tried), so a release that breaks a session shows up the
day it ships. aider (``aider-chat`` from
PyPI, which pins many packages) lives in its own virtual environment ``.../aider``, newest only. A driver never
touches the user's own configuration: Claude Code gets ``CLAUDE_CONFIG_DIR``, Codex ``CODEX_HOME``, opencode the
``XDG_*`` directories, Qwen Code and aider the run's ``HOME``.

Each client runs its scenarios in one home (:data:`SCENARIOS` by default): a fresh run, continues/resumes of it, a
fresh run with the same opening prompt, and a run whose agent spawns a subagent. The fake upstream's directives
(:mod:`tests.clients.fake_upstream`) make each loop through one tool call. :meth:`Client.role` tells which of a
run's requests are its main loop, a subagent's, or a side request (a title).
"""

from __future__ import annotations

import json
import os
import re
import shutil
import subprocess
from dataclasses import dataclass
from pathlib import Path
from typing import Any, ClassVar

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
RUN_TIMEOUT = 300.0  # Qwen Code takes 20-45 s to its first request on a loaded 2-core machine
#: ``pinned``: the versions ``.ci/run`` pins; ``newest``: what npm/PyPI served when it last ran.
BUILDS = ("pinned", "newest")


def cache_root() -> Path:
    """``$AGENTCACHE_CACHE_DIR``, else ``~/.cache/agentcache``: where ``.ci/run`` installs the clients."""
    return Path(os.environ.get("AGENTCACHE_CACHE_DIR") or str(Path.home() / ".cache" / "agentcache"))


def npm_bin_dir(build: str = "pinned", prefix: str | None = None) -> Path:
    """Where ``.ci/run`` installs the npm clients' executables of ``build`` (``prefix``: one of its prefixes)."""
    return cache_root() / (prefix or ("npm-newest" if build == "newest" else "npm")) / "node_modules" / ".bin"


def find_binary(name: str, build: str = "pinned") -> str | None:
    """The client's executable of ``build``, or ``None``: the pinned one on PATH or in the npm cache, the newest one
    in its own prefix only (``npm-newest``, else ``npm-latest``, the newest tried, where ``.ci/run`` has not run yet);
    aider: its virtual environment, for either build."""
    if name == "aider":
        return shutil.which(name, path=str(cache_root() / "aider" / "bin")) or shutil.which(name)
    if build == "newest":
        dirs = (npm_bin_dir(prefix="npm-newest"), npm_bin_dir(prefix="npm-latest"))
        return next((found for d in dirs if (found := shutil.which(name, path=str(d)))), None)
    return shutil.which(name) or shutil.which(name, path=str(npm_bin_dir()))


@dataclass
class RunOutput:
    """One CLI invocation: exit code and its stdout (ANSI colours stripped)."""

    returncode: int
    stdout: str
    stderr: str


class Client:
    """One agent CLI. Subclasses set ``name``/``binary``/``route`` and build the command and environment.
    ``scenarios``: what a test run drives (``(scenario, prompt, continues)``); ``declares``: the client sends its
    own session and parent ids (subagents can be linked to their parents); ``build``: which of :data:`BUILDS`."""

    name = ""
    binary = ""
    route = ""  # the fake upstream route the client's generation requests use
    scenarios: ClassVar[tuple[tuple[str, str, bool], ...]] = SCENARIOS
    declares = True

    def __init__(self, home: Path, build: str = "pinned") -> None:
        self.home = home
        self.build = build
        self.work = home / "work"
        self.work.mkdir(parents=True, exist_ok=True)

    def executable(self) -> str:
        found = find_binary(self.binary, self.build)
        if found is None:
            raise FileNotFoundError(self.binary)
        return found

    def version(self) -> str:
        """The client's version (``<binary> --version``, the first dotted number it prints)."""
        env = {**os.environ, "HOME": str(self.home)}
        out = subprocess.run([self.executable(), "--version"], capture_output=True, text=True, timeout=120, env=env)
        found = re.search(r"\d+\.\d+\.\d+", out.stdout + out.stderr)
        return found.group(0) if found else "unknown"

    def role(self, rec: Any) -> str:
        """``main``, ``sub`` or ``side`` for a generation request this client sent (``rec``: a
        :class:`~tests.clients.fake_upstream.Recorded`): the client's subagent header, else an agent loop carries
        tools."""
        body = rec.body if isinstance(rec.body, dict) else {}
        return "sub" if "x-parent-session-id" in rec.headers else ("main" if body.get("tools") else "side")

    def configure(self, base_url: str) -> None:
        """Write the client's configuration pointing at ``base_url`` (no ``/v1``)."""

    def env(self, base_url: str) -> dict[str, str]:
        keep = ("PATH", "LANG", "TERM", "SYSTEMROOT", "TMPDIR")
        env = {k: v for k, v in os.environ.items() if k in keep}
        found = find_binary(self.binary, self.build)
        bin_dir = Path(found).parent if found is not None else npm_bin_dir(self.build)
        env["PATH"] = f"{bin_dir}{os.pathsep}{env.get('PATH', '/usr/bin:/bin')}"
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

    def role(self, rec: Any) -> str:
        """A subagent sends ``x-claude-code-agent-id``; the main loop carries tools; the title request none."""
        body = rec.body if isinstance(rec.body, dict) else {}
        return "sub" if "x-claude-code-agent-id" in rec.headers else ("main" if body.get("tools") else "side")


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

    def role(self, rec: Any) -> str:
        """A spawned agent sends ``x-openai-subagent``; Codex sends no side requests here."""
        return "sub" if "x-openai-subagent" in rec.headers else "main"


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
    ``~/.qwen`` under the run's home. ``--approval-mode yolo`` runs tools without asking. Qwen Code declares no
    session: the proxy infers its conversations. Its subagent runs under its own system prompt, and after a run it
    may send a memory-extraction request (a side request carrying the conversation)."""

    name = "qwen-code"
    binary = "qwen"
    route = "chat"
    auth = "openai"
    declares = False
    models: ClassVar[dict[str, str]] = {"openai": "qwen3-coder-plus", "anthropic": "claude-sonnet-4-5"}
    scenarios = (SCENARIOS[0], SCENARIOS[1], SCENARIOS[3], SCENARIOS[4])

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

    def role(self, rec: Any) -> str:
        """By the system prompt: the subagent's says so, the memory extraction's too."""
        body = rec.body if isinstance(rec.body, dict) else {}
        system = json.dumps(body.get("system") or [m for m in body.get("messages") or [] if m.get("role") == "system"])
        if "memory extraction" in system:
            return "side"
        return "sub" if "subagent working for a parent agent" in system else "main"


class QwenCodeAnthropic(QwenCode):
    """Qwen Code in Anthropic Messages mode, asking for the 1-hour cache tier and the global cache scope
    (``generationConfig.cacheRetention: "1h"``, ``forceGlobalCacheScope``: its markers on tools, system and the
    newest user block carry ``ttl: "1h"``, those on tools and the static system ``scope: "global"``)."""

    name = "qwen-code-anthropic"
    route = "messages"
    auth = "anthropic"
    scenarios = (SCENARIOS[0], SCENARIOS[1])

    def configure(self, base_url: str) -> None:
        settings = {"model": {"generationConfig": {"cacheRetention": "1h", "forceGlobalCacheScope": True}}}
        (self.home / ".qwen").mkdir(parents=True, exist_ok=True)
        (self.home / ".qwen" / "settings.json").write_text(json.dumps(settings))


class Aider(Client):
    """``aider --message`` (aider-chat from PyPI, through litellm) with ``--cache-prompts``, in OpenAI Chat
    Completions mode (``--openai-api-base``). A continue is ``--restore-chat-history``: the chat read back from
    ``.aider.chat.history.md``, its whitespace rewritten. No git, no files, no tools: every chat opens with aider's
    example exchange, and it declares no session (the proxy infers its chats). ``LITELLM_LOCAL_MODEL_COST_MAP`` keeps
    litellm from fetching its price table."""

    name = "aider"
    binary = "aider"
    route = "chat"
    declares = False
    model = "openai/gpt-4.1"
    scenarios = (SCENARIOS[0], SCENARIOS[1], SCENARIOS[3])

    def env(self, base_url: str) -> dict[str, str]:
        env = super().env(base_url)
        env.update(LITELLM_LOCAL_MODEL_COST_MAP="True", AIDER_CHECK_UPDATE="false", AIDER_ANALYTICS="false")
        return env

    def command(self, prompt: str, resume: bool) -> list[str]:
        flags = ["--no-git", "--yes-always", "--no-check-update", "--no-show-release-notes", "--analytics-disable"]
        flags += ["--no-pretty", "--cache-prompts", "--model", self.model, *self._endpoint()]
        cont = ["--restore-chat-history"] if resume else []
        return [self.executable(), *flags, *cont, "--message", prompt]

    def _endpoint(self) -> list[str]:
        return ["--openai-api-base", f"{self._url}/v1", "--openai-api-key", API_KEY_OPENAI]

    def configure(self, base_url: str) -> None:
        self._url = base_url

    def role(self, rec: Any) -> str:
        """Every request is a chat's: aider sends no side requests without git or a repository map."""
        return "main"


class AiderAnthropic(Aider):
    """aider in Anthropic Messages mode (``ANTHROPIC_API_BASE``), on a model aider knows to mark
    (``--cache-prompts``: markers at the end of its example exchange and of the files turns)."""

    name = "aider-anthropic"
    route = "messages"
    model = "anthropic/claude-sonnet-4-20250514"
    scenarios = (SCENARIOS[0], SCENARIOS[1])

    def env(self, base_url: str) -> dict[str, str]:
        env = super().env(base_url)
        env.update(ANTHROPIC_API_BASE=base_url, ANTHROPIC_API_KEY=API_KEY_ANTHROPIC)
        return env

    def _endpoint(self) -> list[str]:
        return []


#: Every driven client set-up by name; :data:`PINNED` those the issue-11 tests also run directly against the fake.
CLIENTS: dict[str, type[Client]] = {
    c.name: c for c in (ClaudeCode, Codex, OpenCode, QwenCode, QwenCodeAnthropic, Aider, AiderAnthropic)
}
PINNED = ("claude-code", "codex", "opencode")
