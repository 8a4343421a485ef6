"""The ``--record`` files of one directory: rotation by size, the total cap, owner-only permissions (the policy and
its reasons: :mod:`agentcache.proxy._record`, "Bounded" and "Private")."""

from __future__ import annotations

import os
import time
from collections.abc import Callable
from contextlib import suppress
from pathlib import Path
from typing import Any

from .._exceptions import ConfigError
from .._log import get_logger

__all__ = ["FILE_PREFIX", "FILE_SUFFIX", "RotatingFiles", "prepare_dir"]

log = get_logger("agentcache.proxy")

FILE_PREFIX = "agentcache-proxy-"
FILE_SUFFIX = ".jsonl"


def prepare_dir(path: Path) -> Path:
    """Create ``path`` (mode 0700) if it does not exist, for ``--record``; raises ConfigError when it cannot be
    created or is not a writable directory (checked at start-up: later failures only cost lines)."""
    try:
        path.mkdir(mode=0o700, parents=True, exist_ok=True)
    except OSError as exc:
        raise ConfigError(f"--record {path}: cannot create the directory: {exc.strerror or exc}") from None
    if not os.access(path, os.W_OK | os.X_OK):
        raise ConfigError(f"--record {path}: the directory is not writable")
    return path


def _order(name: str) -> tuple[str, int]:
    """Sort key of a recording file name: its start time, then its sequence number."""
    stem = name[len(FILE_PREFIX) : -len(FILE_SUFFIX)]
    stamp, _, seq = stem.rpartition("-")
    return (stamp, int(seq)) if seq.isdigit() else (stem, 0)


def _write_all(fd: int, data: bytes) -> None:
    view = memoryview(data)
    while view:
        view = view[os.write(fd, view) :]


class RotatingFiles:
    """The recording files of one directory (see the module docstring, "Bounded"): :meth:`write` appends a line,
    rotating and deleting the oldest files as needed. ``max_file``/``max_total``: bytes. Used by one thread only."""

    def __init__(self, directory: Path, max_file: int, max_total: int, clock: Callable[[], float] = time.time) -> None:
        self.directory = directory
        self.max_file = max_file
        self.max_total = max_total
        self._clock = clock
        self._fd: int | None = None
        self._size = 0
        self._seq = 0
        self._files: list[list[Any]] = []  # [name, bytes], oldest first; the open file last
        self._total = 0

    @property
    def current(self) -> Path | None:
        """The file being written, or None."""
        return self.directory / self._files[-1][0] if self._fd is not None else None

    def write(self, line: bytes) -> None:
        """Append ``line`` (whole, or not at all); raises OSError when the disk refuses it."""
        if self._fd is not None and (
            os.fstat(self._fd).st_nlink == 0  # deleted under us (the directory too?): a new file
            or (self._size and self._size + len(line) > self.max_file)
        ):
            self.close()
        if self._fd is None:
            self._open()
        assert self._fd is not None
        try:
            _write_all(self._fd, line)
        except OSError:
            with suppress(OSError):
                os.ftruncate(self._fd, self._size)  # no partial line left behind
            raise
        self._size += len(line)
        self._files[-1][1] = self._size
        self._total += len(line)
        self._trim()

    def close(self) -> None:
        """Close the file being written (the next line opens a new one)."""
        fd, self._fd = self._fd, None
        if fd is not None:
            with suppress(OSError):
                os.close(fd)

    def _open(self) -> None:
        self.directory.mkdir(mode=0o700, parents=True, exist_ok=True)
        self._files = self._scan()
        self._total = sum(size for _, size in self._files)
        stamp = time.strftime("%Y%m%dT%H%M%SZ", time.gmtime(self._clock()))
        flags = os.O_WRONLY | os.O_CREAT | os.O_EXCL | os.O_APPEND | getattr(os, "O_CLOEXEC", 0)
        while True:
            self._seq += 1
            name = f"{FILE_PREFIX}{stamp}-{self._seq:05d}{FILE_SUFFIX}"
            try:
                self._fd = os.open(self.directory / name, flags, 0o600)
            except FileExistsError:  # another proxy recording here started in the same second
                continue
            break
        self._size = 0
        self._files.append([name, 0])

    def _scan(self) -> list[list[Any]]:
        found: list[list[Any]] = []
        with os.scandir(self.directory) as entries:
            for entry in entries:
                name = entry.name
                if name.startswith(FILE_PREFIX) and name.endswith(FILE_SUFFIX):
                    with suppress(OSError):
                        if entry.is_file(follow_symlinks=False):
                            found.append([name, entry.stat(follow_symlinks=False).st_size])
        found.sort(key=lambda f: _order(f[0]))
        return found

    def _trim(self) -> None:
        while self._total > self.max_total and len(self._files) > 1:
            name, size = self._files.pop(0)
            self._total -= size
            try:
                (self.directory / name).unlink()
            except FileNotFoundError:
                pass
            except OSError as exc:  # not ours to delete after all: left, and not counted again until a rescan
                log.warning("proxy.record_trim_failed", file=name, error=type(exc).__name__)
