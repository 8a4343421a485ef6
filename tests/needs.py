"""Why a test skips: one reason per component the full suite needs and a machine may lack (tests/README.md lists
them, with how to get each). Tests skip with these reasons, so the run's summary counts skips per component
(``119 needs SGLang ...``) instead of per wording; :func:`component` maps ``pytest.importorskip``'s own reasons the
same way."""

from __future__ import annotations

import re

__all__ = ["CHROMIUM", "LLAMA", "NOT_APPLICABLE", "REDIS", "SGLANG", "SGLANG_WHEEL", "agent_cli", "component", "extra"]

SGLANG = "needs SGLang: sglang and (CPU) torch importable (not in CI; see tests/README.md)"
SGLANG_WHEEL = "needs the sglang wheel: downloaded from PyPI once into ~/.cache/agentcache/wheels (offline?)"
LLAMA = "needs llama.cpp: llama-server and the SmolLM2 GGUF (scripts/build-llama-server --with-model)"
CHROMIUM = "needs Chromium and its driver (apt-get install chromium chromium-driver)"
REDIS = "needs redis-server (apt-get install redis-server)"
#: Not a missing component: the test does not apply to what it was given (a client that sends no such message).
NOT_APPLICABLE = "does not apply"

#: The Python packages tests import, by the extra that installs them.
_EXTRAS = {
    "anthropic": "sdk",
    "openai": "sdk",
    "starlette": "proxy",
    "uvicorn": "proxy",
    "prometheus_client": "sinks",
    "httpx": "sinks",
    "redis": "redis",
    "tokenizers": "dev",
    "selenium": "dev",
    "opentelemetry": "otel",
    "langchain": "frameworks",
    "litellm": "frameworks",
}
_IMPORT = re.compile(r"could not import '([\w.]+)'")


def agent_cli(binary: str, build: str = "pinned") -> str:
    """The reason for a missing agent CLI (``claude``, ``codex``, ``opencode``, ``qwen``; ``aider`` from PyPI) of
    ``build`` (``pinned``, or ``newest``: what npm/PyPI served when .ci/run last ran)."""
    where = "PyPI" if binary == "aider" else "npm"
    newest = ", its newest release" if build == "newest" else ""
    return f"needs the {binary} CLI ({where}{newest}; .ci/run installs it)"


def extra(name: str) -> str:
    """The reason for a missing extra (``proxy``, ``sdk``, ``frameworks``...)."""
    return f"needs the '{name}' extra (pip install -e '.[dev]' installs every extra the tests use)"


def component(reason: str) -> str:
    """``reason`` as its component's reason: an importorskip's ``could not import 'openai': ...`` becomes the
    extra that installs ``openai``; any other reason is kept."""
    found = _IMPORT.search(reason)
    if found is None:
        return reason
    module = found.group(1).split(".")[0]
    return extra(_EXTRAS.get(module, "dev"))
