"""A request as the engine sees it: its prompt token ids, through the model's chat template and tokenizer.

Two renderers, one shape (:class:`TokenRenderer`): ``await renderer.render(api, body)`` → token ids.

* :class:`LlamaServerRenderer` asks the running ``llama-server`` itself: ``POST /apply-template`` (the chat
  template the server was started with, ``--jinja``/``--chat-template-file`` included) then ``POST /tokenize``
  with ``add_special`` and ``parse_special`` on, as the server tokenizes a chat prompt
  (``tools/server/server-context.cpp``: ``tokenize_input_prompts(..., add_special=true, parse_special=true)``).
  Exact for what the server serves on ``/v1/chat/completions``.
* :class:`LocalRenderer` reads a Hugging Face model directory (``tokenizer.json`` with the ``tokenizers``
  library, the ``chat_template`` of ``tokenizer_config.json`` with ``jinja2``'s sandbox, as
  ``transformers``' ``apply_chat_template`` does): for planning without a server. Optional dependencies.

Anthropic Messages bodies are converted to OpenAI Chat first (:func:`agentcache.replay.convert`); llama.cpp's
own ``/v1/messages`` conversion may place text differently, so counts for that wire format are close, not exact.
"""

from __future__ import annotations

import json
from collections.abc import Mapping
from pathlib import Path
from typing import TYPE_CHECKING, Any, Protocol

from .._exceptions import InputError

if TYPE_CHECKING:
    import httpx  # an optional dependency (the proxy/sinks extras): imported where a server is asked

__all__ = ["LlamaServerRenderer", "LocalRenderer", "TokenRenderer", "chat_body"]


class TokenRenderer(Protocol):
    """Renders a request body to the prompt token ids an engine computes for it."""

    async def render(self, api: str, body: Mapping[str, Any]) -> list[int]:
        """Prompt token ids of ``body`` (wire format ``api``: ``openai.chat`` or ``anthropic.messages``)."""
        ...

    async def tokenize(self, text: str) -> list[int]:
        """Token ids of generated ``text`` (no special tokens added)."""
        ...


def chat_body(api: str, body: Mapping[str, Any]) -> dict[str, Any]:
    """``body`` as an OpenAI Chat body with only what the chat template reads (messages, tools, tool choice,
    template kwargs). Raises InputError for a wire format that cannot be converted."""
    from ..replay._convert import convert

    chat = convert(api, dict(body), "openai.chat")
    keep = ("messages", "tools", "tool_choice", "chat_template_kwargs", "parallel_tool_calls", "reasoning_format")
    return {k: chat[k] for k in keep if k in chat}


class LlamaServerRenderer:
    """Renders through a running ``llama-server`` at ``base_url`` (``/apply-template`` + ``/tokenize``); see the
    module docstring. ``client``: an ``httpx.AsyncClient`` to reuse (its base URL must be the server's).
    Raises ``httpx.HTTPError`` when the server cannot be reached or answers an error."""

    def __init__(self, base_url: str = "", *, client: httpx.AsyncClient | None = None, timeout: float = 30.0):
        import httpx

        self._own = client is None
        self.client = client or httpx.AsyncClient(base_url=base_url, timeout=timeout, trust_env=False)

    async def _post(self, path: str, doc: dict[str, Any]) -> Any:
        import httpx

        for attempt in range(2):
            try:
                response = await self.client.post(path, json=doc)
                break
            except (httpx.RemoteProtocolError, httpx.ReadError):
                # a pooled keep-alive connection llama-server had just closed (it closes them after 5 s idle)
                if attempt:
                    raise
        response.raise_for_status()
        return response.json()

    async def _tokens(self, text: str, add_special: bool) -> list[int]:
        doc = await self._post("/tokenize", {"content": text, "add_special": add_special, "parse_special": True})
        return [int(t) for t in doc["tokens"]]

    async def prompt(self, api: str, body: Mapping[str, Any]) -> str:
        """The prompt text the server's chat template makes of ``body``."""
        return str((await self._post("/apply-template", chat_body(api, body)))["prompt"])

    async def render(self, api: str, body: Mapping[str, Any]) -> list[int]:
        return await self._tokens(await self.prompt(api, body), True)

    async def tokenize(self, text: str) -> list[int]:
        return await self._tokens(text, False)

    async def aclose(self) -> None:
        """Close the HTTP client if this renderer made it."""
        if self._own:
            await self.client.aclose()


class LocalRenderer:
    """Renders with a local Hugging Face model directory: ``tokenizer.json`` (``tokenizers``) and the
    ``chat_template`` in ``tokenizer_config.json`` (``jinja2`` sandbox, ``add_generation_prompt`` on).
    ``add_bos``: prepend the tokenizer's BOS token id as llama.cpp does for models whose GGUF says so.

    Raises InputError when the directory lacks either file or a chat template, ImportError without the
    ``tokenizers``/``jinja2`` packages."""

    def __init__(self, model_dir: str | Path, *, add_bos: bool = False) -> None:
        from jinja2.sandbox import ImmutableSandboxedEnvironment
        from tokenizers import Tokenizer

        root = Path(model_dir)
        try:
            config = json.loads((root / "tokenizer_config.json").read_text(encoding="utf-8"))
            self.tokenizer = Tokenizer.from_file(str(root / "tokenizer.json"))
        except Exception as exc:  # OSError, JSON errors, and the plain Exception tokenizers raises
            raise InputError(
                f"{root}: not a model directory with tokenizer.json and tokenizer_config.json: {exc}"
            ) from exc
        template = config.get("chat_template")
        if isinstance(template, list):  # named templates: the default one
            template = next((t.get("template") for t in template if t.get("name") == "default"), None)
        if not isinstance(template, str):
            raise InputError(f"{root}: tokenizer_config.json has no chat_template")
        env = ImmutableSandboxedEnvironment(trim_blocks=True, lstrip_blocks=True)
        env.filters["tojson"] = _tojson
        env.globals["raise_exception"] = _raise
        self._template = env.from_string(template)
        self.special = {k: _token_text(config.get(k)) for k in ("bos_token", "eos_token")}
        bos = self.special.get("bos_token")
        self._bos = self.tokenizer.token_to_id(bos) if add_bos and bos else None

    def prompt(self, api: str, body: Mapping[str, Any]) -> str:
        """The prompt text the chat template makes of ``body``."""
        chat = chat_body(api, body)
        return str(
            self._template.render(
                messages=chat.get("messages", []),
                tools=chat.get("tools"),
                add_generation_prompt=True,
                **{k: v for k, v in self.special.items() if v},
                **(chat.get("chat_template_kwargs") or {}),
            )
        )

    def render_sync(self, api: str, body: Mapping[str, Any]) -> list[int]:
        """:meth:`render`, blocking."""
        ids = list(self.tokenizer.encode(self.prompt(api, body), add_special_tokens=False).ids)
        return [self._bos, *ids] if self._bos is not None else ids

    async def render(self, api: str, body: Mapping[str, Any]) -> list[int]:
        return self.render_sync(api, body)

    async def tokenize(self, text: str) -> list[int]:
        return list(self.tokenizer.encode(text, add_special_tokens=False).ids)


def _tojson(value: Any, indent: int | None = None, **_: Any) -> str:
    return json.dumps(value, ensure_ascii=False, indent=indent)


def _raise(message: str) -> None:
    raise InputError(f"chat template: {message}")


def _token_text(value: Any) -> str | None:
    if isinstance(value, dict):
        return str(value.get("content")) if value.get("content") is not None else None
    return value if isinstance(value, str) else None
