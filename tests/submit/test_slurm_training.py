"""The real training job through the real Slurm path: the demo's GRPO recipe on two nodes
(and any other shipped multi-node CPU recipe: tests/shipped_cpu_recipes.py).

``hpcrl submit recipes/grpo-tiny-2n-cpu.yaml --cluster slurm-test --wait`` renders the run
folder, submits it through submitit, brings Ray up on n1 and n2, and runs the training core
with one FSDP2 worker per node (gloo across the two nodes' network namespaces).
"""

from __future__ import annotations

import json
from pathlib import Path

import pytest

from hpcrl.config import load_recipe
from hpcrl.submit.job_record import read_job_record
from tests.shipped_cpu_recipes import RECIPES, assert_finite_steps, few_steps, recipes_routed
from tests.slurm.harness import wait_sacct_states
from tests.submit.jobs_harness import REPO, TWO_NODE_RECIPE, hpcrl, job_env, output_of

pytestmark = [pytest.mark.slurm, pytest.mark.slow, pytest.mark.timeout(900)]

# The one-node demo's own test asks for +0.3 in 20 steps; across two nodes the same recipe
# takes the same optimizer steps, so the margin is kept but a little looser for noise.
REWARD_MARGIN = 0.25


@pytest.mark.parametrize("name", recipes_routed("slurm"))
def test_multi_node_cpu_recipe_runs_on_two_slurm_nodes(name: str, tmp_path: Path) -> None:
    """Every shipped multi-node CPU recipe (tests/shipped_cpu_recipes.py): the 2-node demo
    its whole run, with the reward rising; any other a few steps, finite metrics."""
    run = tmp_path / "run"
    demo = name == Path(TWO_NODE_RECIPE).stem
    overrides = [] if demo else few_steps(name, 2, tmp_path)
    args = ["submit", str(RECIPES / f"{name}.yaml"), "--cluster", "slurm-test", "-o", str(run),
            "--wait", *overrides]  # fmt: skip
    result = hpcrl(args, REPO, job_env(), timeout_s=840)
    assert result.returncode == 0, output_of(result)
    wait_sacct_states(read_job_record(run).job_id, ["COMPLETED"])

    steps = [json.loads(line) for line in (run / "metrics.jsonl").read_text().splitlines()]
    recipe = load_recipe(RECIPES / f"{name}.yaml", overrides).recipe
    assert_finite_steps(steps, len(steps), recipe.algorithm)
    # --wait reported the training progress it saw, not just the end
    assert "step" in result.stdout and "COMPLETED" in result.stdout, output_of(result)
    if not demo:
        assert len(steps) == 2
        return
    assert len(steps) >= 10
    rewards = [row["reward_mean"] for row in steps]
    first, last = sum(rewards[:5]) / 5, sum(rewards[-5:]) / 5
    assert last >= first + REWARD_MARGIN, f"reward did not rise: {rewards}"
