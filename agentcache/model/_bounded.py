"""What agentcache keeps of a string a client chooses: a model name, a session id, a routing key.

A client may send such a string of any length (a 4 MiB ``model`` is valid JSON, and so is a ``prompt_cache_key`` of
a megabyte). agentcache keeps one in its own structures (simulator scopes, report counters, rule caches, session
keys, metric lookups) only up to :data:`MAX_NAME_BYTES` of UTF-8: a longer string is kept as its head and a hash of
the whole, so two long names that differ only at their end stay two names. The request itself is never changed.
"""

from __future__ import annotations

from hashlib import blake2b

__all__ = ["MAX_NAME_BYTES", "bounded"]

#: The most bytes (UTF-8) of a client-chosen string agentcache keeps (a known model id is under 64).
MAX_NAME_BYTES = 256


def bounded(text: str, limit: int = MAX_NAME_BYTES) -> str:
    """``text`` when its UTF-8 form is at most ``limit`` bytes, else its head and ``~`` and 16 hex digits of a
    blake2b hash of the whole, ``limit`` bytes in all (a lone surrogate counts as its ``surrogatepass`` bytes)."""
    if len(text) * 4 <= limit:  # at most 4 bytes a character: no need to encode
        return text
    raw = text.encode("utf-8", "surrogatepass")
    if len(raw) <= limit:
        return text
    tag = "~" + blake2b(raw, digest_size=8).hexdigest()
    return raw[: limit - len(tag)].decode("utf-8", "ignore") + tag
