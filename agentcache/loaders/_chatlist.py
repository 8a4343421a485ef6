"""Plain chat transcripts.

Shape: a JSON list of OpenAI chat messages ``[{"role": ..., "content": ..., ...}, ...]``. One session per
file (named by the file stem) and one ``openai.chat`` request per assistant message ``msgs[i]``:
``{"model": "unknown", "messages": msgs[:i]}``. Message dicts are kept as they are (shared between requests).
"""

from __future__ import annotations

from pathlib import Path
from typing import Any

from agentcache._exceptions import InputError
from agentcache.loaders._common import Loaded, session_id
from agentcache.loaders._record import Record


def load_chat(path: Path, doc: Any) -> Loaded:
    """Records for a parsed message list; a non-message entry raises (the transcript would be wrong)."""
    src = str(path)
    if not isinstance(doc, list):
        raise InputError("chat transcript must be a JSON list of messages", source=src)
    for i, msg in enumerate(doc):
        if not isinstance(msg, dict) or not isinstance(msg.get("role"), str):
            raise InputError("not a chat message (object with a string 'role')", source=src, record=i)
    session = session_id(path)
    records = [
        Record(
            session=session,
            api="openai.chat",
            body={"model": "unknown", "messages": doc[:i]},
            source=src,
            index=n,
        )
        for n, i in enumerate(i for i, msg in enumerate(doc) if msg["role"] == "assistant")
    ]
    return records, []
