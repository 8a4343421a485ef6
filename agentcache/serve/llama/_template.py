"""Which chat template ``llama-server`` renders requests with, so that tool definitions reach the prompt.

SmolLM2's own chat template (the GGUF's ``tokenizer.chat_template``) never mentions ``tools``: the tool
definitions of a request are dropped, the prompt does not change when their order does, and tool-order repairs
cannot show on it. agentcache ships a ChatML template for SmolLM2 that renders the tools first (before the system
text, as Anthropic and OpenAI order their prefixes): :data:`TOOLS_FIRST_TEMPLATE`, used by the examples,
benchmarks and tests. Standard library only.
"""

from __future__ import annotations

from collections.abc import Sequence
from dataclasses import dataclass
from pathlib import Path

__all__ = ["TEMPLATE_FLAGS", "TOOLS_FIRST_TEMPLATE", "TemplateChoice", "choose_template"]

TOOLS_FIRST_TEMPLATE = Path(__file__).resolve().parent / "templates" / "tools_first.jinja"
"""agentcache's tools-first ChatML template for SmolLM2 (``agentcache/serve/llama/templates/tools_first.jinja``)."""

TEMPLATE_FLAGS = frozenset({"--chat-template", "--chat-template-file", "--no-jinja"})
"""``llama-server`` flags that choose the template themselves: given by the user, agentcache leaves it alone."""


@dataclass(frozen=True, slots=True)
class TemplateChoice:
    """``path``: the template file for ``--chat-template-file`` (None: the model's own, or the user's choice).
    ``note``: one line saying which template and why."""

    path: Path | None
    note: str


def choose_template(model: str | Path, extra_args: Sequence[str] = ()) -> TemplateChoice:
    """The chat template for serving GGUF ``model``: the user's (a template flag in ``extra_args``), the
    tools-first ChatML template for SmolLM2 (its own drops the tools), else the model's own (llama.cpp's
    Jinja engine, on by default, renders tools where that template does; ``GET /props``
    ``chat_template_caps.supports_tools`` tells)."""
    if any(arg.split("=", 1)[0] in TEMPLATE_FLAGS for arg in extra_args):
        return TemplateChoice(None, "llama.cpp: the chat template given on the command line")
    if "smollm2" in Path(model).name.lower():
        return TemplateChoice(
            TOOLS_FIRST_TEMPLATE,
            (
                "llama.cpp: SmolLM2's own chat template drops the tools; serving with agentcache's tools-first "
                f"ChatML template ({TOOLS_FIRST_TEMPLATE.name}), so tool definitions and their order reach the "
                "prompt (pass --chat-template-file to choose another)"
            ),
        )
    return TemplateChoice(
        None,
        (
            "llama.cpp: the model's own chat template; if it ignores tools, tool definitions and their "
            "order never reach the prompt (GET /props: chat_template_caps.supports_tools; pass "
            "--chat-template-file to choose another)"
        ),
    )
