"""Flag contract: every SGLang flag and choice ``agentcache serve`` can emit exists in sglang 0.5.23.

The sglang wheel is downloaded once (``pip download sglang==0.5.23 --no-deps``) into
``~/.cache/agentcache/wheels`` (``$AGENTCACHE_CACHE_DIR/wheels``) and read as a zip: the field declarations in
``sglang/srt/arg_groups/fields/*.py`` are parsed as text with :mod:`ast` (nothing is imported, no torch), and an
:mod:`argparse` parser is rebuilt from them the way ``arg_groups/arg_utils.py:add_cli_args_from_dataclass``
does (a field ``foo_bar`` is ``--foo-bar``, plus ``cli_name``/``aliases``; ``bool`` is ``store_true``;
``choices`` / ``Literal`` restrict values; ``int``/``float`` types are checked). Every engine command line that
``--dry-run`` prints, for every combination of L2 / L3 / workers / cache options, must parse. Without network
and without a cached wheel, those tests skip.

Where ``sglang`` and (CPU) ``torch`` import, ``sglang.srt.server_args.prepare_server_args`` itself parses each
command line as well.
"""

from __future__ import annotations

import argparse
import ast
import importlib.util
import itertools
import os
import shlex
import subprocess
import sys
import zipfile
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

import pytest
from typer.testing import CliRunner

from agentcache import _cli as cli
from agentcache.serve import L2, L3, ServeOptions, Toolchain, build_plan
from agentcache.serve._sglang import (
    DUMMY_WEIGHTS_ARGS,
    FILE_DIR_ENV,
    LMCACHE_CONFIG_KEYS,
    MOONCAKE_CONFIG_KEYS,
    SGLANG_FLAGS,
    SGLANG_VERSION,
)
from agentcache.serve.llama import cache_dir
from tests import needs

FIELDS = "sglang/srt/arg_groups/fields/"


def _find_wheel(directory: Path) -> Path | None:
    found = sorted(directory.glob(f"sglang-{SGLANG_VERSION}-*.whl"))
    return found[0] if found else None


def _download(directory: Path) -> Path | None:
    directory.mkdir(parents=True, exist_ok=True)
    base = [sys.executable, "-m", "pip", "download", f"sglang=={SGLANG_VERSION}", "--no-deps", "-d", str(directory)]
    pinned = ["--only-binary=:all:", "--python-version", "3.11", "--platform", "manylinux_2_34_x86_64"]
    for argv in ([*base, "--only-binary=:all:"], base + pinned):
        try:
            subprocess.run(argv, capture_output=True, timeout=900, check=False)
        except (OSError, subprocess.TimeoutExpired):
            return None
        wheel = _find_wheel(directory)
        if wheel is not None:
            return wheel
    return None


@pytest.fixture(scope="module")
def wheel() -> zipfile.ZipFile:
    directory = cache_dir() / "wheels"
    path = _find_wheel(directory) or _download(directory)
    if path is None and os.environ.get("CI"):  # pragma: no cover - CI has PyPI: the contract must be checked
        pytest.fail(f"sglang {SGLANG_VERSION} wheel could not be downloaded into {directory}")
    if path is None:
        pytest.skip(needs.SGLANG_WHEEL)
    return zipfile.ZipFile(path)


# -- the fields, read as text --------------------------------------------------------------------------------


@dataclass
class Field:
    """One CLI field of sglang's ServerArgs, as ``add_cli_args_from_dataclass`` would register it."""

    names: list[str]
    source: str
    kind: str  # "bool", "bool_optional", "value", "list", "action"
    value_type: str = "str"  # "int", "float", "str"
    choices: list[Any] | None = None
    required: bool = False
    attrs: dict[str, Any] = field(default_factory=dict)


def _const_list(node: ast.AST | None, names: dict[str, list[Any]]) -> list[Any] | None:
    if isinstance(node, (ast.List, ast.Tuple)):
        return [e.value for e in node.elts if isinstance(e, ast.Constant)]
    if isinstance(node, ast.Name):
        return names.get(node.id)
    return None


def _module_lists(text: str) -> dict[str, list[Any]]:
    """Module-level ``NAME = [constants]`` of ``arg_groups/choices.py``."""
    out: dict[str, list[Any]] = {}
    for node in ast.parse(text).body:
        if isinstance(node, ast.Assign) and isinstance(node.value, ast.List):
            for target in node.targets:
                if isinstance(target, ast.Name):
                    out[target.id] = [e.value for e in node.value.elts if isinstance(e, ast.Constant)]
    return out


