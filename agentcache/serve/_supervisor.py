"""Run a :class:`~._plan.ServePlan`: start the children stage by stage, wait until each is ready, watch them,
and stop them all.

* Each child gets its own process group (``start_new_session``), so a Ctrl-C in the terminal reaches only the
  supervisor, which then stops every child in reverse start order (SIGTERM to the group, SIGKILL after
  ``stop_timeout`` seconds). On Linux a child also gets SIGTERM if the supervisor dies without cleaning up
  (``PR_SET_PDEATHSIG``).
* A stage starts once every child of the earlier stages is ready (``ReadyCheck``: HTTP 200 or a TCP accept),
  with a progress display on stderr.
* SIGINT / SIGTERM: stop everything, exit code 0. A child that exits (while starting or later) stops the rest;
  the exit code is the child's (128 + N for a signal N; 1 if it exited with 0), and its last log lines are shown.
  A child not ready after ``ready_timeout`` seconds: same, exit code 1.

Every child writes stdout and stderr to ``<log_dir>/<name>.log``.
"""

from __future__ import annotations

import contextlib
import os
import signal
import socket
import subprocess
import sys
import threading
import time
import urllib.error
import urllib.request
from collections.abc import Callable
from dataclasses import dataclass
from pathlib import Path
from types import FrameType
from typing import IO

from rich.console import Console
from rich.progress import Progress, SpinnerColumn, TaskID, TextColumn, TimeElapsedColumn

from ._plan import ProcessSpec, ReadyCheck, ServePlan

__all__ = ["Failure", "Supervisor", "is_ready", "tail"]

#: Log lines shown when a child fails.
TAIL_LINES = 20
_LOOPBACK_OPENER = urllib.request.build_opener(urllib.request.ProxyHandler({}))


def tail(path: Path, lines: int = TAIL_LINES) -> str:
    """The last ``lines`` lines of ``path`` ('' when unreadable)."""
    try:
        text = path.read_text(encoding="utf-8", errors="replace")
    except OSError:
        return ""
    return "\n".join(text.splitlines()[-lines:])


def is_ready(check: ReadyCheck, timeout: float = 2.0) -> bool:
    """One readiness probe: GET answers 200 (``http``), or a TCP connection is accepted (``tcp``)."""
    if check.kind == "tcp":
        try:
            with socket.create_connection((check.host, check.port), timeout=timeout):
                return True
        except OSError:
            return False
    try:
        with _LOOPBACK_OPENER.open(check.url, timeout=timeout) as response:
            return int(response.status) == 200
    except (urllib.error.URLError, ConnectionError, TimeoutError, OSError, ValueError):
        return False


def _exit_code(returncode: int) -> int:
    """A child's return code as the supervisor's exit code."""
    if returncode < 0:
        return 128 - returncode
    return returncode or 1


@dataclass(frozen=True, slots=True)
class Failure:
    """Why the supervisor stopped early: the child ``name``, ``reason``, the ``exit_code`` to return, the
    child's ``log_path`` and its last lines (``log_tail``)."""

    name: str
    reason: str
    exit_code: int
    log_path: Path
    log_tail: str

    def __str__(self) -> str:
        text = f"{self.name} {self.reason}; last lines of {self.log_path}:"
        return text + ("\n" + self.log_tail if self.log_tail else " (empty)")


def _die_with_parent() -> None:  # pragma: no cover - runs in the child between fork and exec
    try:
        import ctypes

        ctypes.CDLL("libc.so.6", use_errno=True).prctl(1, signal.SIGTERM)  # PR_SET_PDEATHSIG
    except Exception:
        pass


@dataclass(slots=True)
class _Child:
    spec: ProcessSpec
    process: subprocess.Popen[bytes]
    log_path: Path
    log_file: IO[bytes]
    started: float


