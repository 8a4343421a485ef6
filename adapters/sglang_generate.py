"""SGLang's native ``POST /generate``: prompt token ids in, a stream of ``text`` / ``output_ids`` chunks with
``meta_info`` out. Not a :class:`~agentcache.adapters.Wire` (token ids have no canonical model): an
:class:`~agentcache.adapters._base.Endpoint` replay sends, the body planned as Chat first.
"""

from __future__ import annotations

from collections.abc import Callable, Mapping
from typing import Any, ClassVar

from ._base import Endpoint

API = "sglang.generate"


class SGLangGenerate(Endpoint):
    """SGLang ``/generate`` (``sampling_params``; usage in ``meta_info``, read as Chat's)."""

    api: ClassVar[str] = API
    route: ClassVar[str] = "/generate"
    replay_name: ClassVar[str | None] = "sglang"
    sends_token_ids: ClassVar[bool] = True

    def replay_body(
        self, body: dict[str, Any], max_tokens: int, *, want_ids: bool, token_ids: Callable[[dict[str, Any]], list[int]]
    ) -> dict[str, Any]:
        """``{"input_ids", "sampling_params": {"max_new_tokens", "temperature"}, "stream": true}`` and the body's
        ``session_id`` when pinned (SGLang's session affinity)."""
        params = {"max_new_tokens": max_tokens, "temperature": body.get("temperature", 0.0)}
        pinned = {"session_id": body["session_id"]} if "session_id" in body else {}
        return {"input_ids": token_ids(body), "sampling_params": params, "stream": True, **pinned}

    def first_output(self, event: Mapping[str, Any]) -> bool:
        """A chunk with ``text`` or ``output_ids``."""
        return bool(event.get("text") or event.get("output_ids"))


ENDPOINT = SGLangGenerate()
