"""The registry of agents' own log formats: how each is recognised, read, and where the agent keeps it.

Each reader module (``_claude_code``, ``_codex``, ...) owns its format's knowledge and declares one
:class:`LogFormat`; :data:`LOG_FORMATS` lists them. Detection (:mod:`agentcache.loaders._detect`) asks each in
turn: a ``.jsonl`` file by its first JSON lines (``sniff_lines``), any other file by its path (``sniff_path``:
a SQLite database, a directory layout). ``default_roots`` names where the agent keeps its logs on this machine
(environment variables first), for ``agentcache audit`` with no path.
"""

from __future__ import annotations

from collections.abc import Callable, Mapping
from dataclasses import dataclass
from pathlib import Path
from typing import Any

from agentcache.loaders import _claude_code, _claude_code_bodies, _codex, _opencode, _qwen
from agentcache.loaders._agentlog import LogRead

__all__ = ["LOG_FORMATS", "LogFormat"]


def _never(_: Any) -> bool:
    return False


def _nowhere(_: Mapping[str, str]) -> list[Path]:
    return []


@dataclass(frozen=True, slots=True)
class LogFormat:
    """One agent's log format. ``name``: the ``--format`` value. ``client``: the agent's name in reports
    (``Claude Code``). ``read(path)``: every API call of one file (:class:`~agentcache.loaders._agentlog.LogRead`).
    ``sniff_lines(first)``: True when the first JSON objects of a ``.jsonl`` file (at most
    :data:`~agentcache.loaders._detect.SNIFF_LINES`) are this format's. ``sniff_path(path)``: True for a file of
    this format that is not JSON lines. ``default_roots(environ)``: the folders (or files) where the agent keeps
    its logs, existing or not, most specific first. ``suffixes``: the file suffixes worth opening when a
    directory is searched. ``read_calls(path)``: the calls alone, when ``read`` also rebuilds exact request bodies
    (Claude Code 2.1.332): cheaper, for inputs too large to hold their bodies; None when ``read`` gives calls only.
    ``leaves_out``: the calls the agent makes but does not log (reports say so beside its figures)."""

    name: str
    client: str
    read: Callable[[Path], LogRead]
    sniff_lines: Callable[[list[dict[str, Any]]], bool] = _never
    sniff_path: Callable[[Path], bool] = _never
    default_roots: Callable[[Mapping[str, str]], list[Path]] = _nowhere
    suffixes: tuple[str, ...] = (".jsonl",)
    read_calls: Callable[[Path], LogRead] | None = None
    leaves_out: str | None = None


#: Every agent log format agentcache reads, in detection order.
LOG_FORMATS: tuple[LogFormat, ...] = (
    LogFormat(
        "claude-code",
        "Claude Code",
        *_claude_code.HOOKS,
        read_calls=_claude_code.read_calls,
        leaves_out="its compaction and session-title calls (not in its transcripts; its body dumps have them)",
    ),
    LogFormat("claude-code-bodies", "Claude Code request dumps", *_claude_code_bodies.HOOKS),
    LogFormat("codex", "Codex CLI", _codex.read_codex, _codex.sniff_lines, default_roots=_codex.default_roots),
    LogFormat(
        "opencode",
        "opencode",
        _opencode.read_opencode,
        sniff_path=_opencode.sniff_path,
        default_roots=_opencode.default_roots,
        suffixes=(".db", ".json"),
        leaves_out="its session-title calls (made with its small model; not in its session data)",
    ),
    LogFormat("qwen-code", "Qwen Code", _qwen.read_qwen, _qwen.sniff_lines, default_roots=_qwen.default_roots),
)
