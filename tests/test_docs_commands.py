"""Every command the README and the docs pages show is run here, and every reference list they hold is checked
against the code (issue 22). The convention, also on docs/contributing.md ("Commands in the docs"):

* a ```bash block runs as one script (``set -e``): each command must exit 0;
* a ```console block's ``$ `` lines are commands; the lines after one are its output, and every number shown
  there must appear in the real output;
* a ```python block runs only when marked ``<!-- docs-test: python -->`` (against a scripted fake upstream, so the
  ``wrap()`` examples run without a key), and must be marked either way;
* a ```toml block marked ``<!-- docs-test: file NAME -->`` is written as NAME before any command runs, and must
  load as agentcache settings with every value it sets;
* ``<!-- docs-test: server -->`` runs each command of the block as a server (``--port 0`` added), checks its health
  endpoint and stops it with Ctrl-C;
* ``<!-- docs-test: skip (REASON) -->`` says why a block does not run.

Every ``agentcache COMMAND --option`` on any page, run or not, must be an option of that command.
"""

from __future__ import annotations

import json
import os
import re
import shlex
import signal
import subprocess
import sys
import time
import tomllib
import urllib.request
from collections.abc import Iterator
from dataclasses import dataclass
from pathlib import Path

import pytest
import typer

ROOT = Path(__file__).resolve().parent.parent
DOCS = ROOT / "docs"
README = ROOT / "README.md"
PAGES = [README, *sorted(DOCS.rglob("*.md"))]
#: Pages included into the site whole (docs/benchmarks.md includes it): scanned for options, not run.
INCLUDED = [ROOT / "benchmarks" / "README.md"]
#: The README's test command, which .ci/run runs verbatim.
TEST_COMMAND = "python3 -m venv .venv && . .venv/bin/activate && pip install -q -e '.[dev]' && pytest"
README_LIMIT = 12 * 1024

#: Options documented as the interface of issue 21 (audit of agents' own logs, proxy recorder), being built on
#: main while these pages were written: allowed to be missing from --help until they land. Empty it then.
PENDING_OPTIONS = {
    "audit": set(),
    "proxy": {"--record"},
}
#: The page that explains each command's options (every option of the command must be on it).
DOOR_PAGES = {"audit": "audit.md", "proxy": "proxy.md", "serve": "serve.md", "replay": "serve.md", "plan": "plan.md"}

MARKER = re.compile(r"^<!--\s*docs-test:\s*(?P<kind>skip|server|python|file)\b\s*(?P<arg>.*?)\s*-->$")
FENCE = re.compile(r"^```(?P<lang>[\w-]*)\s*$")
NUMBER = re.compile(r"(?<![\w.])\d[\d,]*(?:\.\d+)?%?(?![\w])")


@dataclass(frozen=True)
class Block:
    """One fenced block of a page: its language, text, and the docs-test marker on the line before it."""

    page: Path
    line: int  # 1-based line of the opening fence
    lang: str
    text: str
    kind: str | None = None  # skip, server, python, file (None: the language's default)
    arg: str = ""

    @property
    def id(self) -> str:
        return f"{self.page.relative_to(ROOT)}:{self.line}"


def parse(page: Path) -> list[Block]:
    lines = page.read_text().splitlines()
    blocks, i = [], 0
    while i < len(lines):
        m = FENCE.match(lines[i])
        if not m:
            i += 1
            continue
        start, lang = i, m.group("lang")
        j = i + 1
        while j < len(lines) and lines[j] != "```":
            j += 1
        marker = MARKER.match(lines[start - 1].strip()) if start > 0 else None
        blocks.append(
            Block(
                page,
                start + 1,
                lang,
                "\n".join(lines[start + 1 : j]),
                marker.group("kind") if marker else None,
                marker.group("arg").strip("() ") if marker else "",
            )
        )
        i = j + 1
    return blocks


BLOCKS = [b for page in PAGES for b in parse(page)]


def commands(text: str) -> list[str]:
    """The command lines of a shell text: comments dropped, ``\\`` continuations joined."""
    out, pending = [], ""
    for raw in text.splitlines():
        line = raw.rstrip()
        if line.endswith("\\"):
            pending += line[:-1] + " "
            continue
        line = pending + line
        pending = ""
        line = re.sub(r"(^|\s)#.*$", "", line).strip()
        if line:
            out.append(line)
    return out


