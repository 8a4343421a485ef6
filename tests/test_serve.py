"""``agentcache serve`` without processes: option parsing, the plan (argv, env, ports, stages), pre-flight
checks on described machines, and ``--dry-run`` through the CLI."""

from __future__ import annotations

import shlex
from dataclasses import fields, replace
from pathlib import Path

import pytest
from typer.testing import CliRunner

from agentcache import ConfigError
from agentcache import _cli as cli
from agentcache.serve import (
    EXIT_PREFLIGHT,
    L2,
    L3,
    Machine,
    ServeOptions,
    Toolchain,
    build_plan,
    check,
    format_plan,
    parse_l2,
    parse_l3,
)
from agentcache.serve._build import llama_options, proxy_argv
from agentcache.serve._sglang import FILE_DIR_ENV
from agentcache.serve.llama import INSTALL_HINT, LlamaServer

GIB = 1024**3
GPU_BOX = Machine(gpus_mib=(81920, 81920), mem_available=512 * GIB, sglang=True, sglang_router=True, mooncake=True,
                  smg="/usr/bin/smg", mooncake_master="/usr/bin/mooncake_master", proxy=True)  # fmt: skip


def never_busy(host: str, port: int) -> bool:
    return False


def test_parse_l2_ratio_and_size() -> None:
    assert parse_l2("2") == L2(ratio=2.0)
    assert parse_l2("1.5x") == L2(ratio=1.5)
    assert parse_l2("16GB") == L2(size_gb=16.0)
    assert parse_l2("8g") == L2(size_gb=8.0)
    assert parse_l2("none") is None and parse_l2(None) is None
    for bad in ("lots", "-2", "0GB", "2TB"):
        with pytest.raises(ConfigError):
            parse_l2(bad)


def test_parse_l3() -> None:
    assert parse_l3("none") is None
    assert parse_l3("file:/data/kv") == L3("file", path=Path("/data/kv"))
    assert parse_l3("mooncake") == L3("mooncake")
    assert parse_l3("mooncake:10.0.0.5:50051") == L3("mooncake", master="10.0.0.5:50051")
    assert parse_l3("lmcache") == L3("lmcache")
    assert parse_l3("lmcache:/etc/lm.yaml") == L3("lmcache", path=Path("/etc/lm.yaml"))
    for bad in ("file", "file:", "redis", "mooncake:nohostport"):
        with pytest.raises(ConfigError):
            parse_l3(bad)


def test_lmcache_tier_replaces_hicache_and_refuses_what_cannot_work(tmp_path: Path) -> None:
    own = build_plan(ServeOptions("m", l3=L3("lmcache"), l2=L2(size_gb=32), port=32100), Toolchain())
    (server,) = [p for p in own.processes if p.name == "lmcache-server"]
    assert server.stage == 0 and server.ready is not None and server.ready.port == 5555
    assert server.argv[server.argv.index("--l1-size-gb") + 1] == "32"
    (engine,) = [p for p in own.processes if p.role == "engine"]
    argv = list(engine.argv)
    assert "--enable-hierarchical-cache" not in argv and "--hicache-size" not in argv
    config = argv[argv.index("--lmcache-config-file") + 1]
    assert own.files == ((config, "mp_host: 127.0.0.1\nmp_port: 5555\n"),)
    users = build_plan(ServeOptions("m", l3=L3("lmcache", path=tmp_path / "lm.yaml")), Toolchain())
    assert not users.files and all(p.name != "lmcache-server" for p in users.processes)
    engine_argv = next(p.argv for p in users.processes if p.role == "engine")
    assert engine_argv[engine_argv.index("--lmcache-config-file") + 1] == str(tmp_path / "lm.yaml")
    for bad in (
        ServeOptions("m", l3=L3("lmcache"), l2=L2(ratio=2.0)),
        ServeOptions("m", l3=L3("lmcache", path=tmp_path / "lm.yaml"), l2=L2(size_gb=8)),
        ServeOptions("m", l3=L3("lmcache"), page_size=48),
        ServeOptions("m.gguf", l3=L3("lmcache")),
    ):
        with pytest.raises(ConfigError):
            build_plan(bad, Toolchain())


def test_engine_auto_follows_the_model() -> None:
    assert ServeOptions("models/smollm2.gguf").resolved_engine == "llama.cpp"
    assert ServeOptions("Qwen/Qwen3-8B").resolved_engine == "sglang"
    assert ServeOptions("x.gguf", engine="sglang").resolved_engine == "sglang"


