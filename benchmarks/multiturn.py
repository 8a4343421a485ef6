"""Multi-turn cache benchmark: replay tau-bench sessions through ``agentcache serve`` in several cache configs
and write one results table (completed requests, errors, prompt and cached tokens as the server reported them,
TTFT p50/p95/p99, total time).

On a GPU box (SGLang; no internet needed)::

    python benchmarks/multiturn.py --engine sglang --model /models/Qwen3-8B --engine-python ~/sglang/bin/python \\
        --concurrency 16,32,48 --sessions 96 --max-turns 8 --out results.md

  configs: ``radix-off`` (``--no-prefix-cache``), ``L1`` (radix cache only), ``L1+L2`` (HiCache ``--l2 2``),
  ``L1+L2+session`` (HiCache + session-aware eviction; requests carry ``session_id``, sessions are closed).
  A model directory holding only ``config.json`` works too: SGLang gets ``--load-format dummy`` (random weights
  of the real shapes) and, without tokenizer files, ``--skip-tokenizer-init``; prompts then go to ``/generate``
  as token ids (tiktoken ids folded into the model's ``vocab_size``).

Here (CPU, llama.cpp + SmolLM2; small numbers)::

    python benchmarks/multiturn.py --engine llama.cpp --sessions 8 --concurrency 4 --max-turns 3 --max-tokens 8

  configs: ``cache-off`` (``--no-prefix-cache``), ``cache-on`` (per-slot prompt cache, requests go wherever
  llama.cpp puts them), ``cache-on+affinity`` (each session pinned to its own slot with ``id_slot``).

Each config starts a fresh ``agentcache serve`` (so no config inherits another's cache), waits for its "ready"
line, replays, and stops it with SIGTERM. On the GPU box the ``LMCache`` config is ``--l3 lmcache --l2 16GB``
(SGLang ``--enable-lmcache`` and an ``lmcache server`` with 16 GB of CPU memory).

Without a GPU (``--planned``), the three configs of the pre-launch checklist (no cache, the engine's prefix cache,
LMCache tiered) are estimated with ``agentcache plan``'s radix tree and cost model instead, with five figures per
config: hit tokens, cache read time, prefill time, TTFT p50/p95/p99, completed requests. Every timing input is an
assumption (``--prefill-tps``, ``--l2-gbps``, ``--kv-bytes-per-token``; defaults: Qwen3-8B bf16 KV, 147,456
bytes/token) and the tiers' semantics hold by contract, not by measurement::

    python benchmarks/multiturn.py --planned --gpu-tokens 10240,40960
"""

from __future__ import annotations

import argparse
import json
import os
import signal
import socket
import subprocess
import sys
import tempfile
import threading
import time
from dataclasses import dataclass
from pathlib import Path

ROOT = Path(__file__).resolve().parent.parent
sys.path.insert(0, str(ROOT))

from agentcache.loaders import load  # noqa: E402
from agentcache.replay import ReplayConfig, ReplayResult, markdown_table, replay  # noqa: E402

TAU = ROOT / "data" / "tau-bench" / "gpt-4o-airline.json"


@dataclass(frozen=True)
class Config:
    """One benchmark config: its name, ``agentcache serve`` flags, and how the replay sends."""

    name: str
    serve_flags: tuple[str, ...]
    via: str


CONFIGS: dict[str, tuple[Config, ...]] = {
    "sglang": (
        Config("radix-off", ("--no-prefix-cache",), "direct"),
        Config("L1", ("--no-session-cache",), "direct"),
        Config("L1+L2", ("--no-session-cache", "--l2", "2"), "direct"),
        Config("L1+L2+session", ("--l2", "2"), "agentcache"),
        Config("LMCache", ("--l3", "lmcache", "--l2", "16GB"), "agentcache"),
    ),
    "llama.cpp": (
        Config("cache-off", ("--no-prefix-cache",), "direct"),
        Config("cache-on", (), "direct"),
        Config("cache-on+affinity", (), "agentcache"),
    ),
}


def free_base_port(width: int = 4) -> int:
    """A port P with P..P+width free on loopback."""
    for _ in range(200):
        with socket.socket() as sock:
            sock.bind(("127.0.0.1", 0))
            base: int = sock.getsockname()[1]
        if base + width < 65000 and all(_free(base + i) for i in range(width)):
            return base
    raise RuntimeError("no free port range")


def _free(port: int) -> bool:
    with socket.socket() as sock:
        try:
            sock.bind(("127.0.0.1", port))
        except OSError:
            return False
    return True