def console_runs(text: str) -> list[tuple[str, str]]:
    """``(command, expected output)`` for each ``$ `` line of a console block."""
    runs: list[tuple[str, list[str]]] = []
    lines = text.splitlines()
    i = 0
    while i < len(lines):
        if lines[i].startswith("$ "):
            cmd = lines[i][2:]
            while cmd.endswith("\\") and i + 1 < len(lines):
                i += 1
                cmd = cmd[:-1] + " " + lines[i].strip()
            runs.append((cmd, []))
        elif runs:
            runs[-1][1].append(lines[i])
        i += 1
    return [(cmd, "\n".join(out)) for cmd, out in runs]


# --- options ---------------------------------------------------------------------------------------------------


def _cli_params() -> dict[str, list[tuple[set[str], bool]]]:
    """Per command (the root as ``""``): each option's long names (a switch's ``--x`` / ``--no-x`` together) and
    whether it takes a value."""
    from agentcache import _cli

    group = typer.main.get_command(_cli.app)

    def params(command: object) -> list[tuple[set[str], bool]]:
        out = []
        for p in getattr(command, "params", []):
            names = {o for o in (*getattr(p, "opts", ()), *getattr(p, "secondary_opts", ())) if o[:2] == "--"}
            if names:
                out.append((names, not getattr(p, "is_flag", False) and not getattr(p, "count", False)))
        return [*out, ({"--help"}, False)]

    return {"": params(group), **{name: params(c) for name, c in group.commands.items()}}  # type: ignore[attr-defined]


PARAMS = _cli_params()
OPTIONS = {command: {n for names, _ in params for n in names} for command, params in PARAMS.items()}
#: Root options that take a value (``agentcache --log-level debug proxy``).
ROOT_VALUED = {n for names, valued in PARAMS[""] if valued for n in names}
CODE_SPAN = re.compile(r"`([^`\n]+)`")


def option_uses(text: str) -> Iterator[tuple[str, str]]:
    """``(command, --option)`` for each ``agentcache [global options] COMMAND ... --option`` in ``text`` (code
    blocks and inline code), the root's options as command ``""``. Stops at a shell separator or a bare ``--``."""
    for line in text.splitlines():
        for m in re.finditer(r"\bagentcache((?:\s+[^\s|;&`)]+)+)", line):
            try:
                words = shlex.split(m.group(1), comments=True)
            except ValueError:
                words = m.group(1).split()
            command, value_next = "", False
            for word in words:
                if word in ("--", "&&", "||", "|", ";", "&") or word.startswith("#"):
                    break
                if word.startswith("--"):
                    yield command, word.split("=", 1)[0]
                    value_next = not command and word in ROOT_VALUED and "=" not in word
                elif value_next:
                    value_next = False
                elif not command:
                    if word not in OPTIONS:
                        break  # a placeholder (agentcache COMMAND) or prose, not a command line
                    command = word


def _documented_uses() -> list[tuple[str, str, str]]:
    uses = []
    for page in [*PAGES, *INCLUDED]:
        text = page.read_text()
        for m in CODE_SPAN.finditer(text):
            uses += [(str(page.relative_to(ROOT)), c, o) for c, o in option_uses(m.group(1))]
        for block in parse(page):
            uses += [(str(page.relative_to(ROOT)), c, o) for c, o in option_uses(block.text)]
    return sorted(set(uses))


def test_every_documented_option_exists() -> None:
    """A stale option list is the first thing a newcomer trips on (the old README listed `replay --engine vllm`)."""
    uses = _documented_uses()
    assert len(uses) > 50, uses  # the scan finds the pages' options at all
    unknown = [
        (page, command or "agentcache", option)
        for page, command, option in uses
        if option not in OPTIONS[command] and option not in PENDING_OPTIONS.get(command, set())
    ]
    assert not unknown, f"options the pages show that --help does not have: {unknown}"


def test_the_scan_catches_a_stale_option() -> None:
    found = set(option_uses("agentcache --log-level debug replay data/x.json --engine vllm --nope | head"))
    assert found == {("", "--log-level"), ("replay", "--engine"), ("replay", "--nope")}
    assert "--nope" not in OPTIONS["replay"]


