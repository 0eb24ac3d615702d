"""benchmarks/train_throughput.py's Megatron rows on the CPU (``--tiny``), each in its own
process as the benchmark runs them: the ``megatron`` row sets its worker up through
``MegatronWorker.setup`` (its model alone replaced), so a step never meets a worker that
setup did not finish (it failed with ``AttributeError: 'MegatronWorker' object has no
attribute 'passes'`` while it set the worker's attributes by hand), and it starts from the
raw megatron-core row's weights: the same first loss."""

from __future__ import annotations

import json
import math
import os
import subprocess
import sys
from pathlib import Path

import pytest

from tests.recipe_builder import REPO_ROOT


def run_row(loop: str, out: Path) -> dict:
    """One Megatron row of the tiny benchmark: 1 warm-up step, then 1 window of 2 steps."""
    command = [
        sys.executable, str(REPO_ROOT / "benchmarks" / "train_throughput.py"), "--only", loop,
        "--megatron-attention", "sdpa", "--tiny", "--device", "cpu", "--warmup", "1",
        "--rounds", "1", "--megatron-steps", "2", "--json-out", str(out),
    ]  # fmt: skip
    env = {**os.environ, "PYTHONPATH": str(REPO_ROOT)}
    done = subprocess.run(
        command, cwd=REPO_ROOT, env=env, capture_output=True, text=True, timeout=300, check=False
    )
    assert done.returncode == 0, done.stderr[-4000:]
    return json.loads(out.read_text())


def test_backend_row_trains_from_the_raw_rows_weights(tmp_path):
    backend = run_row("megatron", tmp_path / "megatron.json")
    raw = run_row("megatron-raw", tmp_path / "megatron-raw.json")
    assert [len(window) for window in backend["windows"]] == [2]
    assert math.isfinite(backend["first_loss"])
    # Same random weights and batch; the losses differ in how bf16 logits are reduced.
    assert backend["first_loss"] == pytest.approx(raw["first_loss"], rel=1e-6)