class Supervisor:
    """Runs one plan. ``log_dir``: where the children's logs go. ``console``: progress and messages (stderr).
    ``ready_timeout``: seconds a child may take to become ready. ``stop_timeout``: seconds between SIGTERM and
    SIGKILL. ``poll``: seconds between checks."""

    def __init__(
        self,
        plan: ServePlan,
        log_dir: Path,
        *,
        console: Console | None = None,
        ready_timeout: float = 900.0,
        stop_timeout: float = 15.0,
        poll: float = 0.25,
    ) -> None:
        self.plan = plan
        self.log_dir = Path(log_dir)
        self.console = console or Console(stderr=True)
        self.ready_timeout = ready_timeout
        self.stop_timeout = stop_timeout
        self.poll = poll
        self.children: list[_Child] = []
        self.failure: Failure | None = None
        self._stop = threading.Event()
        self._signal: int | None = None

    # -- public ------------------------------------------------------------------------------------------------

    def run(self, on_ready: Callable[[ServePlan], None] | None = None) -> int:
        """Start, wait, watch and stop; returns the exit code (0 after a requested stop)."""
        restore = self._install_signal_handlers()
        try:
            self.log_dir.mkdir(parents=True, exist_ok=True)
            for stage in self.plan.stages:
                for spec in stage:
                    if self.failure is None:
                        self._start(spec)
                if not self._wait_ready(stage):
                    return self._finish()
            if on_ready is not None:
                on_ready(self.plan)
            self._watch()
            return self._finish()
        finally:
            self.stop()
            restore()

    def request_stop(self) -> None:
        """Ask :meth:`run` to stop every child and return 0 (thread-safe; what SIGINT/SIGTERM do)."""
        self._stop.set()

    def stop(self) -> None:
        """Stop every child still running: SIGTERM to each process group in reverse start order, then SIGKILL
        those still alive after ``stop_timeout`` seconds. Idempotent."""
        alive = [c for c in reversed(self.children) if c.process.poll() is None]
        for child in alive:
            self._signal_group(child, signal.SIGTERM)
        deadline = time.monotonic() + self.stop_timeout
        for child in alive:
            try:
                child.process.wait(timeout=max(0.0, deadline - time.monotonic()))
            except subprocess.TimeoutExpired:
                self._signal_group(child, signal.SIGKILL)
                child.process.wait()
        for child in alive:
            # The group may hold grandchildren (SGLang's scheduler, detokenizer) that outlive the leader.
            self._signal_group(child, signal.SIGKILL)
        for child in self.children:
            if not child.log_file.closed:
                child.log_file.close()

    # -- internals ---------------------------------------------------------------------------------------------

    def _install_signal_handlers(self) -> Callable[[], None]:
        if threading.current_thread() is not threading.main_thread():
            return lambda: None

        def handler(signum: int, frame: FrameType | None) -> None:
            self._signal = signum
            self._stop.set()

        previous = {s: signal.signal(s, handler) for s in (signal.SIGINT, signal.SIGTERM)}

        def restore() -> None:
            for s, h in previous.items():
                signal.signal(s, h)

        return restore

    def _start(self, spec: ProcessSpec) -> None:
        log_path = self.log_dir / f"{spec.name}.log"
        log_file = open(log_path, "ab")  # noqa: SIM115 - closed in stop()
        env = {**os.environ, **spec.env}
        try:
            process = subprocess.Popen(
                list(spec.argv),
                stdin=subprocess.DEVNULL,
                stdout=log_file,
                stderr=subprocess.STDOUT,
                env=env,
                start_new_session=True,
                preexec_fn=_die_with_parent if sys.platform == "linux" else None,
            )
        except OSError as exc:
            log_file.write(f"agentcache serve: cannot start {spec.argv[0]}: {exc}\n".encode())
            log_file.close()
            self.failure = Failure(spec.name, f"could not start ({exc.strerror or exc})", 127, log_path, "")
            self._stop.set()
            return
        self.children.append(_Child(spec, process, log_path, log_file, time.monotonic()))

    def _signal_group(self, child: _Child, sig: int) -> None:
        with contextlib.suppress(ProcessLookupError, PermissionError):
            os.killpg(child.process.pid, sig)

    def _exited(self) -> _Child | None:
        return next((c for c in self.children if c.process.poll() is not None), None)

    def _fail_exited(self, child: _Child, when: str) -> None:
        self.failure = Failure(
            child.spec.name, exit_reason(child.process.returncode, when), _exit_code(child.process.returncode),
            child.log_path, tail(child.log_path),
        )  # fmt: skip

    def _wait_ready(self, stage: list[ProcessSpec]) -> bool:
        """Block until every child of ``stage`` is ready; False on a failure or a requested stop."""
        if self.failure is not None:
            return False
        pending = {c.spec.name: c for c in self.children if c.spec in stage and c.spec.ready is not None}
        with _Display(self.console) as display:
            for name, child in pending.items():
                assert child.spec.ready is not None
                display.add(name, child.spec.ready.url)
            while pending:
                if self._stop.is_set():
                    return False
                exited = self._exited()
                if exited is not None:
                    self._fail_exited(exited, "while starting")
                    return False
                now = time.monotonic()
                for name, child in list(pending.items()):
                    assert child.spec.ready is not None
                    if is_ready(child.spec.ready):
                        display.done(name, now - child.started)
                        del pending[name]
                    elif now - child.started > self.ready_timeout:
                        self.failure = Failure(
                            name,
                            f"not ready after {self.ready_timeout:.0f}s ({child.spec.ready.url})",
                            1,
                            child.log_path,
                            tail(child.log_path),
                        )
                        return False
                self._stop.wait(self.poll)
        return True

    def _watch(self) -> None:
        while not self._stop.is_set():
            exited = self._exited()
            if exited is not None:
                self._fail_exited(exited, "")
                return
            self._stop.wait(self.poll)

    def _finish(self) -> int:
        if self.failure is None:
            if self._signal is not None:
                name = signal.Signals(self._signal).name
                self.console.print(f"agentcache serve: {name}, stopping every process", highlight=False, soft_wrap=True)
            return 0
        others = [c.spec.name for c in reversed(self.children) if c.process.poll() is None]
        message = f"agentcache serve: {self.failure}"
        if others:
            message += f"\nstopping {', '.join(others)}"
        self.console.print(message, markup=False, highlight=False, soft_wrap=True)
        return self.failure.exit_code