@pytest.mark.parametrize("command", sorted(DOOR_PAGES))
def test_every_option_is_on_its_door_page(command: str) -> None:
    """Nothing the old README listed is lost: each option of each command is explained on its door's page."""
    text = (DOCS / DOOR_PAGES[command]).read_text()
    missing = sorted(
        "/".join(sorted(names))
        for names, _ in PARAMS[command]
        if "--help" not in names and not any(re.search(rf"{re.escape(o)}(?![\w-])", text) for o in names)
    )
    assert not missing, f"options of agentcache {command} not on docs/{DOOR_PAGES[command]}: {missing}"


def test_global_options_are_documented() -> None:
    text = (DOCS / "settings.md").read_text()
    assert {o for o in OPTIONS[""] - {"--help", "--version"} if o not in text} == set()


# --- the README ---------------------------------------------------------------------------------------------------


def test_readme_is_short() -> None:
    size = len(README.read_bytes())
    assert size <= README_LIMIT, f"README.md is {size} bytes; the reference belongs on the docs site (docs/)"


def test_readme_test_command_is_what_ci_runs() -> None:
    readme_lines = [line for b in BLOCKS if b.page == README for line in b.text.splitlines()]
    assert TEST_COMMAND in readme_lines
    assert TEST_COMMAND in (ROOT / ".ci" / "run").read_text().splitlines()


def test_readme_puts_audit_your_own_agents_first() -> None:
    text = README.read_text()
    quick = text[text.index("## Quick start") :]
    headings = re.findall(r"^### (.+)$", quick, re.M)
    assert headings[0] == "Audit your own agents", headings
    # The first example the README shows is that audit, with its real output (run and checked like every console).
    first = text[: text.index("## Install")]
    assert "$ agentcache audit --sample" in first and "Misses by cause" in first


def test_every_block_has_a_decision() -> None:
    """Python blocks run only when marked, so each says which; a skip says why."""
    undecided = [b.id for b in BLOCKS if b.lang == "python" and b.kind is None]
    assert not undecided, f"python blocks need <!-- docs-test: python --> or a skip with its reason: {undecided}"
    unexplained = [b.id for b in BLOCKS if b.kind == "skip" and not b.arg]
    assert not unexplained, f"skips without a reason: {unexplained}"
    runnable = [b for b in BLOCKS if b.lang in ("bash", "console") and b.kind is None]
    assert len(runnable) >= 10


# --- running them -------------------------------------------------------------------------------------------------


@pytest.fixture(scope="module")
def workdir(tmp_path_factory: pytest.TempPathFactory) -> Path:
    """A directory as a user's: the repository's data, tests and benchmarks linked in, the pages' files written."""
    work = tmp_path_factory.mktemp("docs")
    for name in ("data", "tests", "benchmarks", "examples"):
        (work / name).symlink_to(ROOT / name)
    (work / "home").mkdir()
    for block in BLOCKS:
        if block.kind == "file":
            (work / block.arg).write_text(block.text + "\n")
    return work


def _env(work: Path, **extra: str) -> dict[str, str]:
    env = {k: v for k, v in os.environ.items() if not k.startswith("AGENTCACHE_")}
    env.update(
        PATH=f"{Path(sys.executable).parent}{os.pathsep}{env.get('PATH', '')}",  # the installed agentcache first
        HOME=str(work / "home"),
        COLUMNS="250",
        NO_COLOR="1",
        PYTHONPATH="",
        **extra,
    )
    return env


_RUNS: dict[str, subprocess.CompletedProcess[str]] = {}


def _run(script: str, work: Path) -> subprocess.CompletedProcess[str]:
    if script not in _RUNS:
        _RUNS[script] = subprocess.run(
            ["bash", "-c", f"set -euo pipefail\n{script}"],
            cwd=work,
            env=_env(work),
            capture_output=True,
            text=True,
            timeout=120,
        )
    return _RUNS[script]


def _blocks(lang: str, kind: str | None) -> list[Block]:
    return [b for b in BLOCKS if b.lang == lang and b.kind == kind]