def _unwrap(node: ast.AST) -> tuple[ast.AST, bool]:
    """``Optional[X]`` → (X, True)."""
    if isinstance(node, ast.Subscript) and isinstance(node.value, ast.Name) and node.value.id == "Optional":
        return node.slice, True
    return node, False


def _field(name: str, ann: ast.Subscript, has_default: bool, source: str, lists: dict[str, list[Any]]) -> Field | None:
    if not isinstance(ann.slice, ast.Tuple) or len(ann.slice.elts) < 2:
        return None
    raw, meta = ann.slice.elts[0], ann.slice.elts[1]
    kw: dict[str, ast.AST] = {}
    if isinstance(meta, ast.Call) and isinstance(meta.func, ast.Name) and meta.func.id == "Arg":
        kw = {k.arg: k.value for k in meta.keywords if k.arg}
    elif not isinstance(meta, (ast.Constant, ast.JoinedStr, ast.BinOp)):
        return None  # no Arg / help string: not registered automatically
    if isinstance(kw.get("no_cli"), ast.Constant) and getattr(kw["no_cli"], "value", False):
        return None
    cli_name = kw["cli_name"].value if isinstance(kw.get("cli_name"), ast.Constant) else None  # type: ignore[attr-defined]
    names = [cli_name or "--" + name.replace("_", "-")] + (_const_list(kw.get("aliases"), lists) or [])
    choices = _const_list(kw.get("choices"), lists)
    inner, _ = _unwrap(raw)
    if "action" in kw:
        action = ast.unparse(kw["action"])
        return Field(names, source, "bool_optional" if "BooleanOptionalAction" in action else "action")
    if isinstance(inner, ast.Subscript) and isinstance(inner.value, ast.Name) and inner.value.id == "Literal":
        elts = inner.slice.elts if isinstance(inner.slice, ast.Tuple) else [inner.slice]
        literal = [e.value for e in elts if isinstance(e, ast.Constant)]
        kinds = {type(v).__name__ for v in literal if v is not None}
        value_type = kinds.pop() if len(kinds) == 1 and kinds <= {"int", "float"} else "str"
        return Field(names, source, "value", value_type, choices or literal, not has_default)
    type_name = inner.id if isinstance(inner, ast.Name) else ""
    if isinstance(inner, ast.Subscript) and isinstance(inner.value, ast.Name) and inner.value.id in ("List", "list"):
        return Field(names, source, "list", choices=choices)
    if type_name == "bool":
        return Field(names, source, "bool")
    value_type = type_name if type_name in ("int", "float") and "type_parser" not in kw else "str"
    return Field(names, source, "value", value_type, choices, not has_default)


def read_fields(wheel: zipfile.ZipFile) -> dict[str, Field]:
    """Every CLI flag name (and alias) of the field files → its Field."""
    lists = _module_lists(wheel.read("sglang/srt/arg_groups/choices.py").decode())
    out: dict[str, Field] = {}
    for member in sorted(n for n in wheel.namelist() if n.startswith(FIELDS) and n.endswith(".py")):
        for cls in ast.parse(wheel.read(member).decode()).body:
            if not isinstance(cls, ast.ClassDef):
                continue
            for node in cls.body:
                if not (isinstance(node, ast.AnnAssign) and isinstance(node.target, ast.Name)):
                    continue
                ann = node.annotation
                if not (isinstance(ann, ast.Subscript) and isinstance(ann.value, ast.Name)):
                    continue
                if ann.value.id not in ("A", "Annotated") or node.target.id.startswith("_"):
                    continue
                found = _field(node.target.id, ann, node.value is not None, member, lists)
                if found is not None:
                    for name in found.names:
                        out[name] = found
    return out


def parser_from(fields: dict[str, Field]) -> argparse.ArgumentParser:
    """An argparse parser registering the fields as ``add_cli_args_from_dataclass`` does."""
    parser = argparse.ArgumentParser(prog="sglang serve", allow_abbrev=False, exit_on_error=False)
    types = {"int": int, "float": float, "str": str}
    for f in {id(f): f for f in fields.values()}.values():
        dest = {"dest": f.names[0].lstrip("-").replace("-", "_")}
        if f.kind == "bool":
            parser.add_argument(*f.names, action="store_true", **dest)
        elif f.kind == "bool_optional":
            parser.add_argument(*f.names, action=argparse.BooleanOptionalAction, **dest)
        elif f.kind in ("list", "action"):
            parser.add_argument(*f.names, nargs="*", **dest)
        else:
            parser.add_argument(*f.names, type=types[f.value_type], choices=f.choices, required=f.required, **dest)
    return parser


