"""How to install an optional extra, worded for the way agentcache itself was installed.

From PyPI the command is ``pip install 'agentcache[proxy]'``; from a clone (an editable install, ``pip install
-e .``) it is ``pip install -e '<clone>[proxy]'``, since PyPI's agentcache would replace the clone. A clone is
recognised by the ``pyproject.toml`` of agentcache beside the imported package (an installed wheel has none);
otherwise the installed distribution's ``direct_url.json`` (PEP 610) tells an editable install from an index
one. When neither says, both commands are given.
"""

from __future__ import annotations

import json
from importlib import metadata
from pathlib import Path

__all__ = ["install_hint"]

#: The directory holding the ``agentcache`` package (the clone's root when run from a clone).
_PACKAGE_PARENT = Path(__file__).resolve().parent.parent


def _editable_source() -> str | None:
    """The clone directory agentcache runs from, ``""`` for an install from an index or a wheel, None when
    unknown."""
    project = _PACKAGE_PARENT / "pyproject.toml"
    try:
        if 'name = "agentcache"' in project.read_text(encoding="utf-8"):
            return str(_PACKAGE_PARENT)
    except (OSError, UnicodeDecodeError):
        pass
    try:
        text = metadata.distribution("agentcache").read_text("direct_url.json")
    except metadata.PackageNotFoundError:
        return None
    if text is None:
        return ""  # installed from an index: no direct URL recorded
    try:
        info = json.loads(text)
    except ValueError:
        return None
    editable = isinstance(info, dict) and bool((info.get("dir_info") or {}).get("editable"))
    return None if editable else ""  # an editable install whose project file is not beside it: say both


def install_hint(extra: str) -> str:
    """The command that installs agentcache's ``extra`` (``proxy``, ``sdk``, ``serve``...) here: ``pip install
    -e '/path/to/clone[proxy]'`` for an editable install (a clone), ``pip install 'agentcache[proxy]'`` for a
    PyPI install, or both (``... (from a clone: pip install -e '.[proxy]')``) when the install kind is unknown."""
    source = _editable_source()
    if source:
        return f"pip install -e '{source}[{extra}]'"
    pypi = f"pip install 'agentcache[{extra}]'"
    return pypi if source == "" else f"{pypi} (from a clone: pip install -e '.[{extra}]')"