@pytest.mark.parametrize("block", _blocks("bash", None), ids=lambda b: b.id)
def test_bash_block_runs(block: Block, workdir: Path) -> None:
    result = _run(block.text, workdir)
    assert result.returncode == 0, f"{block.id} exited {result.returncode}:\n{result.stderr[-3000:]}"


@pytest.mark.parametrize("block", _blocks("console", None), ids=lambda b: b.id)
def test_console_block_shows_real_output(block: Block, workdir: Path) -> None:
    runs = console_runs(block.text)
    if not runs:
        pytest.skip("output only")  # e.g. an error message, shown without its command
    for command, expected in runs:
        result = _run(command, workdir)
        assert result.returncode == 0, f"{block.id}: {command} exited {result.returncode}:\n{result.stderr[-3000:]}"
        actual = result.stdout + result.stderr
        missing = [
            n
            for n in NUMBER.findall(expected)
            if len(n.replace(",", "").replace(".", "").rstrip("%")) >= 2
            and not re.search(rf"(?<![\w.]){re.escape(n)}(?![\w])", actual)
        ]
        assert not missing, f"{block.id}: {command}: numbers the page shows that the command does not print: {missing}"


def test_the_number_check_can_fail() -> None:
    assert NUMBER.findall("read 11,311,725 (96.0%) at 8.6215 on gpt-4o, 2453/2454") == [
        "11,311,725",
        "96.0%",
        "8.6215",
        "2453",
        "2454",
    ]


@pytest.fixture(scope="module")
def fake_upstream() -> Iterator[str]:
    from tests.clients.fake_upstream import serve

    with serve() as (_, url):
        yield url


@pytest.mark.parametrize("block", _blocks("python", "python"), ids=lambda b: b.id)
def test_python_block_runs(block: Block, workdir: Path, fake_upstream: str) -> None:
    script = workdir / f"snippet_{block.page.stem}_{block.line}.py"
    script.write_text(block.text + "\n")
    env = _env(
        workdir,
        ANTHROPIC_BASE_URL=fake_upstream,
        ANTHROPIC_API_KEY="sk-docs-test",
        OPENAI_BASE_URL=f"{fake_upstream}/v1",
        OPENAI_API_KEY="sk-docs-test",
    )
    result = subprocess.run(
        [sys.executable, script.name], cwd=workdir, env=env, capture_output=True, text=True, timeout=120
    )
    assert result.returncode == 0, f"{block.id} exited {result.returncode}:\n{result.stderr[-3000:]}"
    assert result.stdout.strip(), f"{block.id} printed nothing"


@pytest.mark.parametrize(
    "command", [c for b in _blocks("bash", "server") for c in commands(b.text)], ids=lambda c: c[:60]
)
def test_server_command_starts_and_stops(command: str, workdir: Path) -> None:
    proc = subprocess.Popen(
        ["bash", "-c", f"exec {command} --port 0"],
        cwd=workdir,
        env=_env(workdir),
        stdout=subprocess.PIPE,
        stderr=subprocess.STDOUT,
        text=True,
    )
    try:
        assert proc.stdout is not None
        seen, port, deadline = [], None, time.monotonic() + 60
        while port is None and time.monotonic() < deadline:
            line = proc.stdout.readline()
            if not line:
                break
            seen.append(line)
            if "proxy.start" in line or '"event": "proxy.start"' in line:
                m = re.search(r"""\bport["']?[=:]\s*(\d+)""", line)
                port = int(m.group(1)) if m else None
        assert port, f"{command}: no proxy.start line with its port:\n{''.join(seen)[-3000:]}"
        with urllib.request.urlopen(f"http://127.0.0.1:{port}/agentcache/v1/health", timeout=10) as resp:
            assert resp.status == 200
            assert json.loads(resp.read())["status"] == "ok"
        proc.send_signal(signal.SIGINT)
        rest, _ = proc.communicate(timeout=30)
        assert proc.returncode == 0, f"{command} exited {proc.returncode}:\n{rest[-3000:]}"
        assert "proxy.stopped" in rest
    finally:
        if proc.poll() is None:
            proc.kill()
            proc.wait()


