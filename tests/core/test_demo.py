"""THE demo recipe (recipes/grpo-tiny-1n-cpu.yaml) as shipped: 2 CPU workers, reward rises.

``hpcrl submit recipes/grpo-tiny-1n-cpu.yaml --cluster local --wait`` ends in this same
``run_training`` call; here it runs in-process on a local Ray.
"""

from __future__ import annotations

import pytest

pytest.importorskip("ray")

from hpcrl.core.driver import run_training  # noqa: E402
from tests.core._driver_harness import mean, read_metrics, write_run_dir  # noqa: E402
from tests.core.parallel_harness import ray_cluster  # noqa: E402,F401  (fixture)

# The tiny random model starts near 0.1 (about one character in ten is a digit); 20 steps
# at the recipe's settings reach ≈ 0.9. The margin leaves room for run-to-run noise.
REWARD_MARGIN = 0.3
METRIC_KEYS = {
    "step",
    "loss",
    "grad_norm",
    "lr",
    "reward_mean",
    "reward_std",
    "pg_loss",
    "clip_fraction",
    "time_generate_s",
    "time_logprobs_s",
    "time_train_s",
    "tokens_per_s",
    "peak_host_rss_gb",
    "peak_gpu_mem_gb",
}


@pytest.mark.slow
def test_demo_recipe_reward_rises(ray_cluster, tmp_path, capsys) -> None:  # noqa: F811
    run_dir = write_run_dir(tmp_path / "run", "grpo-tiny-1n-cpu.yaml")
    assert run_training(str(run_dir)) == 0
    metrics = read_metrics(run_dir)
    assert [m["step"] for m in metrics] == list(range(1, 21))
    rewards = [m["reward_mean"] for m in metrics]
    assert mean(rewards[-5:]) >= mean(rewards[:5]) + REWARD_MARGIN, rewards
    assert METRIC_KEYS <= set(metrics[0])
    assert metrics[-1]["peak_host_rss_gb"] > 0.1
    assert metrics[-1]["peak_gpu_mem_gb"] is None  # CPU run
    progress = [line for line in capsys.readouterr().out.splitlines() if line.startswith("step ")]
    assert len(progress) == 20
    assert progress[0].startswith("step 1/20  reward ")
    assert " gen " in progress[0] and " lp " in progress[0] and " train " in progress[0]