def model_extras(model: str) -> tuple[list[str], str, int | None]:
    """SGLang arguments and replay api for a model directory: ``--load-format dummy`` without weights,
    ``--skip-tokenizer-init`` (and ``/generate`` token ids) without a tokenizer."""
    path = Path(model)
    if not path.is_dir():
        return [], "openai", None
    extra: list[str] = []
    if not any(path.glob("*.safetensors")) and not any(path.glob("*.bin")):
        extra += ["--load-format", "dummy"]
    tokenizer = any((path / n).exists() for n in ("tokenizer.json", "tokenizer.model", "tokenizer_config.json"))
    if tokenizer:
        return extra, "openai", None
    config = json.loads((path / "config.json").read_text())
    vocab = config.get("vocab_size") or (config.get("text_config") or {}).get("vocab_size") or 32000
    return [*extra, "--skip-tokenizer-init"], "sglang", int(vocab)


class Served:
    """``agentcache serve`` as a context manager: started, ready (its "ready" line on stderr), stopped."""

    def __init__(self, argv: list[str], timeout: float) -> None:
        self.argv = argv
        self.timeout = timeout
        self.ready = threading.Event()
        self.lines: list[str] = []
        self.proc: subprocess.Popen[str] | None = None

    def _read(self) -> None:
        assert self.proc is not None and self.proc.stderr is not None
        for line in self.proc.stderr:
            self.lines.append(line.rstrip())
            if "agentcache serve: ready" in line:
                self.ready.set()

    def __enter__(self) -> Served:
        self.proc = subprocess.Popen(self.argv, stdout=subprocess.DEVNULL, stderr=subprocess.PIPE, text=True)
        threading.Thread(target=self._read, daemon=True).start()
        deadline = time.monotonic() + self.timeout
        while not self.ready.wait(0.5):
            if self.proc.poll() is not None or time.monotonic() > deadline:
                self.__exit__()
                raise RuntimeError("agentcache serve did not become ready:\n" + "\n".join(self.lines[-30:]))
        return self

    def __exit__(self, *exc: object) -> None:
        if self.proc is not None and self.proc.poll() is None:
            self.proc.send_signal(signal.SIGTERM)
            try:
                self.proc.wait(timeout=60)
            except subprocess.TimeoutExpired:
                self.proc.kill()
                self.proc.wait()


def run(args: argparse.Namespace) -> list[ReplayResult]:
    records = load(args.data).records
    extra, api, vocab = model_extras(args.model) if args.engine == "sglang" else ([], "openai", None)
    wanted = set(args.configs.split(",")) if args.configs else None
    results: list[ReplayResult] = []
    for concurrency in [int(c) for c in str(args.concurrency).split(",")]:
        for config in CONFIGS[args.engine]:
            if wanted is not None and config.name not in wanted:
                continue
            port = free_base_port(width=args.workers + 3)
            logs = Path(tempfile.mkdtemp(prefix=f"multiturn-{config.name}-"))
            argv = [sys.executable, "-m", "agentcache", "serve", args.model, "--engine", args.engine,
                    "--port", str(port), "--log-dir", str(logs), *config.serve_flags,
                    "--proxy" if args.proxy else "--no-proxy"]  # fmt: skip
            if args.engine == "llama.cpp":
                argv += ["--sessions", str(concurrency), "--ctx-per-session", str(args.ctx_per_session)]
            else:
                argv += ["--workers", str(args.workers), "--engine-python", args.engine_python]
            engine_extra = extra + list(args.engine_arg or [])
            if engine_extra:
                argv += ["--", *engine_extra]
            label = f"{config.name} @{concurrency}"
            print(f"multiturn: {label}: {' '.join(argv[3:])}", file=sys.stderr, flush=True)
            with Served(argv, args.ready_timeout):
                replay_config = ReplayConfig(
                    f"http://127.0.0.1:{port}", api=api, concurrency=concurrency, via=config.via,
                    max_tokens=args.max_tokens, max_turns=args.max_turns, max_sessions=args.sessions,
                    vocab_size=vocab, label=label, timeout=args.timeout,
                )  # fmt: skip
                result = replay(records, replay_config)
            print(f"multiturn: {label}: {result.completed}/{len(result.turns)} completed, "
                  f"{result.cached_tokens}/{result.prompt_tokens} cached, {result.total_s:.1f}s",
                  file=sys.stderr, flush=True)  # fmt: skip
            results.append(result)
    return results


def planned(args: argparse.Namespace) -> str:
    """The three-config comparison estimated by the planner (see the module docstring), as a Markdown table."""
    from agentcache.plan import CostModel, schedule
    from agentcache.plan._tokens import BlockRenderer
    from benchmarks.subagents import subagent_fanout

    records = subagent_fanout() if args.data == "fanout" else load(args.data).records
    render = BlockRenderer()
    prompts = [render(r) for r in records]
    steps, timing = schedule([r.session for r in records], [r.at for r in records], prompts, args.rate, 4)
    cost = CostModel(args.prefill_tps, args.kv_bytes_per_token, args.l2_gbps, args.l2_gbps)
    out = []
    for gpu in [int(g) for g in str(args.gpu_tokens).split(",")]:
        out.append(_planned_table(steps, timing, gpu, cost, args))
    return "\n\n".join(out)