@pytest.mark.parametrize("block", _blocks("toml", "file"), ids=lambda b: b.id)
def test_config_file_loads_every_value(block: Block, workdir: Path) -> None:
    """A config example on a page sets what it says: no key is rejected, none is silently ignored."""
    from agentcache._config import load_settings
    from agentcache.proxy._config import load_proxy_config

    path = workdir / block.arg
    raw = tomllib.loads(block.text)
    settings = load_settings(path)
    pipeline = raw.get("agentcache", {k: v for k, v in raw.items() if k != "proxy"})
    for key, value in pipeline.items():
        if key != "models":
            assert getattr(settings, key) == value, (block.id, key)
    for table in (pipeline.get("models", {}), raw.get("models", {})):
        for provider, rows in table.items():
            for model, fields in rows.items():
                assert settings.models.get(provider, {}).get(model) == fields, f"{block.id}: {provider}/{model} ignored"
    if "proxy" in raw:
        proxy = load_proxy_config(path)
        for key, value in raw["proxy"].items():
            assert getattr(proxy, key) == value, (block.id, key)


# --- reference pages against the code -----------------------------------------------------------------------------


def _table_names(page: str) -> set[str]:
    """The code-spanned first cells of the page's table rows (`name` or `name` (`--option`))."""
    text = (DOCS / page).read_text()
    return set(re.findall(r"^\| `([^`]+)`", text, re.M))


def test_api_pages_cover_the_public_surface() -> None:
    import agentcache

    pages = (DOCS / "api").glob("*.md")
    shown = {m for p in pages for m in re.findall(r"^::: agentcache\.(\w+)$", p.read_text(), re.M)}
    assert shown == set(agentcache.__all__), (set(agentcache.__all__) - shown, shown - set(agentcache.__all__))


def test_causes_page_names_every_cause() -> None:
    from agentcache import Cause

    causes = {c.value for c in Cause}
    named = {n for n in _table_names("causes.md") if re.fullmatch(r"[a-z_]+(\.[a-z_]+)?", n)}
    assert named == causes, (causes - named, named - causes)


def test_settings_page_names_every_setting() -> None:
    from agentcache import Settings
    from agentcache.proxy._config import ProxyConfig

    names = _table_names("settings.md")
    assert set(Settings.model_fields) <= names
    assert set(ProxyConfig.model_fields) <= names
    documented = {n for n in names if re.fullmatch(r"[a-z_0-9]+", n)}
    assert documented <= set(Settings.model_fields) | set(ProxyConfig.model_fields), (
        documented - set(Settings.model_fields) - set(ProxyConfig.model_fields)
    )


def test_metrics_page_names_every_metric() -> None:
    pytest.importorskip("prometheus_client")
    from agentcache.proxy._metrics import ProxyMetrics

    exported = set()
    for family in ProxyMetrics().registry.collect():
        exported.add(f"{family.name}_total" if family.type == "counter" else family.name)
    documented = {n for n in _table_names("metrics.md") if n.startswith("agentcache_")}
    assert documented == exported, (exported - documented, documented - exported)


def test_json_page_names_every_key(workdir: Path) -> None:
    keys: set[str] = set()

    def walk(value: object) -> None:
        if isinstance(value, dict):
            for k, v in value.items():
                if not re.fullmatch(r"[a-z_]+", k) or k in ("as_sent", "agentcache", "ideal", "reported"):
                    walk(v)
                    continue
                keys.add(k)
                walk(v)
        elif isinstance(value, list):
            for v in value[:3]:
                walk(v)

    for args in (
        ["audit", "data/openhands/basic_gui_mode.json", "--json"],
        ["audit", "tests/cases/k05-seconds-timestamp-in-system.json", "--json"],
        ["plan", "tests/cases/k01-tools-reordered.json", "--json"],
    ):
        result = subprocess.run(
            ["agentcache", *args], cwd=workdir, env=_env(workdir), capture_output=True, text=True, timeout=120
        )
        assert result.returncode == 0, result.stderr
        doc = json.loads(result.stdout)
        walk({k: v for k, v in doc.items() if k not in ("checklist", "recommendations")} if args[0] == "plan" else doc)
    text = (DOCS / "json.md").read_text()
    missing = sorted(k for k in keys if f'"{k}"' not in text and f"`{k}`" not in text)
    assert not missing, f"JSON keys the commands print that docs/json.md does not name: {missing}"
