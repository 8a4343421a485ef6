"""A Claude Code session resumed by another release rejoins its lineage's main session (the real CLIs through the
proxy): Claude Code 2.1.197 opens a session and continues it, then 2.1.332 ``--resume``s it. 2.1.332 sends other
tools and system and re-serializes the history (its first message without the reminder block, strings for one-text
lists, a ``role: "system"`` message at the end), so its requests continue nothing the index holds; they carry the
main session's last request's final item, so they are the main session again, and the change is a break the turn
report names (not a side session with a cache miss)."""

from __future__ import annotations

import shutil
from pathlib import Path
from typing import Any

import pytest

from tests import needs
from tests.clients.claude_logs import find, run_print
from tests.clients.drivers import ClaudeCode
from tests.clients.fake_upstream import FakeUpstream, serve

pytest.importorskip("starlette", reason=needs.extra("proxy"))

from agentcache._log import capture_logs
from agentcache.proxy import ProxyConfig, create_app
from tests.test_proxy_support import ServerThread, settings

OLD, NEW = "2.1.197", "2.1.332"


def _run(binary: str, client: ClaudeCode, env: dict[str, str], *args: str) -> None:
    proc = run_print(binary, client, env, *args)
    assert proc.returncode == 0, proc.stderr[-1000:]


def test_a_session_resumed_by_a_newer_release_rejoins_the_main_session(tmp_path: Path) -> None:
    old, new = find(OLD), find(NEW)
    if old is None or new is None:
        pytest.skip(needs.agent_cli("claude", "pinned" if old is None else "newest"))
    home = tmp_path / "home"
    shutil.rmtree(home, ignore_errors=True)
    home.mkdir(parents=True)
    client = ClaudeCode(home)
    with serve(FakeUpstream(realistic=True)) as (_fake, url):
        config = ProxyConfig(upstream=url)
        with capture_logs() as logs, ServerThread(create_app(config, settings=settings()), proxy=config) as proxy:
            env = client.env(proxy.url)
            _run(old, client, env, "Print a marker. agentcache-script:shell")
            session = next((home / "claude" / "projects").glob("*/*.jsonl")).stem
            _run(old, client, env, "--continue", "Print again. agentcache-script:shell")
            before = len([ln for ln in logs if ln.get("event") == "proxy.request"])
            _run(new, client, env, "--resume", session, "Back after a pause. agentcache-script:shell")
    lines: list[dict[str, Any]] = [ln for ln in logs if ln.get("event") == "proxy.request"]
    older, resumed = lines[:before], lines[before:]
    main = [ln for ln in older if ln["session_signal"]["session_id"] == session]
    assert len(main) >= 3  # 2.1.197's agent loop: its own session id, its title request a side session
    assert all(ln["session_signal"]["lineage"] == session for ln in lines)
    assert resumed and all(ln["session_signal"]["session_id"] == session for ln in resumed), [
        ln["session_signal"] for ln in resumed
    ]
    first = resumed[0]["reuse_boundary"]
    assert first["cause"] == "tools.changed" and first["tokens_lost"] > 0  # a release with other tools: a break
    assert all(ln["reuse_boundary"]["tokens_lost"] == 0 for ln in resumed[1:])  # then it goes on with it
