"""The names of hpcrl's built-in tiny models (``tiny:<name>``), known to both sides.

The job builds each from its spec (``hpcrl.core.models.tiny.TINY_SPECS``, whose keys are
exactly these: tests/plan/test_one_check.py holds them equal); the planner refuses any
other ``tiny:`` name before the queue wait without importing the job side.
"""

from __future__ import annotations

TINY_PREFIX = "tiny:"
TINY_MODEL_NAMES = (
    "qwen2", "llama", "llama-1b", "llama3.1-8b", "llama3.2-3b", "qwen3", "mistral", "qwen2-vllm"
)  # fmt: skip
