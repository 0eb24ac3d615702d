"""SFT through the driver on the real Ray worker group: the shipped tiny recipe's loss falls,
and the consolidated Hugging Face folder its job writes at the last step is what
``hpcrl export`` writes (tests/core/test_export.py's checks; they had a 2-step run of the
same recipe of their own, one more start-up of the Ray group; issue 26)."""

from __future__ import annotations

import pytest

from tests.require import require_module

require_module("ray")

from hpcrl.core.driver import run_training  # noqa: E402
from tests.core._driver_harness import REPO_ROOT, mean, read_metrics, write_run_dir  # noqa: E402
from tests.core.test_export import (  # noqa: E402
    SAVE_CONSOLIDATED_AT_STEP_20,
    assert_consolidated_checkpoint_exports,
)


@pytest.mark.slow
def test_sft_loss_falls_on_the_tiny_recipe_and_its_last_checkpoint_exports(
    ray_cluster, tmp_path, capsys, monkeypatch
) -> None:
    val_path = REPO_ROOT / "recipes" / "data" / "sft_tiny.jsonl"
    # Validation on the first 32 of the 200 pairs (4 batches of 8): all 200 three times were
    # 150 forward micro-batches a worker, more than the 20 training steps' 40 (issue 26).
    overrides = [
        f"data.val_path={val_path}", "sft.val_period=10", "sft.val_at_start=true",
        "sft.val_batches=4", "sft.val_global_batch_size=8", *SAVE_CONSOLIDATED_AT_STEP_20,
    ]  # fmt: skip
    run_dir = write_run_dir(tmp_path / "run", "sft-tiny-1n-cpu.yaml", overrides)
    assert run_training(str(run_dir)) == 0
    records = read_metrics(run_dir)
    validations = {m["step"]: m["val_loss"] for m in records if "val_loss" in m}
    assert sorted(validations) == [0, 10, 20]
    assert {m["val_num_examples"] for m in records if "val_loss" in m} == {32}
    assert validations[20] < 0.6 * validations[0]
    metrics = [m for m in records if m["step"] > 0]
    assert [m["step"] for m in metrics] == list(range(1, 21))
    losses = [m["loss"] for m in metrics]
    # random init starts near ln(100) ≈ 4.6 per token; the fixed "A: <n>. Done." pattern is
    # quickly learnt: require the last 5 steps to average under 60% of the first 5
    assert mean(losses[-5:]) < 0.6 * mean(losses[:5]), losses
    assert all(m["num_loss_tokens"] > 0 and m["tokens_per_s"] > 0 for m in metrics)
    monkeypatch.chdir(tmp_path)
    assert_consolidated_checkpoint_exports(run_dir, 20, tmp_path, capsys)