def test_sglang_single_worker_plan_behind_the_proxy() -> None:
    plan = build_plan(ServeOptions("Qwen/Qwen3-8B", port=31000, python="/venv/bin/python"), Toolchain(proxy=True))
    names = [p.name for p in plan.processes]
    assert names == ["engine-0", "proxy"]
    engine, proxy = plan.processes
    assert engine.argv[:3] == ("/venv/bin/python", "-m", "sglang.launch_server")
    argv = list(engine.argv)
    assert argv[argv.index("--port") + 1] == "31001" and argv[argv.index("--host") + 1] == "127.0.0.1"
    for flag in ("--enable-session-radix-cache", "--enable-cache-report", "--enable-metrics"):
        assert flag in argv
    assert argv[argv.index("--schedule-policy") + 1] == "lpm"
    assert "--disable-radix-cache" not in argv and "--enable-hierarchical-cache" not in argv
    assert "--page-size" not in argv  # SGLang's own default without HiCache
    assert proxy.argv[1:4] == ("-m", "agentcache", "proxy")
    assert proxy.argv[proxy.argv.index("--upstream") + 1] == "http://127.0.0.1:31001"
    assert proxy.argv[proxy.argv.index("--engine") + 1] == "sglang"
    assert plan.endpoint == "http://127.0.0.1:31000" and proxy.stage > engine.stage


def test_sglang_tiers_workers_and_router() -> None:
    options = ServeOptions(
        "Qwen/Qwen3-8B", l2=L2(size_gb=32), l3=L3("file", path=Path("/nvme/kv")), workers=3,
        extra_args=("--tp-size", "2"),
    )  # fmt: skip
    plan = build_plan(options, Toolchain(router="sglang_router", proxy=False))
    engines = [p for p in plan.processes if p.role == "engine"]
    assert len(engines) == 3
    for i, engine in enumerate(engines):
        argv = list(engine.argv)
        assert argv[argv.index("--base-gpu-id") + 1] == str(2 * i)  # tp 2: GPUs 0-1, 2-3, 4-5
        assert argv[argv.index("--hicache-size") + 1] == "32"
        assert argv[argv.index("--hicache-storage-backend") + 1] == "file"
        assert argv[argv.index("--page-size") + 1] == "64"
        assert argv[-2:] == ["--tp-size", "2"]
        assert engine.env == {FILE_DIR_ENV: "/nvme/kv"}
    router = next(p for p in plan.processes if p.role == "router")
    assert router.argv[:3] == ("python3", "-m", "sglang_router.launch_router")
    assert router.argv[router.argv.index("--policy") + 1] == "cache_aware"
    assert "http://127.0.0.1:30003" in router.argv
    # No proxy: the router is the front and takes the public port.
    assert plan.endpoint == "http://127.0.0.1:30000" and router.argv[router.argv.index("--port") + 1] == "30000"


def test_mooncake_master_is_started_only_without_an_address() -> None:
    own = build_plan(ServeOptions("m", l3=L3("mooncake"), workers=2), Toolchain())
    assert own.processes[0].name == "mooncake-master" and own.processes[0].stage == 0
    external = build_plan(ServeOptions("m", l3=L3("mooncake", master="10.1.1.1:50051")), Toolchain())
    assert all(p.name != "mooncake-master" for p in external.processes)
    argv = list(external.processes[0].argv)
    extra = argv[argv.index("--hicache-storage-backend-extra-config") + 1]
    assert '"master_server_address":"10.1.1.1:50051"' in extra and '"protocol":"tcp"' in extra
    assert "--enable-hierarchical-cache" in argv  # L3 alone still needs HiCache


def test_baselines_radix_off_and_session_off() -> None:
    off = list(build_plan(ServeOptions("m", prefix_cache=False), Toolchain()).processes[0].argv)
    assert "--disable-radix-cache" in off and "--enable-session-radix-cache" not in off
    plan = build_plan(ServeOptions("m", session_cache=False), Toolchain())
    assert "--enable-session-radix-cache" not in plan.processes[0].argv
    proxy = plan.processes[-1]
    assert proxy.argv[proxy.argv.index("--engine") + 1] == "none"


def test_llama_plan_has_a_slot_per_session() -> None:
    options = ServeOptions("m.gguf", sessions=6, ctx_per_session=4096, l2=L2(size_gb=2), extra_args=("--threads", "2"))
    plan = build_plan(options, Toolchain(llama_server="/opt/llama-server", proxy=False))
    (engine,) = plan.processes
    argv = list(engine.argv)
    assert argv[0] == "/opt/llama-server"
    assert argv[argv.index("--parallel") + 1] == "6" and argv[argv.index("--ctx-size") + 1] == "24576"
    assert "--no-kv-unified" in argv and argv[argv.index("--cache-ram") + 1] == "2048"
    assert argv[argv.index("--port") + 1] == "30000" and argv[-2:] == ["--threads", "2"]
    off = list(build_plan(ServeOptions("m.gguf", prefix_cache=False), Toolchain(llama_server="x")).processes[0].argv)
    assert "--no-cache-prompt" in off


