"""A real CPU run (the shipped tiny GRPO recipe through the driver on a real Ray worker
group) keeps the top keep_top_k checkpoints by checkpointing.metric_name — NeMo RL's GRPO
default val:accuracy, which hpcrl used to look up under a key nothing recorded and so kept
the newest — and a resumed run starts from the newest all the same."""

from __future__ import annotations

import pytest
import yaml

from tests.require import require_module

require_module("ray")

from hpcrl.config.checkpoint_metrics import RECORDED  # noqa: E402
from hpcrl.core.driver import run_training  # noqa: E402
from hpcrl.run.checkpoints import complete_checkpoints  # noqa: E402
from tests.core._driver_harness import (  # noqa: E402
    REPO_ROOT,
    read_metrics,
    write_local_plan,
    write_run_dir,
)


@pytest.mark.slow
def test_kept_checkpoints_are_the_top_k_by_the_metric(ray_cluster, tmp_path) -> None:
    """Validation and a checkpoint every 2 steps, keep_top_k 2 by val:accuracy with
    higher_is_better false: the tiny model's greedy answers get more accurate as it learns,
    so the two least accurate are early checkpoints, not the newest two."""
    overrides = [
        "grpo.max_num_steps=8",
        "grpo.val_period=2",
        "policy.optimizer.kwargs.lr=1.0e-2",
        f"data.val_path={REPO_ROOT / 'recipes' / 'data' / 'toy_count.jsonl'}",
        "grpo.max_val_samples=64",
        "policy.generation.val_temperature=0.0",  # greedy answers (NeMo RL's default: sampled)
        "checkpointing.enabled=true",
        "checkpointing.save_period=2",
        "checkpointing.keep_top_k=2",
        "checkpointing.metric_name=val:accuracy",
        "checkpointing.higher_is_better=false",
    ]
    run_dir = write_run_dir(tmp_path / "run", "grpo-tiny-1n-cpu.yaml", overrides)
    assert run_training(str(run_dir)) == 0
    records = read_metrics(run_dir)
    accuracy = {m["step"]: m["val_reward_mean"] for m in records if "val_reward_mean" in m}
    assert sorted(accuracy) == [2, 4, 6, 8]
    # Every NeMo RL metric name hpcrl accepts for GRPO is in the records it writes.
    for (algorithm, prefix), names in RECORDED.items():
        if algorithm == "grpo":
            steps = [m for m in records if m["step"] in accuracy] if prefix == "val" else records
            assert all(set(names.values()) <= set(m) for m in steps), (prefix, names)
    # NeMo RL's order: lower is better here, ties go to the newer checkpoint.
    best_two = sorted(accuracy, key=lambda step: (-accuracy[step], step), reverse=True)[:2]
    kept = [step for step, _ in complete_checkpoints(run_dir / "checkpoints")]
    assert kept == sorted({*best_two, 8}), accuracy  # the top 2 by the metric, and the newest
    assert sorted(best_two) != [6, 8], accuracy  # not what keeping the newest would keep

    # A resumed run continues from the newest checkpoint, whatever its metric.
    resolved = yaml.safe_load((run_dir / "recipe.resolved.yaml").read_text())
    resolved["grpo"]["max_num_steps"] = 10
    (run_dir / "recipe.resolved.yaml").write_text(yaml.safe_dump(resolved))
    write_local_plan(run_dir)  # the job trains the planned recipe (jobspec.json)
    assert run_training(str(run_dir)) == 0
    assert [m["step"] for m in read_metrics(run_dir)] == list(range(1, 11))
