"""``hpcrl resume`` and ``hpcrl rerun`` for real: the local scheduler, the real driver.

The demo recipe with a checkpoint every 2 steps is submitted, cancelled once its first
checkpoint is complete, and resumed in its own folder: the next attempt starts after the
newest checkpoint, ``metrics.jsonl`` ends up holding every step once, in order (the lines of
the steps the cancelled attempt ran past its checkpoint dropped), and each attempt's logs
stay apart. The run is then re-run as a new run with an override.

The run is the demo recipe's own 20 steps at seed 1: resumed exactly, it is that seed's run,
held to the reward docs/algorithms.md documents (tests/core/test_demo.py holds seeds 42 and
2; a run of seed 1 of its own there cost ~40 CPU-s of CI, issue 26).
"""

from __future__ import annotations

import json
import math
import os
import re
from pathlib import Path

import pytest
import yaml

from hpcrl.run.job_record import read_job_record
from tests.shipped_cpu_recipes import DEMO_NUM_STEPS, assert_demo_reaches_the_documented_reward
from tests.submit.jobs_harness import (
    RECIPES,
    hpcrl,
    job_env,
    output_of,
    own_ray_ports_env,
    wait_for,
)

pytestmark = [pytest.mark.slow, pytest.mark.timeout(900)]

RECIPE = str(RECIPES / "grpo-tiny-1n-cpu.yaml")
NUM_STEPS = DEMO_NUM_STEPS  # far more than run before the cancel lands (~1 s a step)
OVERRIDES = [
    "grpo.seed=1",
    f"grpo.max_num_steps={NUM_STEPS}",
    "checkpointing.enabled=true",
    "checkpointing.save_period=2",
]
WAIT_S = 600


def steps_of(path: Path) -> list[int]:
    return [json.loads(line)["step"] for line in path.read_text().splitlines() if line.strip()]


def checkpoint_steps(run: Path) -> list[int]:
    folder = run / "checkpoints"
    names = sorted(folder.iterdir()) if folder.is_dir() else []
    return [int(p.name.split("_")[1]) for p in names if re.fullmatch(r"step_\d+", p.name)]


def assert_every_step_once_and_finite(run: Path, num_steps: int) -> None:
    records = [json.loads(line) for line in (run / "metrics.jsonl").read_text().splitlines()]
    assert [record["step"] for record in records] == list(range(1, num_steps + 1))
    for record in records:
        for key in ("loss", "reward_mean", "grad_norm"):
            assert math.isfinite(record[key]), (key, record)