def _planned_table(steps: list, timing: str, gpu: int, cost: object, args: argparse.Namespace) -> str:  # type: ignore[type-arg]
    from agentcache.plan import PlanConfig, percentile, simulate

    configs = [
        ("no cache", PlanConfig(0), 64),
        ("engine prefix cache (L1, session-aware)", PlanConfig(gpu, 0, 0, "session"), 64),
        # LMCache keeps KV in the lmcache server's CPU memory, modelled as an L2 (its 256-token chunks are not:
        # pages of 64 throughout, so the tiered config's hits are an upper bound by up to a chunk per request).
        ("LMCache tiered (L1 + CPU)", PlanConfig(gpu, args.lmcache_tokens, 0, "session"), 64),
    ]
    lines = [
        f"workload: {len(steps)} requests ({timing}); GPU KV pool {gpu:,} tokens; assumed prefill "
        f"{args.prefill_tps:g} tokens/s, CPU->GPU {args.l2_gbps:g} GB/s, {args.kv_bytes_per_token:,} KV bytes/token",
        "",
        "| config | hit tokens | cache read s | prefill s | TTFT p50/p95/p99 s | completed |",
        "|---|---:|---:|---:|---:|---:|",
    ]
    for name, config, page in configs:
        r = simulate(steps, config, page, cost=cost)  # type: ignore[arg-type]
        ttft = "/".join(f"{percentile(r.ttft_s, q):.2f}" for q in (50, 95, 99))
        lines.append(
            f"| {name} | {r.hit_tokens:,} | {r.fetch_s or 0:.2f} | {r.prefill_s or 0:.1f} | {ttft} | "
            f"{r.completed}/{r.requests} |"
        )
    return "\n".join(lines)


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("--engine", choices=sorted(CONFIGS), default="llama.cpp")
    parser.add_argument("--model", help="model directory / hub id (SGLang) or GGUF file (default: SmolLM2)")
    parser.add_argument("--data", default=str(TAU), help="recorded sessions (any agentcache format)")
    parser.add_argument("--sessions", type=int, default=8)
    parser.add_argument("--concurrency", default="4", help="one or more, comma-separated (e.g. 16,32,48)")
    parser.add_argument("--max-turns", type=int, default=3)
    parser.add_argument("--max-tokens", type=int, default=8)
    parser.add_argument("--configs", help="comma-separated subset of config names")
    parser.add_argument("--workers", type=int, default=1, help="SGLang engines behind the router")
    parser.add_argument("--engine-python", default=os.environ.get("AGENTCACHE_ENGINE_PYTHON", "python3"))
    parser.add_argument("--engine-arg", action="append", help="extra engine argument (repeatable)")
    parser.add_argument("--ctx-per-session", type=int, default=8192)
    parser.add_argument("--proxy", action="store_true", help="put the agentcache proxy in front")
    parser.add_argument("--ready-timeout", type=float, default=1800.0)
    parser.add_argument("--timeout", type=float, default=1800.0, help="seconds per request")
    parser.add_argument("--out", help="write the Markdown table here")
    parser.add_argument("--json", help="write every result (per request) here")
    parser.add_argument("--planned", action="store_true", help="estimate the 3 configs with the planner (no GPU)")
    parser.add_argument("--gpu-tokens", default="10240,40960", help="--planned: GPU KV pool sizes, tokens")
    parser.add_argument("--lmcache-tokens", type=int, default=400_000, help="--planned: LMCache CPU tier, tokens")
    parser.add_argument("--prefill-tps", type=float, default=8000.0, help="--planned: assumed prefill tokens/s")
    parser.add_argument("--l2-gbps", type=float, default=20.0, help="--planned: assumed CPU->GPU GB/s")
    parser.add_argument("--kv-bytes-per-token", type=int, default=147_456, help="--planned: Qwen3-8B bf16")
    parser.add_argument("--rate", type=float, default=1.0, help="--planned: requests/s without timestamps")
    args = parser.parse_args()
    if args.planned:
        if args.data == str(TAU):
            args.data = "fanout"
        table = planned(args)
        print(table)
        if args.out:
            Path(args.out).write_text(table + "\n")
        return
    if args.model is None:
        if args.engine == "sglang":
            parser.error("--model is required with --engine sglang")
        from agentcache.serve.llama import smollm2_model_path

        found = smollm2_model_path()
        if found is None:
            parser.error("SmolLM2 GGUF not found: run scripts/build-llama-server --with-model, or pass --model")
        args.model = str(found)
    results = run(args)
    table = markdown_table(results)
    print(table)
    if args.out:
        Path(args.out).write_text(table + "\n")
    if args.json:
        Path(args.json).write_text(json.dumps([r.to_dict() for r in results], indent=2) + "\n")
    sys.exit(0 if all(r.errors == 0 for r in results) else 1)


if __name__ == "__main__":
    main()
