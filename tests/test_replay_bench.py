"""``benchmarks/multiturn.py`` end to end on llama.cpp + SmolLM2, with small numbers: three configs (prompt cache
off / on / on + session affinity), each on a fresh ``agentcache serve``, one results table.

Marked ``llama``; skipped without the binary or the model (CI builds both). The sessions are short (a ~150-token
system prompt, two turns) so the three server starts and replays take about a minute on 2 CPUs.
"""

from __future__ import annotations

import json
import os
import subprocess
import sys
from pathlib import Path

import pytest

from agentcache.serve.llama import find_llama_server, smollm2_model_path
from tests import needs

ROOT = Path(__file__).resolve().parent.parent
SYSTEM = (
    "You are the support agent of a small airline. Be polite and brief, never promise refunds, and look up a "
    "reservation only after the customer gives its code and their last name. One personal item and one carry-on "
    "are free; checked bags cost a fee. Basic economy cannot be changed. Cancellations within 24 hours are free. "
    "End every answer with a short question that moves the conversation to the next step."
)


def _data(path: Path) -> Path:
    lines = []
    for s, first in enumerate(["I need to change my flight.", "My bag did not arrive."]):
        messages = [{"role": "system", "content": SYSTEM}, {"role": "user", "content": first}]
        for t in range(2):
            body = {"model": "gpt-4o", "messages": messages, "temperature": 0}
            lines.append(json.dumps({"session": f"s{s}", "api": "openai.chat", "body": body}))
            messages = [*messages, {"role": "assistant", "content": f"(answer {t})"}, {"role": "user", "content": "ok"}]
    path.write_text("\n".join(lines) + "\n")
    return path


@pytest.mark.llama
@pytest.mark.skipif(
    find_llama_server() is None or smollm2_model_path() is None,
    reason=needs.LLAMA,
)
def test_multiturn_benchmark_on_llama_cpp(tmp_path: Path) -> None:
    out, raw = tmp_path / "table.md", tmp_path / "results.json"
    argv = [sys.executable, str(ROOT / "benchmarks" / "multiturn.py"), "--engine", "llama.cpp",
            "--data", str(_data(tmp_path / "sessions.jsonl")), "--sessions", "2", "--concurrency", "2",
            "--max-turns", "2", "--max-tokens", "4", "--ctx-per-session", "2048",
            "--out", str(out), "--json", str(raw)]  # fmt: skip
    env = {**os.environ, "PYTHONPATH": str(ROOT) + os.pathsep + os.environ.get("PYTHONPATH", "")}
    done = subprocess.run(argv, capture_output=True, text=True, timeout=900, env=env, check=False)
    assert done.returncode == 0, done.stderr[-3000:]
    results = {r["label"].split(" @")[0]: r for r in json.loads(raw.read_text())}
    assert list(results) == ["cache-off", "cache-on", "cache-on+affinity"]
    for result in results.values():
        assert result["completed"] == 4 and result["errors"] == 0
        assert result["ttft_s"]["p50"] > 0 and result["total_s"] > 0
    later = {name: [t for t in r["turns"] if t["turn"] > 0] for name, r in results.items()}
    assert all(t["cached_tokens"] == 0 for t in later["cache-off"])
    assert all(t["cached_tokens"] > 0 for t in later["cache-on"] + later["cache-on+affinity"])
    assert results["cache-on+affinity"]["config"]["affinity"] is True
    table = out.read_text()
    assert table.count("\n") == 5 and "cache-on+affinity @2" in table and "TTFT p95" in table
