"""The driver takes every planned decision from the run folder's typed ``JobSpec``: device,
training nodes and ranks per node, the Megatron checkpoint dir, the generation split. A folder
without jobspec.json or with a bad one stops ``python -m hpcrl.core.driver`` with the file and
the fix, not a traceback: the job side never plans. No Ray:
everything here happens before the workers start. The GPU check is injected (a function),
so a plan can disagree with what this machine has."""

from __future__ import annotations

import pytest

from hpcrl.config import load_recipe
from hpcrl.core import driver
from hpcrl.plan.planner import plan
from hpcrl.run.jobspec_file import JOBSPEC_FILE, write_jobspec
from tests.core._driver_harness import write_local_plan, write_run_dir
from tests.plan.planning_inputs import (
    isolate_from_user_profiles,
    megatron_recipe,
    plain_slurm_profile,
    pyxis_profile,
)


@pytest.fixture(autouse=True)
def shipped_profiles_only(monkeypatch, tmp_path):
    isolate_from_user_profiles(monkeypatch, tmp_path)


def has_gpu() -> bool:
    return True


def has_no_gpu() -> bool:
    return False


def gpu_plan(tmp_path, **profile_changes):
    return plan(megatron_recipe(num_nodes=2, gpus_per_node=8), pyxis_profile(**profile_changes),
                run_dir=str(tmp_path), recipe_source="grpo-x")  # fmt: skip


def test_a_cpu_plan_runs_on_cpu_where_a_gpu_check_says_otherwise(tmp_path):
    spec = plan(megatron_recipe(num_nodes=1, gpus_per_node=2), plain_slurm_profile(),
                run_dir=str(tmp_path), recipe_source="grpo-x")  # fmt: skip
    assert driver.job_device(spec, cuda_available=has_gpu) == "cpu"
    assert driver.training_layout(spec, cuda_available=has_gpu).device == "cpu"


def test_a_gpu_plan_runs_on_cuda_and_stops_named_where_cuda_is_unusable(tmp_path):
    spec = gpu_plan(tmp_path)
    assert driver.job_device(spec, cuda_available=has_gpu) == "cuda"
    with pytest.raises(driver.PlanMismatch) as caught:
        driver.job_device(spec, cuda_available=has_no_gpu)
    assert str(caught.value).startswith(
        "the plan (profile 'site', device: gpu) runs on GPUs but CUDA is not usable on this node"
    )


def test_the_training_group_and_checkpoint_dir_come_from_the_plan(tmp_path, monkeypatch):
    # The job's own environment would resolve another directory; the plan's wins.
    monkeypatch.setenv("NRL_MEGATRON_CHECKPOINT_DIR", str(tmp_path / "from-the-environment"))
    spec = gpu_plan(tmp_path, env={"NRL_MEGATRON_CHECKPOINT_DIR": "/lustre/ckpt"})
    layout = driver.training_layout(spec, cuda_available=has_gpu)
    assert (layout.num_nodes, layout.workers_per_node, layout.device) == (2, 8, "cuda")
    assert layout.megatron_checkpoint_dir == spec.megatron_checkpoint_dir == "/lustre/ckpt"


def test_separate_generation_on_the_training_node_leaves_training_its_own_slots(tmp_path):
    run_dir = write_run_dir(tmp_path / "run", "grpo-tiny-vllm-1n-cpu.yaml")
    spec = write_local_plan(run_dir)
    assert (spec.slots_per_node, spec.generation.first_node) == (2, 0)
    layout = driver.training_layout(driver.job_plan(run_dir, _recipe(run_dir)), has_gpu)
    assert (layout.num_nodes, layout.workers_per_node, layout.device) == (1, 1, "cpu")


def _recipe(run_dir):
    return load_recipe(run_dir / driver.RESOLVED_RECIPE).recipe


def test_the_driver_command_refuses_a_folder_without_a_plan(tmp_path, capsys):
    run_dir = write_run_dir(tmp_path / "run", "sft-tiny-1n-cpu.yaml")
    (run_dir / JOBSPEC_FILE).unlink()
    assert driver.main([str(run_dir)]) == driver.PLAN_ERROR_EXIT_CODE == 2
    assert capsys.readouterr().err == (
        f"hpcrl: {run_dir / JOBSPEC_FILE} does not exist, so this job has no plan: the run "
        "folder was not written by `hpcrl render`/`hpcrl submit`, or the file was removed. "
        "Fix: submit the recipe again with this hpcrl (hpcrl submit RECIPE --cluster PROFILE)\n"
    )


def test_the_driver_takes_the_written_plan(tmp_path, capsys):
    run_dir = write_run_dir(tmp_path / "run", "sft-tiny-1n-cpu.yaml")
    written = write_local_plan(run_dir, "slurm.max_requeues=5")
    assert driver.job_plan(run_dir, _recipe(run_dir)) == written
    assert written.max_requeues == 5
    assert capsys.readouterr().out == ""


def test_a_plan_for_another_recipe_is_refused(tmp_path):
    run_dir = write_run_dir(tmp_path / "run", "sft-tiny-1n-cpu.yaml")
    other = plan(megatron_recipe(num_nodes=2, gpus_per_node=2), plain_slurm_profile(),
                 run_dir=str(run_dir), recipe_source="grpo-x")  # fmt: skip
    write_jobspec(other)
    with pytest.raises(driver.PlanMismatch, match="plans 4 megatron ranks but recipe.resolved"):
        driver.job_plan(run_dir, _recipe(run_dir))


def test_the_driver_command_names_a_bad_plan_without_a_traceback(tmp_path, capsys):
    run_dir = write_run_dir(tmp_path / "run", "sft-tiny-1n-cpu.yaml")
    (run_dir / JOBSPEC_FILE).write_text("{not json")
    assert driver.main([str(run_dir)]) == driver.PLAN_ERROR_EXIT_CODE == 2
    err = capsys.readouterr().err
    assert err.startswith(f"hpcrl: {run_dir / JOBSPEC_FILE} cannot be read as JSON (")
    assert "Traceback" not in err