def test_llama_plan_flags_are_exact() -> None:
    plan = build_plan(ServeOptions("m.gguf", l2=L2(size_gb=2.5)), Toolchain(llama_server="/opt/llama-server"))
    assert list(plan.processes[0].argv) == [
        "/opt/llama-server", "--model", "m.gguf", "--host", "127.0.0.1", "--port", "30001", "--parallel", "4",
        "--ctx-size", "32768", "--no-kv-unified", "--metrics", "--cache-ram", "2560",
    ]  # fmt: skip
    off = build_plan(ServeOptions("m.gguf", sessions=1, prefix_cache=False), Toolchain(llama_server="x"))
    assert list(off.processes[0].argv)[7:] == [
        "--parallel", "1", "--ctx-size", "8192", "--no-kv-unified", "--metrics", "--no-cache-prompt",
        "--cache-ram", "0",
    ]  # fmt: skip


@pytest.mark.parametrize(
    "options",
    [
        ServeOptions("m.gguf"),
        ServeOptions("m.gguf", sessions=6, ctx_per_session=4096, l2=L2(size_gb=2), extra_args=("--threads", "2")),
        ServeOptions("m.gguf", sessions=1, prefix_cache=False, port=31000),
        ServeOptions("m.gguf", proxy=False, extra_args=("--jinja", "--no-webui")),
    ],
)
def test_llama_server_and_serve_launch_the_same_command(options: ServeOptions, tmp_path: Path) -> None:
    """One launcher: LlamaServer given serve's llama options runs exactly the command of serve's engine (the
    host aside: serve without a proxy puts the engine on the public host)."""
    model = tmp_path / "m.gguf"
    model.write_bytes(b"GGUF")
    options = replace(options, model=str(model))
    (engine,) = [p for p in build_plan(options, Toolchain(llama_server="/opt/llama-server")).processes
                 if p.role == "engine"]  # fmt: skip
    assert engine.ready is not None
    wanted = llama_options(options)
    server = LlamaServer(model, binary="/opt/llama-server", **{f.name: getattr(wanted, f.name) for f in fields(wanted)})
    assert server.command(engine.ready.port) == list(engine.argv)
    assert server.options == wanted


def test_proxy_command_serve_runs_is_on_the_command_line() -> None:
    # serve finds the proxy without importing the CLI (no import cycle); this keeps the two in step.
    argv = proxy_argv("python", "http://127.0.0.1:1", "llama", "127.0.0.1", 2)
    assert argv[1:4] == ["-m", "agentcache", "proxy"]
    assert "proxy" in {command.name for command in cli.app.registered_commands}


@pytest.mark.parametrize(
    "options",
    [
        ServeOptions("m.gguf", workers=2),
        ServeOptions("m.gguf", l3=L3("mooncake")),
        ServeOptions("m.gguf", l2=L2(ratio=2.0)),
        ServeOptions("m", prefix_cache=False, l2=L2(ratio=2.0)),
        ServeOptions("m", workers=0),
        ServeOptions("m", engine="vllm"),
    ],
)
def test_impossible_options_are_config_errors(options: ServeOptions) -> None:
    with pytest.raises(ConfigError):
        build_plan(options)


def test_fractional_hicache_size_is_refused() -> None:
    with pytest.raises(ConfigError, match="whole GB"):
        build_plan(ServeOptions("m", l2=L2(size_gb=1.5)))


def test_preflight_passes_on_a_gpu_box() -> None:
    options = ServeOptions("Qwen/Qwen3-8B", l2=L2(ratio=2.0), l3=L3("mooncake"), workers=2)
    assert check(options, build_plan(options, Toolchain()), GPU_BOX, never_busy) == []


def test_preflight_no_gpu_no_sglang() -> None:
    options = ServeOptions("Qwen/Qwen3-8B")
    problems = check(options, build_plan(options), Machine(sglang=False, mem_available=8 * GIB), never_busy)
    text = "\n".join(str(p) for p in problems)
    assert "SGLang is not installed" in text and "--engine-python" in text and "sglang==0.5.23" in text
    assert "no GPU found" in text and "--engine llama.cpp" in text


def test_preflight_host_memory_too_small_for_l2() -> None:
    options = ServeOptions("Qwen/Qwen3-8B", l2=L2(size_gb=64), workers=2)
    small = Machine(gpus_mib=(81920, 81920), mem_available=96 * GIB, sglang=True, sglang_router=True, proxy=True)
    problems = check(options, build_plan(options), small, never_busy)
    assert len(problems) == 1 and "host memory too small" in problems[0].what
    assert "128.0 GiB" in problems[0].what and "--l2" in problems[0].fix
    ratio = ServeOptions("Qwen/Qwen3-8B", l2=L2(ratio=4.0))
    assert any("host memory" in p.what for p in check(ratio, build_plan(ratio), small, never_busy))


