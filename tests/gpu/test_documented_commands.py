"""docs/performance.md's "GPU end-to-end" commands are the ones tests/gpu/test_end_to_end.py
runs (checked here, on CPU: the figures beside them were measured with the tests' commands)."""

from __future__ import annotations

import shlex
from pathlib import Path

from tests.gpu import test_end_to_end as e2e
from tests.gpu.harness import user_env

DOC = Path(__file__).resolve().parents[2] / "docs" / "performance.md"


def test_the_documented_gpu_commands_are_the_tests_own_in_their_order() -> None:
    runs, model, cache = Path("RUNS"), Path("HF_DIR"), Path("CACHE")
    run = [
        e2e.megatron_args(runs / "megatron", model, cache / "megatron"),
        e2e.sweep_args(runs / "offload-sweep", model, cache / "megatron"),
        e2e.report_args(runs / "offload-sweep"),
        e2e.automodel_args(runs / "automodel", model),
    ]
    lines = [line.strip() for line in DOC.read_text().splitlines()]
    start = lines.index("export HF_HUB_OFFLINE=1 HPCRL_CACHE=CACHE")
    assert lines[start + 1 : start + 1 + len(run)] == [f"hpcrl {shlex.join(a)}" for a in run]
    env = user_env(cache)
    assert (env["HF_HUB_OFFLINE"], env["HPCRL_CACHE"]) == ("1", "CACHE")
