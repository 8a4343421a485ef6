"""``import agentcache`` is cheap (issue 22): each public name is imported on first use, and the command line
imports what a command runs only when it runs; the public names stay what they were."""

from __future__ import annotations

import ast
import subprocess
import sys
from pathlib import Path

import agentcache

INIT = Path(agentcache.__file__)


def _loaded_after(code: str, prefix: str = "agentcache") -> set[str]:
    """The modules named ``prefix*`` loaded once ``code`` ran in a fresh interpreter."""
    probe = f"{code}\nimport sys\nprint(' '.join(m for m in sys.modules if m.startswith({prefix!r})))"
    done = subprocess.run([sys.executable, "-c", probe], capture_output=True, text=True, timeout=60, check=True)
    return set(done.stdout.split())


def test_import_agentcache_loads_no_submodule_until_a_name_is_used() -> None:
    assert _loaded_after("import agentcache") == {"agentcache"}
    loaded = _loaded_after("from agentcache import Sessions")
    assert "agentcache.session" in loaded  # the session core, not the audit and its reports
    assert not loaded & {"agentcache._audit", "agentcache.analysis._render", "agentcache.analysis._html"}


def test_help_imports_no_command_machinery() -> None:
    help_run = "import contextlib, sys\nfrom agentcache._cli import main\nsys.argv = ['agentcache', '--help']\n"
    help_run += "with contextlib.suppress(SystemExit):\n    main()"
    loaded = _loaded_after(help_run, prefix="")
    for heavy in (
        "agentcache._audit",
        "agentcache.analysis",
        "agentcache.session",
        "agentcache.plan",
        "agentcache.proxy",
    ):
        assert not any(m == heavy or m.startswith(heavy + ".") for m in loaded), heavy
    assert "agentcache._cli" in loaded and "structlog" not in loaded and "rich.progress" not in loaded


def test_every_public_name_resolves_to_its_defining_module() -> None:
    tree = ast.parse(INIT.read_text())
    guarded = next(n for n in tree.body if isinstance(n, ast.If) and ast.unparse(n.test) == "TYPE_CHECKING")
    imported = {
        alias.name: "." * node.level + (node.module or "")
        for node in guarded.body
        if isinstance(node, ast.ImportFrom)
        for alias in node.names
    }
    assert imported == agentcache._EXPORTS  # what mypy sees is what runs
    assert sorted(agentcache._EXPORTS) == sorted(agentcache.__all__)
    for name in agentcache.__all__:
        obj = getattr(agentcache, name)
        assert obj is getattr(sys.modules[f"agentcache{agentcache._EXPORTS[name]}"], name)
    assert agentcache.Sessions.__module__ == "agentcache" and agentcache.wrap.__module__ == "agentcache"
    assert "Sessions" in dir(agentcache)


def test_an_unknown_name_is_an_attribute_error() -> None:
    try:
        agentcache.Sesions  # type: ignore[attr-defined]  # noqa: B018
    except AttributeError as exc:
        assert "has no attribute 'Sesions'" in str(exc)
    else:
        raise AssertionError("no AttributeError")