def test_preflight_port_in_use_suggests_a_free_one() -> None:
    options = ServeOptions("Qwen/Qwen3-8B", port=30000)
    problems = check(options, build_plan(options), GPU_BOX, lambda host, port: port == 30001)
    assert len(problems) == 1
    assert "port 30001" in problems[0].what and "engine-0" in problems[0].what
    assert "--port 30002" in problems[0].fix


def test_preflight_router_and_mooncake_missing() -> None:
    options = ServeOptions("m", workers=2, l3=L3("mooncake"))
    bare = Machine(gpus_mib=(1, 1), mem_available=512 * GIB, sglang=True)
    text = "\n".join(str(p) for p in check(options, build_plan(options), bare, never_busy))
    assert "pip install smg" in text and "mooncake-transfer-engine" in text


def test_preflight_llama_binary_and_model(tmp_path: Path) -> None:
    options = ServeOptions(str(tmp_path / "missing.gguf"))
    problems = check(options, build_plan(options, Toolchain(proxy=False)), Machine(), never_busy)
    assert next(p.fix for p in problems) == INSTALL_HINT
    assert "model file not found" in problems[1].what


def test_dry_run_prints_commands_and_environment(tmp_path: Path) -> None:
    args = ["serve", "Qwen/Qwen3-8B", "--dry-run", "--l2", "16GB", "--l3", f"file:{tmp_path}", "--port", "32000",
            "--engine-python", "/opt/sglang/bin/python", "--", "--tp-size", "1"]  # fmt: skip
    result = CliRunner().invoke(cli.app, args, catch_exceptions=False)
    assert result.exit_code == 0, result.output
    lines = [ln for ln in result.stdout.splitlines() if ln and not ln.startswith("#")]
    engine = shlex.split(next(ln for ln in lines if "sglang.launch_server" in ln))
    assert engine[0] == f"{FILE_DIR_ENV}={tmp_path}" and engine[1] == "/opt/sglang/bin/python"
    assert engine[-2:] == ["--tp-size", "1"] and "--hicache-size" in engine


def test_format_plan_one_command_per_process() -> None:
    options = ServeOptions("m", workers=2, l3=L3("mooncake"))
    text = format_plan(options, build_plan(options, Toolchain()))
    commands = [ln for ln in text.splitlines() if not ln.startswith("#")]
    assert len(commands) == 5  # master, 2 engines, router, proxy


def test_cli_preflight_failure_exits_2(tmp_path: Path) -> None:
    result = CliRunner().invoke(cli.app, ["serve", str(tmp_path / "nope.gguf"), "--port", "39999"])
    assert result.exit_code == EXIT_PREFLIGHT
    assert "model file not found" in result.stderr


def test_cli_bad_option_is_one_line() -> None:
    result = CliRunner().invoke(cli.app, ["serve", "m.gguf", "--workers", "2", "--dry-run"])
    assert result.exit_code == 2 and "agentcache: error:" in result.stderr and "--workers" in result.stderr


def test_serving_smollm2_renders_the_tools_and_says_so(tmp_path: Path) -> None:
    """SmolLM2's own template drops the tools: serve uses the tools-first template and says so at start; any
    other GGUF keeps its own template with a note; a template on the command line is left alone."""
    from agentcache.serve.llama._template import TOOLS_FIRST_TEMPLATE

    smol = build_plan(ServeOptions("/models/SmolLM2-135M-Instruct.Q4_1.gguf"), Toolchain(llama_server="x"))
    argv = list(smol.processes[0].argv)
    assert argv[argv.index("--chat-template-file") + 1] == str(TOOLS_FIRST_TEMPLATE) and TOOLS_FIRST_TEMPLATE.is_file()
    assert any("drops the tools" in note and "tools_first.jinja" in note for note in smol.notes)
    other = build_plan(ServeOptions("llama-3.gguf"), Toolchain(llama_server="x"))
    assert "--chat-template-file" not in other.processes[0].argv
    assert any("if it ignores tools" in note for note in other.notes)
    mine = ServeOptions("SmolLM2.gguf", extra_args=("--chat-template-file", "mine.jinja"))
    argv = list(build_plan(mine, Toolchain(llama_server="x")).processes[0].argv)
    assert argv.count("--chat-template-file") == 1 and argv[-1] == "mine.jinja"
    result = CliRunner().invoke(cli.app, ["serve", str(tmp_path / "SmolLM2-135M.gguf"), "--dry-run"])
    assert result.exit_code == 0, result.output
    assert "--chat-template-file" in result.output and "drops the tools" in result.output
