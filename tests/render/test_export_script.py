"""The export job's script (``hpcrl export RUN`` on a Slurm run): derived from the run's plan
alone, exact text in golden files (``golden_export/``), parsed by bash and clean under
shellcheck. It keeps the run's account, partition, container, code and environment, drops
what makes a training job (nodes, array, signal, requeue), and mounts the export's folder 1:1
in the container when no mount shows it there.

Regenerate after an intended change: HPCRL_UPDATE_GOLDEN=1 .venv/bin/pytest tests/render -k golden
"""

from __future__ import annotations

import difflib
import os
from pathlib import Path

import pytest

from hpcrl.config import load_profile, load_recipe
from hpcrl.plan.export_job import default_out_dir, plan_export_job
from hpcrl.plan.planner import plan
from hpcrl.render.script import render_export_script
from tests.plan.planning_inputs import GOLDEN_HOST, GOLDEN_RUN_DIR, isolate_from_user_profiles
from tests.render.shell import assert_bash_parses, assert_shellcheck_clean
from tests.require import under_ci

GOLDEN_DIR = Path(__file__).parent / "golden_export"
CHECKPOINT = f"{GOLDEN_RUN_DIR}/checkpoints/step_000040"
PAIRS = [("grpo-llama-1b-1n1g-megatron", "eos"), ("grpo-tiny-2n-cpu", "slurm-test"),
         ("grpo-tiny-2n-cpu", "slurm-test-pyxis")]  # fmt: skip


@pytest.fixture(autouse=True)
def shipped_profiles_only(monkeypatch, tmp_path):
    isolate_from_user_profiles(monkeypatch, tmp_path)


def run_plan(recipe_name: str, profile_name: str):
    return plan(
        load_recipe(recipe_name).recipe, load_profile(profile_name), run_dir=GOLDEN_RUN_DIR,
        recipe_source=recipe_name, profile_source=profile_name, host=GOLDEN_HOST,
    )  # fmt: skip


@pytest.mark.parametrize(("recipe_name", "profile_name"), PAIRS)
def test_golden_export_script(recipe_name, profile_name):
    run = run_plan(recipe_name, profile_name)
    job = plan_export_job(run, 40, CHECKPOINT, default_out_dir(GOLDEN_RUN_DIR, 40))
    text = render_export_script(job)
    path = GOLDEN_DIR / f"{recipe_name}__{profile_name}.sbatch"
    if os.environ.get("HPCRL_UPDATE_GOLDEN") == "1" and not under_ci():
        GOLDEN_DIR.mkdir(exist_ok=True)
        path.write_text(text)
    assert path.exists(), (
        f"no {path.name}: HPCRL_UPDATE_GOLDEN=1 .venv/bin/pytest tests/render -k golden"
    )
    if text != path.read_text():
        diff = "".join(difflib.unified_diff(
            path.read_text().splitlines(keepends=True), text.splitlines(keepends=True),
            fromfile=f"golden_export/{path.name}", tofile="rendered",
        ))  # fmt: skip
        pytest.fail(f"the export script differs from its golden file:\n{diff}")
    assert_bash_parses(text)
    assert_shellcheck_clean(text)


def test_the_export_job_is_one_task_on_one_node_of_the_runs_kind():
    run = run_plan("grpo-tiny-2n-cpu", "slurm-test")
    job = plan_export_job(run, 40, CHECKPOINT, default_out_dir(GOLDEN_RUN_DIR, 40))
    directives = dict(job.sbatch_directives)
    assert (directives["nodes"], directives["ntasks-per-node"]) == ("1", "1")
    assert directives["job-name"] == f"{run.job_name}-export"
    assert directives["partition"] == dict(run.sbatch_directives)["partition"] == "debug"
    assert directives["time"] == dict(run.sbatch_directives)["time"]
    assert not {"signal", "requeue", "array"} & set(directives)
    assert directives["output"] == f"{GOLDEN_RUN_DIR}/exports/submitit/%j_0_log.out"
    # the run's interpreter (and code), the export module, then run, checkpoint and folder
    assert job.export_argv == (
        *run.code.entry_argv, "-u", "-m", "hpcrl.core.export", GOLDEN_RUN_DIR, CHECKPOINT,
        f"{GOLDEN_RUN_DIR}/exports/step_000040",
    )  # fmt: skip
    assert job.task_argv[-1] == f"{GOLDEN_RUN_DIR}/exports/submitit"


def container_mounts(job) -> list[str]:
    (mounts,) = [a for a in job.srun_args if a.startswith("--container-mounts=")]
    return mounts.removeprefix("--container-mounts=").split(",")


def test_a_folder_outside_every_mount_is_mounted_for_the_export_alone():
    run = run_plan("grpo-llama-1b-1n1g-megatron", "eos")  # mounts /lustre and the run folder
    inside = plan_export_job(run, 40, CHECKPOINT, "/lustre/fsw/me/exports/llama")
    outside = plan_export_job(run, 40, CHECKPOINT, "/scratch/me/llama-hf")
    assert container_mounts(inside) == list(run.container.mounts)
    assert container_mounts(outside) == [*run.container.mounts, "/scratch/me:/scratch/me"]
    others = [a for a in outside.srun_args if not a.startswith("--container-mounts=")]
    assert len(others) == len(outside.srun_args) - 1 == len(run.srun_args) - 1