class _Display:
    """Readiness progress: a live spinner per child on a terminal, plain lines otherwise."""

    def __init__(self, console: Console) -> None:
        self.console = console
        self.live = console.is_terminal
        self.progress: Progress | None = None
        self.tasks: dict[str, TaskID] = {}

    def __enter__(self) -> _Display:
        if self.live:
            self.progress = Progress(
                SpinnerColumn(), TextColumn("{task.description}"), TimeElapsedColumn(), console=self.console
            )
            self.progress.start()
        return self

    def __exit__(self, *exc: object) -> None:
        if self.progress is not None:
            self.progress.stop()

    def add(self, name: str, url: str) -> None:
        if self.progress is not None:
            self.tasks[name] = self.progress.add_task(f"{name}: waiting for {url}", total=1)
        else:
            self.console.print(
                f"agentcache serve: waiting for {name} ({url})", markup=False, highlight=False, soft_wrap=True
            )

    def done(self, name: str, seconds: float) -> None:
        if self.progress is not None:
            self.progress.update(self.tasks[name], description=f"{name}: ready", completed=1)
        else:
            self.console.print(
                f"agentcache serve: {name} ready after {seconds:.1f}s", markup=False, highlight=False, soft_wrap=True
            )


def exit_reason(code: int, when: str = "") -> str:
    """How a child ended, for the failure line: ``exited with code 3 while starting``, ``was killed by signal 9
    (SIGKILL)`` (``code``: a Popen return code, negative for a signal; ``when``: optional, e.g. ``while
    starting``)."""
    if code >= 0:
        what = f"exited with code {code}"
    else:
        try:
            what = f"was killed by signal {-code} ({signal.Signals(-code).name})"
        except ValueError:
            what = f"was killed by signal {-code}"
    return f"{what} {when}" if when else what
