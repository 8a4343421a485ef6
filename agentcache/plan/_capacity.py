"""Tier capacities: ``--l1-tokens``-style lists (tokens, ``32k``, ``1M``, or ``16GB`` given bytes of KV per
token) and the bytes of KV one token takes, from a Hugging Face ``config.json``.

KV bytes per token (standard attention): ``2 (K and V) x num_hidden_layers x num_key_value_heads x head_dim x
dtype bytes``; with multi-head latent attention (DeepSeek's ``kv_lora_rank``): ``num_hidden_layers x
(kv_lora_rank + qk_rope_head_dim) x dtype bytes``, the compressed latent SGLang caches. ``head_dim`` defaults to
``hidden_size / num_attention_heads`` and ``num_key_value_heads`` to ``num_attention_heads`` (the
``transformers`` ``PretrainedConfig`` conventions). GB are 10^9 bytes (as SGLang's ``--hicache-size``).
"""

from __future__ import annotations

import json
import re
from dataclasses import dataclass
from pathlib import Path
from typing import Any

from .._exceptions import ConfigError

__all__ = ["GB", "Ratio", "Size", "kv_bytes_from_config", "parse_sizes", "resolve"]

GB = 1_000_000_000
_DTYPE_BYTES = {"float32": 4, "float": 4, "bfloat16": 2, "float16": 2, "half": 2, "float8_e4m3fn": 1, "fp8": 1}
_SIZE = re.compile(r"^(\d+(?:\.\d+)?)\s*(k|m|gb|g|gib|x|)$", re.IGNORECASE)


@dataclass(frozen=True, slots=True)
class Ratio:
    """A capacity given as a multiple of L1 (``--l2-tokens 2x``: twice the GPU KV pool, as ``serve --l2 2``)."""

    of_l1: float


Size = int | Ratio


def resolve(size: Size, l1: int) -> int:
    """``size`` in tokens for an L1 of ``l1`` tokens."""
    return int(size.of_l1 * l1) if isinstance(size, Ratio) else size


def parse_sizes(text: str | None, flag: str, kv_bytes: int | None, ratio: bool = False) -> list[Size]:
    """The comma-separated capacities of ``flag`` in tokens: ``65536``, ``64k``, ``1M``, ``16GB`` (needs
    ``kv_bytes`` per token) or, when ``ratio``, ``2x`` (a :class:`Ratio` of L1). ``None``/empty is ``[0]`` (no
    tier). Raises ConfigError naming ``flag``."""
    if text is None or not text.strip():
        return [0]
    out: list[Size] = []
    for part in text.split(","):
        item = part.strip().lower()
        if item in ("0", "none", "off"):
            out.append(0)
            continue
        m = _SIZE.match(item)
        if m is None:
            raise ConfigError(f"{flag} {part.strip()!r}: expected tokens (65536, 64k, 1M) or a size (16GB)")
        value, unit = float(m.group(1)), m.group(2)
        if unit == "x":
            if not ratio:
                raise ConfigError(f"{flag} {part.strip()!r}: L1 is given in tokens or GB, not as a ratio")
            out.append(Ratio(value))
        elif unit in ("gb", "g", "gib"):
            if kv_bytes is None:
                raise ConfigError(f"{flag} {part.strip()!r}: a size in GB needs --kv-bytes-per-token or --model-config")
            out.append(int(value * (1 << 30 if unit == "gib" else GB) // kv_bytes))
        else:
            out.append(int(value * {"k": 1024, "m": 1024 * 1024, "": 1}[unit]))
    return out


def kv_bytes_from_config(path: Path, dtype_bytes: int | None = None) -> int:
    """Bytes of KV cache per token for the model described by the ``config.json`` at ``path`` (see the module
    docstring). ``dtype_bytes`` overrides the config's ``torch_dtype`` (e.g. 1 for an FP8 KV cache). Raises
    ConfigError when the file is unreadable or lacks the fields."""
    try:
        cfg: Any = json.loads(Path(path).read_text())
    except (OSError, ValueError) as exc:
        raise ConfigError(f"{path}: cannot read the model config ({exc})") from None
    if isinstance(cfg, dict) and isinstance(cfg.get("text_config"), dict):
        cfg = {**cfg, **cfg["text_config"]}  # multimodal configs nest the language model's
    if not isinstance(cfg, dict):
        raise ConfigError(f"{path}: not a model config object")
    try:
        layers = int(cfg["num_hidden_layers"])
        size = dtype_bytes or _DTYPE_BYTES[str(cfg.get("torch_dtype") or cfg.get("dtype") or "bfloat16")]
        if cfg.get("kv_lora_rank"):
            return layers * (int(cfg["kv_lora_rank"]) + int(cfg.get("qk_rope_head_dim") or 0)) * size
        heads = int(cfg["num_attention_heads"])
        kv_heads = int(cfg.get("num_key_value_heads") or heads)
        head_dim = int(cfg.get("head_dim") or int(cfg["hidden_size"]) // heads)
    except (KeyError, TypeError, ValueError) as exc:
        raise ConfigError(f"{path}: the model config lacks {exc} (layers, heads, head_dim, dtype)") from None
    return 2 * layers * kv_heads * head_dim * size
