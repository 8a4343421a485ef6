"""The ``llama-server`` command line, as data: :class:`LlamaOptions` says how the server is set up and
:func:`llama_server_argv` turns it into the argv for a binary, a model, a host and a port. Pure; nothing is
started, and this is the only place that spells llama-server's flags.

Both launchers build their command here: :class:`~agentcache.serve.llama.LlamaServer` (tests, examples,
benchmarks) and ``agentcache serve``'s plan (:func:`agentcache.serve._build.llama_options`). The flags are those
of the ``llama-server --help`` of the llama.cpp that ``scripts/build-llama-server`` builds (llama-cpp-python
0.3.36's vendored copy):

- ``--parallel N``: N slots, each a separate sequence with its own prompt cache;
- ``--ctx-size C``: context over all slots (each slot gets ``C / N`` tokens);
- ``--kv-unified`` / ``--no-kv-unified``: one KV buffer shared by the slots, or one per slot (so slots do not
  evict each other's KV);
- ``--metrics``: Prometheus ``/metrics``;
- ``--no-cache-prompt``: no per-slot prompt cache (on by default);
- ``--cache-ram MiB``: the host-memory prompt cache (0 turns it off);
- ``--chat-template-file FILE``: a Jinja chat template instead of the model's own.
"""

from __future__ import annotations

from dataclasses import dataclass
from pathlib import Path

__all__ = ["LOOPBACK", "RESERVED_ARGS", "LlamaOptions", "llama_server_argv"]

LOOPBACK = "127.0.0.1"
"""The only address a :class:`~agentcache.serve.llama.LlamaServer` binds, and the default host."""

RESERVED_ARGS = frozenset({"--host", "--port", "-m", "--model"})
"""Options :func:`llama_server_argv` sets from its own arguments; repeated in ``extra_args`` they would
override the model, host or port."""


@dataclass(frozen=True, slots=True)
class LlamaOptions:
    """How a ``llama-server`` is set up, apart from its binary, model and address.

    ``None`` (and the defaults) leave llama-server's own default, and emit no flag.

    Attributes:
        parallel: number of slots (``--parallel``).
        ctx_size: context over all slots (``--ctx-size``); a slot gets ``ctx_size / parallel`` tokens.
        kv_unified: ``True`` ``--kv-unified``, ``False`` ``--no-kv-unified`` (one KV sequence per slot).
        metrics: ``--metrics`` (the ``/metrics`` endpoint).
        cache_prompt: ``False`` is ``--no-cache-prompt`` (prompt caching is on by default).
        cache_ram_mib: the host-memory prompt cache in MiB (``--cache-ram``; 0 turns it off).
        chat_template_file: a Jinja chat template (``--chat-template-file``) instead of the model's own.
        extra_args: further arguments, appended last, verbatim.
    """

    parallel: int | None = None
    ctx_size: int | None = None
    kv_unified: bool | None = None
    metrics: bool = False
    cache_prompt: bool = True
    cache_ram_mib: int | None = None
    chat_template_file: Path | None = None
    extra_args: tuple[str, ...] = ()

    def flags(self) -> list[str]:
        """The flags for these options, in a fixed order, ``extra_args`` last."""
        flags: list[str] = []
        if self.parallel is not None:
            flags += ["--parallel", str(self.parallel)]
        if self.ctx_size is not None:
            flags += ["--ctx-size", str(self.ctx_size)]
        if self.kv_unified is not None:
            flags.append("--kv-unified" if self.kv_unified else "--no-kv-unified")
        if self.metrics:
            flags.append("--metrics")
        if not self.cache_prompt:
            flags.append("--no-cache-prompt")
        if self.cache_ram_mib is not None:
            flags += ["--cache-ram", str(self.cache_ram_mib)]
        if self.chat_template_file is not None:
            flags += ["--chat-template-file", str(self.chat_template_file)]
        return flags + list(self.extra_args)


def llama_server_argv(
    binary: str | Path, model: str | Path, port: int, options: LlamaOptions, *, host: str = LOOPBACK
) -> list[str]:
    """The full ``llama-server`` command line: ``binary --model MODEL --host HOST --port PORT`` and then
    :meth:`LlamaOptions.flags`."""
    return [str(binary), "--model", str(model), "--host", host, "--port", str(port), *options.flags()]
