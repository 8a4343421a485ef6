"""Nothing outside the wires (``adapters/``) branches on the wire API: every place in ``agentcache/`` that names an
API (an ``Api.<MEMBER>``, or a string literal that is an API's name) is in :data:`ALLOWED` with its count and why.

A new API branch fails here: ask the API's :class:`~agentcache.adapters.Wire` (``wire_for(api)``) instead, and add
the fact to the wires when it is not there yet. Removing one fails too, so the list stays exact.
"""

from __future__ import annotations

import ast
import io
import tokenize
from pathlib import Path

from agentcache.adapters import REPLAY_ENDPOINTS, WIRES

PACKAGE = Path(__file__).resolve().parent.parent / "agentcache"
#: Every format name the wires define (the three APIs and SGLang's native ``/generate``).
NAMES = frozenset(w.api for w in WIRES) | frozenset(e.api for e in REPLAY_ENDPOINTS)
MEMBERS = frozenset({"ANTHROPIC_MESSAGES", "OPENAI_CHAT", "OPENAI_RESPONSES"})

_LOADER = "a loader names the API of the records it reads"
#: path under agentcache/ → (API names in it, why they may be there).
ALLOWED: dict[str, tuple[int, str]] = {
    "model/_types.py": (4, "the Api enum itself, and which provider each API is"),
    "targets/_anthropic.py": (2, "targets/ chooses per provider"),
    "targets/_openai.py": (2, "targets/ chooses per provider"),
    "loaders/_chatlist.py": (1, _LOADER),
    "loaders/_claude_code.py": (1, _LOADER),
    "loaders/_claude_code_bodies.py": (1, _LOADER),
    "loaders/_codex.py": (1, _LOADER),
    "loaders/_opencode.py": (3, _LOADER),
    "loaders/_openhands.py": (1, _LOADER),
    "loaders/_qwen.py": (3, _LOADER),
    "loaders/_record.py": (6, "the record format: the APIs a record may hold"),
    "loaders/_sweagent.py": (2, _LOADER),
    "loaders/_taubench.py": (1, _LOADER),
    "model/_usage_read.py": (4, "usage source labels (CacheUsage.source: the format read), not API branches"),
    "proxy/_keepwarm.py": (1, "keep-warm pings are Anthropic Messages requests (an Anthropic target's feature)"),
    "proxy/_state.py": (1, "an engine upstream's target is resolved as for Chat, the API engines speak"),
    "_audit.py": (1, "an audit of no records resolves its target for Chat (any API would do)"),
    "engine/_render.py": (1, "engine/ renders Chat bodies with the server's template (the engine package's step)"),
    "model/_canonical.py": (5, "marker positions per API: moved into the wires with issue 25 step 2 (one identity)"),
    "model/_equivalence.py": (3, "equivalent spellings per API: moved into the wires with issue 25 step 2"),
}


def api_names(source: str) -> int:
    """How many times ``source`` names an API: ``Api.<MEMBER>`` attribute chains and string literals equal to an
    API name (comments and docstrings mentioning one in prose do not count)."""
    tokens = list(tokenize.generate_tokens(io.StringIO(source).readline))
    n = 0
    for i, tok in enumerate(tokens):
        if tok.type == tokenize.STRING:
            try:
                value = ast.literal_eval(tok.string)
            except (ValueError, SyntaxError):  # an f-string: not a name by itself
                continue
            n += value in NAMES
        elif tok.string == "Api" and i + 2 < len(tokens) and tokens[i + 1].string == ".":
            n += tokens[i + 2].string in MEMBERS
    return n


def test_the_counter_sees_literals_and_enum_members_but_not_prose() -> None:
    code = 'x = api == "openai.chat"\ny = Api.ANTHROPIC_MESSAGES\n# "openai.responses" in a comment\n'
    code += 'def f():\n    """Reads ``anthropic.messages``."""\n    return f"{a}.chat", "openai.chatty"\n'
    assert api_names(code) == 2


def test_no_api_branch_outside_the_wires() -> None:
    found = {}
    for path in sorted(PACKAGE.rglob("*.py")):
        n = api_names(path.read_text())
        if n:
            found[path.relative_to(PACKAGE).as_posix()] = n
    expected = {path: n for path, (n, _) in ALLOWED.items()}
    new = {p: n for p, n in found.items() if n > expected.get(p, 0)}
    assert not new, f"API names outside the wires (ask wire_for(api) instead): {new}"
    stale = {p: (found.get(p, 0), n) for p, n in expected.items() if found.get(p, 0) != n}
    assert not stale, f"allow-list entries to lower or remove (found, allowed): {stale}"


def test_every_wire_name_is_a_wire_or_an_endpoint() -> None:
    assert {"anthropic.messages", "openai.chat", "openai.responses", "sglang.generate"} == NAMES
