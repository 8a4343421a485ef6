"""The :class:`LlamaServer` process: start ``llama-server`` on loopback and a free port, wait until healthy, stop.
Its command line comes from :func:`._command.llama_server_argv`. Standard library only."""

from __future__ import annotations

import contextlib
import os
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

from ._command import LOOPBACK, RESERVED_ARGS, LlamaOptions, llama_server_argv
from ._locate import find_llama_server

__all__ = ["LlamaServer", "LlamaServerError"]

# Loopback requests never go through an HTTP(S)_PROXY from the environment.
_LOOPBACK_OPENER = urllib.request.build_opener(urllib.request.ProxyHandler({}))


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
        kv_unified: bool | None = None,
        metrics: bool = False,
        cache_prompt: bool = True,
        cache_ram_mib: int | None = None,
        chat_template_file: Path | str | None = None,
        extra_args: Sequence[str] = (),
        startup_timeout: float = 120.0,
        log_path: Path | str | None = None,
    ) -> None:
        """Configure (but do not start) a server.

        The keyword arguments from ``parallel`` to ``extra_args`` are those of :class:`LlamaOptions` (the one
        description of llama-server's flags, shared with ``agentcache serve``); ``None`` leaves the server's
        default.

        Args:
            model: path to a GGUF file.
            binary: the ``llama-server`` executable; default :func:`find_llama_server`.
            parallel: number of slots (``--parallel``).
            ctx_size: total context over all slots (``--ctx-size``); ``None`` leaves the model's default.
            kv_unified: ``--kv-unified`` (True) or ``--no-kv-unified`` (False, one KV sequence per slot).
            metrics: serve ``/metrics`` (``--metrics``).
            cache_prompt: ``False`` turns the per-slot prompt cache off (``--no-cache-prompt``).
            cache_ram_mib: size of the host-memory prompt cache in MiB (``--cache-ram``; 0 turns it off).
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
            if arg.split("=", 1)[0] in RESERVED_ARGS:
                raise ValueError(f"{arg!r} is set by LlamaServer itself and cannot be passed in extra_args")
        if parallel is not None and parallel < 1:
            raise ValueError(f"parallel must be >= 1, got {parallel}")
        if ctx_size is not None and ctx_size < 1:
            raise ValueError(f"ctx_size must be >= 1, got {ctx_size}")
        if cache_ram_mib is not None and cache_ram_mib < 0:
            raise ValueError(f"cache_ram_mib must be >= 0, got {cache_ram_mib}")
        self.options: LlamaOptions = LlamaOptions(
            parallel=parallel,
            ctx_size=ctx_size,
            kv_unified=kv_unified,
            metrics=metrics,
            cache_prompt=cache_prompt,
            cache_ram_mib=cache_ram_mib,
            chat_template_file=Path(chat_template_file) if chat_template_file is not None else None,
            extra_args=tuple(extra_args),
        )
        """The server's flags apart from model, host and port (frozen; what :meth:`command` emits)."""
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

    @property
    def parallel(self) -> int | None:
        """Number of slots (``--parallel``), or ``None`` for the server's default."""
        return self.options.parallel

    @property
    def ctx_size(self) -> int | None:
        """Total context over all slots (``--ctx-size``), or ``None`` for the model's default."""
        return self.options.ctx_size

    @property
    def chat_template_file(self) -> Path | None:
        """The Jinja chat template passed with ``--chat-template-file``, if any."""
        return self.options.chat_template_file

    @property
    def extra_args(self) -> tuple[str, ...]:
        """The arguments appended last."""
        return self.options.extra_args

    def command(self, port: int) -> list[str]:
        """The full command line used to start the server on ``127.0.0.1:port``."""
        return llama_server_argv(self.binary, self.model, port, self.options, host=LOOPBACK)

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
