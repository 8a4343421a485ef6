"""How to install an optional extra, worded for the way agentcache itself was installed.

From PyPI the command is ``pip install 'agentcache[proxy]'``; from a clone (an editable install, ``pip install
-e .``) it is ``pip install -e '<clone>[proxy]'``, since PyPI's agentcache would replace the clone. The
installed distribution's ``direct_url.json`` (PEP 610) says which: ``dir_info.editable`` and the clone's
``file://`` URL. When it cannot be read, both commands are given.
"""

from __future__ import annotations

import json
from importlib import metadata
from urllib.parse import unquote, urlsplit

__all__ = ["install_hint"]


def _editable_source() -> str | None:
    """The clone directory of an editable install, ``""`` for a regular install, None when unknown."""
    try:
        text = metadata.distribution("agentcache").read_text("direct_url.json")
    except metadata.PackageNotFoundError:
        return None
    if text is None:
        return ""  # installed from an index or a wheel: no direct URL recorded
    try:
        info = json.loads(text)
    except ValueError:
        return None
    if not isinstance(info, dict) or not (info.get("dir_info") or {}).get("editable"):
        return ""
    url = urlsplit(str(info.get("url", "")))
    return unquote(url.path) if url.scheme == "file" and url.path else None


def install_hint(extra: str) -> str:
    """The command that installs agentcache's ``extra`` (``proxy``, ``sdk``, ``serve``...) here: ``pip install
    -e '/path/to/clone[proxy]'`` for an editable install (a clone), ``pip install 'agentcache[proxy]'`` for a
    PyPI install, or both (``... (from a clone: pip install -e '.[proxy]')``) when the install kind is unknown."""
    source = _editable_source()
    if source:
        return f"pip install -e '{source}[{extra}]'"
    pypi = f"pip install 'agentcache[{extra}]'"
    return pypi if source == "" else f"{pypi} (from a clone: pip install -e '.[{extra}]')"
