"""The real training job through the real Slurm path: the demo's GRPO recipe on two nodes.

``hpcrl submit recipes/grpo-tiny-2n-cpu.yaml --cluster slurm-test --wait`` renders the run
folder, submits it through submitit, brings Ray up on n1 and n2, and runs the training core
with one FSDP2 worker per node (gloo across the two nodes' network namespaces).
"""

from __future__ import annotations

import json
from pathlib import Path

import pytest

from hpcrl.submit.job_record import read_job_record
from tests.slurm.harness import wait_sacct_states
from tests.submit.jobs_harness import REPO, TWO_NODE_RECIPE, hpcrl, job_env, output_of

pytestmark = [pytest.mark.slurm, pytest.mark.slow, pytest.mark.timeout(900)]

# The one-node demo's own test asks for +0.3 in 20 steps; across two nodes the same recipe
# takes the same optimizer steps, so the margin is kept but a little looser for noise.
REWARD_MARGIN = 0.25


def test_grpo_on_two_slurm_nodes_learns(tmp_path: Path) -> None:
    run = tmp_path / "run"
    args = ["submit", TWO_NODE_RECIPE, "--cluster", "slurm-test", "-o", str(run), "--wait"]
    result = hpcrl(args, REPO, job_env(), timeout_s=840)
    assert result.returncode == 0, output_of(result)
    wait_sacct_states(read_job_record(run).job_id, ["COMPLETED"])

    steps = [json.loads(line) for line in (run / "metrics.jsonl").read_text().splitlines()]
    assert [row["step"] for row in steps] == list(range(1, len(steps) + 1))
    assert len(steps) >= 10
    rewards = [row["reward_mean"] for row in steps]
    first, last = sum(rewards[:5]) / 5, sum(rewards[-5:]) / 5
    assert last >= first + REWARD_MARGIN, f"reward did not rise: {rewards}"
    # --wait reported the training progress it saw, not just the end
    assert "step" in result.stdout and "COMPLETED" in result.stdout, output_of(result)