@pytest.fixture(scope="module")
def fields(wheel: zipfile.ZipFile) -> dict[str, Field]:
    return read_fields(wheel)


# -- what agentcache emits -----------------------------------------------------------------------------------


def combinations() -> list[ServeOptions]:
    """Every L2 / L3 / workers / cache-option combination serve accepts (plus the dummy-weights benchmark)."""
    out = []
    l2s = [None, L2(ratio=2.0), L2(ratio=1.5), L2(size_gb=16)]
    l3s = [None, L3("file", path=Path("/tmp/agentcache-l3")), L3("mooncake"), L3("mooncake", master="10.0.0.5:50051")]
    l3s += [L3("lmcache"), L3("lmcache", path=Path("/etc/lmcache.yaml"))]
    for l2, l3, workers, session in itertools.product(l2s, l3s, (1, 2), (True, False)):
        if l3 is not None and l3.kind == "lmcache" and l2 is not None and (l2.ratio or l3.path):
            continue  # refused by ServeOptions.validate (test_serve.py checks the refusal)
        out.append(ServeOptions("Qwen/Qwen3-8B", l2=l2, l3=l3, workers=workers, session_cache=session))
    out.append(ServeOptions("Qwen/Qwen3-8B", prefix_cache=False))
    out.append(ServeOptions("Qwen/Qwen3-8B", workers=2, prefix_cache=False))
    out.append(ServeOptions("/models/qwen3-config-only", l2=L2(ratio=2.0), extra_args=DUMMY_WEIGHTS_ARGS))
    out.append(ServeOptions("Qwen/Qwen3-8B", page_size=16, l2=L2(size_gb=8), extra_args=("--tp-size", "2")))
    return out


def engine_argvs(options: ServeOptions) -> list[list[str]]:
    """The SGLang arguments (after ``python -m sglang.launch_server``) of each engine in the plan."""
    plan = build_plan(options, Toolchain(proxy=True))
    return [list(p.argv[3:]) for p in plan.processes if p.role == "engine"]


ALL_ARGVS = [argv for options in combinations() for argv in engine_argvs(options)]


def test_every_declared_flag_and_choice_exists(fields: dict[str, Field]) -> None:
    for flag in SGLANG_FLAGS.values():
        assert flag.name in fields, f"{flag.name} is not a flag of sglang {SGLANG_VERSION}"
        found = fields[flag.name]
        assert found.source == flag.source, f"{flag.name} is declared in {found.source}, not {flag.source}"
        assert (found.kind != "bool") == flag.takes_value, f"{flag.name}: value/boolean mismatch"
        for choice in flag.choices:
            assert found.choices is not None and choice in found.choices, f"{flag.name} {choice}: not a choice"


def test_every_emitted_flag_is_declared() -> None:
    for argv in ALL_ARGVS:
        for token in argv:
            if token.startswith("--") and token not in ("--tp-size",):
                assert token in SGLANG_FLAGS, f"{token} is emitted but not declared in SGLANG_FLAGS"


@pytest.mark.parametrize("argv", ALL_ARGVS, ids=lambda a: " ".join(a[4:])[:90])
def test_every_dry_run_command_parses(fields: dict[str, Field], argv: list[str]) -> None:
    parser = parser_from(fields)
    try:
        parser.parse_args(argv)
    except (argparse.ArgumentError, SystemExit) as exc:
        pytest.fail(f"sglang {SGLANG_VERSION} rejects {shlex.join(argv)}: {exc}")


def test_must_show_cli_dry_run_is_accepted(fields: dict[str, Field]) -> None:
    args = ["serve", "Qwen/Qwen3-8B", "--dry-run", "--l2", "2", "--l3", "mooncake", "--workers", "2"]
    result = CliRunner().invoke(cli.app, args, catch_exceptions=False)
    assert result.exit_code == 0, result.output
    commands = [shlex.split(ln) for ln in result.stdout.splitlines() if ln and not ln.startswith("#")]
    engines = [c for c in commands if "sglang.launch_server" in c]
    assert len(engines) == 2
    assert any(c[0] == "mooncake_master" for c in commands)
    assert any("--policy" in c and c[c.index("--policy") + 1] == "cache_aware" for c in commands)
    parser = parser_from(fields)
    for command in engines:
        parsed = parser.parse_args(command[command.index("sglang.launch_server") + 1 :])
        assert parsed.enable_hierarchical_cache and parsed.enable_session_radix_cache
        assert parsed.hicache_ratio == 2.0 and parsed.hicache_storage_backend == "mooncake"


