"""Exceptions raised by agentcache.

The tree::

    AgentCacheError                 root of everything agentcache raises itself
    ├── ConfigError                 caller mistake: bad settings, unknown provider or model
    ├── InputError                  caller mistake: a recorded file or wire body we cannot read
    │   └── UnknownFormatError      no loader recognises the file
    └── InternalError               agentcache's own bug; the request path fails open on it

Upstream (SDK or HTTP) errors are never wrapped: they reach the caller unchanged.
"""

from __future__ import annotations


class AgentCacheError(Exception):
    """Root of all exceptions agentcache raises itself."""


class ConfigError(AgentCacheError, ValueError):
    """A setting, provider name or model is invalid (the caller's mistake)."""


class InputError(AgentCacheError, ValueError):
    """A recorded file or request body cannot be read.

    ``source`` names the file (or ``"<body>"``) and ``record`` the 0-based record within it,
    when known, so the CLI can print a one-line error that points at the bad input; ``reason`` is the message
    without them.
    """

    def __init__(self, message: str, *, source: str | None = None, record: int | None = None):
        self.source = source
        self.record = record
        self.reason = message
        where = source or ""
        if record is not None:
            where = f"{where} record {record}" if where else f"record {record}"
        super().__init__(f"{where}: {message}" if where else message)


class UnknownFormatError(InputError):
    """No loader recognises the file, and none was named explicitly."""


class InternalError(AgentCacheError, RuntimeError):
    """agentcache's own failure. On the request path this is logged and the request sent as is."""