def test_resume_continues_at_the_checkpoint_and_rerun_starts_a_new_run(tmp_path: Path) -> None:
    env = job_env(**own_ray_ports_env(os.getpid() % 30 + 30))
    run = tmp_path / "runs" / "demo"
    submitted = hpcrl(["submit", RECIPE, "--cluster", "local", "-o", str(run), *OVERRIDES],
                      tmp_path, env)  # fmt: skip
    assert submitted.returncode == 0, output_of(submitted)
    first = read_job_record(run)
    refused = hpcrl(["resume", str(run)], tmp_path, env)  # it is still running
    assert refused.returncode == 1 and f"job {first.job_id} is RUNNING" in refused.stderr
    wait_for(lambda: 2 in checkpoint_steps(run), WAIT_S, "the checkpoint of step 2")
    assert hpcrl(["cancel", str(run)], tmp_path, env).returncode == 0
    ran = steps_of(run / "metrics.jsonl")
    checkpoint = max(checkpoint_steps(run))
    assert ran == list(range(1, len(ran) + 1)) and len(ran) < NUM_STEPS, ran

    resumed = hpcrl(["resume", str(run), "--wait"], tmp_path, env, timeout_s=WAIT_S)
    assert resumed.returncode == 0, output_of(resumed)
    assert (
        f"Resuming runs/demo from its checkpoint of step {checkpoint} "
        f"({run / 'checkpoints' / f'step_{checkpoint:06d}'}) as attempt 2; job "
        f"{first.job_id} had ended CANCELLED" in resumed.stdout
    ), output_of(resumed)
    assert "COMPLETED" in resumed.stdout
    # --wait shows the new attempt's phases, then only its own steps (never the cancelled
    # attempt's last step while Ray starts: issue 26 item 6)
    lines = resumed.stdout.splitlines()
    trained = [int(re.search(r"training step (\d+)/", line)[1]) for line in lines
               if "training step" in line]  # fmt: skip
    assert trained and min(trained) > checkpoint, lines
    first_training = next(i for i, line in enumerate(lines) if "training step" in line)
    assert any("running, starting Ray" in line for line in lines[:first_training]), lines
    # One folder, one line per step: what the first attempt ran past its checkpoint dropped.
    assert_every_step_once_and_finite(run, NUM_STEPS)
    assert_demo_reaches_the_documented_reward(
        [json.loads(line) for line in (run / "metrics.jsonl").read_text().splitlines()]
    )
    record = read_job_record(run)
    assert (record.earlier_job_ids, record.attempt_offset) == ((first.job_id,), 1)
    # Each attempt's logs apart: the node entrypoint's folders and the attempt banners.
    assert sorted(p.name for p in (run / "logs" / "node0").iterdir()) == ["attempt0", "attempt1"]
    second = (run / "logs" / "node0" / "attempt1" / "driver.log").read_text()
    assert f"resumed from {run / 'checkpoints'} at step {checkpoint}" in second
    if len(ran) > checkpoint:  # the steps past the checkpoint ran again, once in metrics.jsonl
        assert "metrics.jsonl: dropped " in second
        assert f" line(s) of steps from {checkpoint + 1} on" in second
    assert "resumed from" not in (run / "logs" / "node0" / "attempt0" / "driver.log").read_text()
    logs = hpcrl(["logs", str(run), "--attempt", "2"], tmp_path, env)
    assert f"===== hpcrl attempt 2 · job {record.job_id} · node 0" in logs.stdout
    assert f"job {first.job_id} ·" not in logs.stdout and "attempt0/" not in logs.stdout
    earlier = hpcrl(["logs", str(run), "--attempt", "1"], tmp_path, env).stdout
    assert f"===== hpcrl attempt 1 · job {first.job_id} · node 0" in earlier
    assert f"{record.job_id}_0_log" not in earlier
    again = hpcrl(["resume", str(run)], tmp_path, env)
    assert again.returncode == 1 and "completed; there is nothing left to resume" in again.stderr

    rerun = hpcrl(["rerun", str(run), "grpo.max_num_steps=1", "--wait"], tmp_path, env,
                  timeout_s=WAIT_S)  # fmt: skip
    assert rerun.returncode == 0, output_of(rerun)
    # (beside the runs: .hpcrl-cache, the compile cache they share)
    (new_run,) = [
        p for p in (tmp_path / "runs").iterdir() if p.name not in ("demo", ".hpcrl-cache")
    ]
    assert new_run.name == "demo-rerun"  # named after the run it came from
    assert_every_step_once_and_finite(new_run, 1)
    resolved, new_resolved = (yaml.safe_load((p / "recipe.resolved.yaml").read_text())
                              for p in (run, new_run))  # fmt: skip
    assert new_resolved["grpo"].pop("max_num_steps") == 1
    assert resolved["grpo"].pop("max_num_steps") == NUM_STEPS
    assert new_resolved == resolved  # the same recipe (its checkpointing included) otherwise
    manifest = json.loads((new_run / "manifest.json").read_text())
    assert (manifest["rerun_of"], manifest["profile_source"]) == (str(run), "local")
    source_sha = json.loads((run / "manifest.json").read_text())["recipe_git_sha"]
    assert manifest["recipe_git_sha"] == source_sha and len(source_sha) == 40
    assert f"# Written by: hpcrl rerun {run} grpo.max_num_steps=1\n" in (
        (new_run / "job.sbatch").read_text()
    )
