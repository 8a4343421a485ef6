"""Baseline marker strategies: what users would otherwise do, as audit arms (``--compare``).

Each strategy takes the request as the client sent it, drops the client's markers and places its
own; none repairs anything.

* ``no_markers``: nothing cached.
* ``anthropic_auto``: Anthropic's automatic caching, a top-level ``cache_control`` (one breakpoint on
  the last cacheable block; platform.claude.com/docs/en/build-with-claude/prompt-caching).
* ``langchain``: LangChain's ``AnthropicPromptCachingMiddleware`` as this project models it: the last
  system block, the last tool and the message tail.
* ``litellm``: a LiteLLM ``cache_control_injection_points`` configuration of
  ``[{"location": "message", "role": "system"}, {"location": "message", "role": "user", "index": -1}]``:
  the system prompt and the last user message.
"""

from __future__ import annotations

from collections.abc import Callable

from agentcache.model._canonical import CanonicalRequest, Marker, with_markers

from .breakpoints import eligible

STRATEGIES = ("anthropic_auto", "langchain", "litellm", "no_markers")


def _last(req: CanonicalRequest, pred: Callable[[int], bool]) -> int | None:
    return next((i for i in range(len(req.blocks) - 1, -1, -1) if pred(i) and eligible(req, i)), None)


def _system(req: CanonicalRequest) -> int | None:
    return _last(req, lambda i: req.blocks[i].section == "system")


def _last_user(req: CanonicalRequest) -> int | None:
    users = [i for i, b in enumerate(req.blocks) if b.section == "message" and b.env.startswith(b'{"role":"user"')]
    if not users:
        return None
    msg = req.blocks[users[-1]].message
    return _last(req, lambda i: req.blocks[i].message == msg)


def apply_strategy(name: str, req: CanonicalRequest) -> CanonicalRequest:
    """``req`` with ``name``'s markers instead of the client's. Raises KeyError for an unknown name."""
    if name == "no_markers":
        return with_markers(req, {})
    if name == "anthropic_auto":
        return with_markers(req, {}, Marker())
    if name == "langchain":
        picks = [_system(req), _last(req, lambda i: req.blocks[i].section == "tool"), _last(req, lambda i: True)]
    elif name == "litellm":
        picks = [_system(req), _last_user(req)]
    else:
        raise KeyError(name)
    return with_markers(req, {i: Marker() for i in picks if i is not None})