def test_environment_variable_and_mooncake_keys_exist(wheel: zipfile.ZipFile) -> None:
    environ = wheel.read("sglang/srt/environ.py").decode()
    assert f"{FILE_DIR_ENV} = " in environ
    storage = wheel.read("sglang/srt/mem_cache/hicache_storage.py").decode()
    assert f"envs.{FILE_DIR_ENV}" in storage
    store = wheel.read("sglang/srt/mem_cache/storage/mooncake_store/mooncake_store.py").decode()
    body = store[store.index("def load_from_extra_config") :]
    body = body[: body.index("\n    def ", 10) if "\n    def " in body[10:] else len(body)]
    for key in MOONCAKE_CONFIG_KEYS:
        assert f'"{key}"' in body or f"'{key}'" in body or key == "local_hostname", key
    assert 'overrides.get("local_hostname")' in store


def test_lmcache_dry_run_enables_lmcache_with_the_config_sglang_reads(
    fields: dict[str, Field], wheel: zipfile.ZipFile, tmp_path: Path
) -> None:
    args = ["serve", "Qwen/Qwen3-8B", "--dry-run", "--l3", "lmcache", "--l2", "16GB", "--port", "31000"]
    result = CliRunner().invoke(cli.app, args, catch_exceptions=False)
    assert result.exit_code == 0, result.output
    assert "--enable-lmcache" in result.stdout
    commands = [shlex.split(ln) for ln in result.stdout.splitlines() if ln and not ln.startswith("#")]
    (engine,) = [c for c in commands if "sglang.launch_server" in c]
    parsed = parser_from(fields).parse_args(engine[engine.index("sglang.launch_server") + 1 :])
    assert parsed.enable_lmcache and not parsed.enable_hierarchical_cache
    config = parsed.lmcache_config_file
    assert config.endswith("agentcache-lmcache-31000.yaml")
    (server,) = [c for c in commands if "lmcache.cli.main" in c]
    assert server[server.index("--l1-size-gb") + 1] == "16" and server[server.index("--port") + 1] == "5555"
    # The file agentcache writes has the keys of the sglang wheel's own MP example config, and points at the server.
    written = result.stdout[result.stdout.index(f"# file {config}") :].splitlines()[1:3]
    assert [ln.removeprefix("#   ") for ln in written] == ["mp_host: 127.0.0.1", "mp_port: 5555"]
    example = wheel.read("sglang/srt/mem_cache/storage/lmcache/example_config_mp.yaml").decode()
    keys = [ln.split(":")[0] for ln in example.splitlines() if ln and not ln.startswith("#")]
    assert tuple(keys) == LMCACHE_CONFIG_KEYS
    radix = wheel.read("sglang/srt/mem_cache/storage/lmcache/lmcache_unified_radix_cache.py").decode()
    assert "config_file=lmcache_config_file" in radix


def test_launch_module_exists(wheel: zipfile.ZipFile) -> None:
    launch = wheel.read("sglang/launch_server.py").decode()
    assert "prepare_server_args(sys.argv[1:])" in launch


def _sglang_importable() -> bool:
    return importlib.util.find_spec("sglang") is not None and importlib.util.find_spec("torch") is not None


@pytest.mark.skipif(not _sglang_importable(), reason=needs.SGLANG)
@pytest.mark.parametrize("argv", ALL_ARGVS, ids=lambda a: " ".join(a[4:])[:90])
def test_prepare_server_args_accepts(argv: list[str]) -> None:  # pragma: no cover - needs sglang installed
    from sglang.srt.server_args import prepare_server_args

    args = prepare_server_args(argv)
    assert args.model_path == argv[argv.index("--model-path") + 1]


@pytest.mark.parametrize(
    "bad",
    [
        ["--hicache-size", "1.5"],  # an int field
        ["--schedule-policy", "longest-prefix"],  # not a choice
        ["--hicache-storage-backend", "redis"],
        ["--enable-session-cache"],  # no such flag
        ["--enable-hierarchical-cache", "yes"],  # a boolean takes no value
    ],
)
def test_the_rebuilt_parser_rejects_what_sglang_rejects(fields: dict[str, Field], bad: list[str]) -> None:
    with pytest.raises((argparse.ArgumentError, SystemExit)):
        parser_from(fields).parse_args(["--model-path", "m", *bad])
