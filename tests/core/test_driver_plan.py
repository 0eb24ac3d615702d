"""The driver takes every planned decision from the run folder's typed ``JobSpec``: the
recipe, device, training nodes and ranks per node, the Megatron checkpoint dir, the generation
split. A folder without jobspec.json or with a bad one stops ``python -m hpcrl.core.driver``
with the file and the fix, not a traceback: the job side never plans. No Ray: everything here
happens before the workers start. The machine checks (hpcrl.core.machine_checks) take the
CUDA and Transformer Engine probes injected (functions), so a plan can disagree with what
this machine has."""

from __future__ import annotations

import attrs
import pytest

from hpcrl.config import load_recipe
from hpcrl.config.recipe import MegatronOptimizerCfg
from hpcrl.core import driver
from hpcrl.core.machine_checks import machine_problems
from hpcrl.plan.planner import plan
from hpcrl.run.jobspec_file import JOBSPEC_FILE, read_jobspec, write_jobspec
from tests.core._driver_harness import REPO_ROOT, write_local_plan, write_run_dir
from tests.plan.planning_inputs import (
    isolate_from_user_profiles,
    plain_slurm_profile,
    pyxis_profile,
)
from tests.recipe_builder import megatron_recipe


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
    assert driver.job_device(spec) == "cpu" == driver.training_layout(spec).device
    assert machine_problems(spec, cuda_available=has_gpu, transformer_engine=has_gpu) == []


def test_a_gpu_plan_runs_on_cuda_and_stops_named_where_cuda_is_unusable(tmp_path):
    spec = gpu_plan(tmp_path)
    assert driver.job_device(spec) == "cuda"
    assert machine_problems(spec, cuda_available=has_gpu, transformer_engine=has_gpu) == []
    (problem,) = machine_problems(spec, cuda_available=has_no_gpu, transformer_engine=has_gpu)
    assert (problem.path, problem.value) == ("device", "gpu")
    assert problem.one_line().startswith(
        "device = 'gpu': the plan (profile 'site') runs on GPUs but CUDA is not usable on this node"
    )
    assert problem.fix.startswith("run in an image with CUDA-enabled torch on GPU nodes")


def test_settings_the_planned_device_or_this_python_cannot_run_are_named_once(tmp_path):
    """Decided by the planned device, not by what torch finds on the node."""
    offload = MegatronOptimizerCfg(optimizer_cpu_offload=True, optimizer_offload_fraction=0.5)
    recipe = megatron_recipe(num_nodes=1, gpus_per_node=2)
    megatron = attrs.evolve(recipe.policy.megatron_cfg, optimizer=offload, sequence_parallel=True,
                            tensor_model_parallel_size=2)  # fmt: skip
    recipe = attrs.evolve(recipe, policy=attrs.evolve(recipe.policy, megatron_cfg=megatron))
    spec = plan(recipe, plain_slurm_profile(), run_dir=str(tmp_path), recipe_source="grpo-x")
    problems = machine_problems(spec, cuda_available=has_gpu, transformer_engine=has_no_gpu)
    assert [problem.one_line() for problem in problems] == [
        "policy.megatron_cfg.sequence_parallel = True: requires Transformer Engine "
        "(transformer_engine is not importable in this environment); fix: use a container "
        "with Transformer Engine or turn it off",
        "policy.megatron_cfg.optimizer.optimizer_cpu_offload = True: requires CUDA "
        "(megatron-core's HybridDeviceOptimizer splits optimizer state between GPU and host); "
        "fix: turn it off: on CPU the optimizer already lives on the host",
    ]


def test_the_training_group_and_checkpoint_dir_come_from_the_plan(tmp_path, monkeypatch):
    # The job's own environment would resolve another directory; the plan's wins.
    monkeypatch.setenv("NRL_MEGATRON_CHECKPOINT_DIR", str(tmp_path / "from-the-environment"))
    spec = gpu_plan(tmp_path, env={"NRL_MEGATRON_CHECKPOINT_DIR": "/lustre/ckpt"})
    layout = driver.training_layout(spec)
    assert (layout.num_nodes, layout.workers_per_node, layout.device) == (2, 8, "cuda")
    assert layout.megatron_checkpoint_dir == spec.megatron_checkpoint_dir == "/lustre/ckpt"


def test_separate_generation_on_the_training_node_leaves_training_its_own_slots(tmp_path):
    run_dir = write_run_dir(tmp_path / "run", "grpo-tiny-vllm-1n-cpu.yaml")
    spec = write_local_plan(run_dir)
    assert (spec.slots_per_node, spec.generation.first_node) == (2, 0)
    layout = driver.training_layout(read_jobspec(run_dir))
    assert (layout.num_nodes, layout.workers_per_node, layout.device) == (1, 1, "cpu")


def test_the_driver_command_refuses_a_folder_without_a_plan(tmp_path, capsys):
    run_dir = write_run_dir(tmp_path / "run", "sft-tiny-1n-cpu.yaml")
    (run_dir / JOBSPEC_FILE).unlink()
    assert driver.main([str(run_dir)]) == driver.PLAN_ERROR_EXIT_CODE == 2
    assert capsys.readouterr().err == (
        f"hpcrl: {run_dir / JOBSPEC_FILE} does not exist, so this job has no plan: the run "
        "folder was not written by `hpcrl render`/`hpcrl submit`, or the file was removed. "
        "Fix: submit the recipe again with this hpcrl (hpcrl submit RECIPE --cluster PROFILE)\n"
    )


def test_the_driver_takes_the_written_plan_and_its_recipe(tmp_path, capsys):
    run_dir = write_run_dir(tmp_path / "run", "sft-tiny-1n-cpu.yaml")
    written = write_local_plan(run_dir, "slurm.max_requeues=5")
    assert read_jobspec(run_dir) == written
    assert written.max_requeues == 5
    # The recipe the job trains is the one planned, whatever the YAML beside it says now.
    (run_dir / "recipe.resolved.yaml").write_text("not: [a recipe")
    planned = load_recipe(REPO_ROOT / "recipes" / "sft-tiny-1n-cpu.yaml").recipe
    assert read_jobspec(run_dir).recipe == planned
    assert capsys.readouterr().out == ""


def test_the_driver_command_refuses_a_gpu_plan_on_this_cpu_machine(tmp_path, capsys):
    write_jobspec(gpu_plan(tmp_path))
    assert driver.main([str(tmp_path)]) == driver.PLAN_ERROR_EXIT_CODE
    assert capsys.readouterr().err.startswith(
        "hpcrl: device = 'gpu': the plan (profile 'site') runs on GPUs but CUDA is not usable"
    )


def test_the_driver_command_names_a_bad_plan_without_a_traceback(tmp_path, capsys):
    run_dir = write_run_dir(tmp_path / "run", "sft-tiny-1n-cpu.yaml")
    (run_dir / JOBSPEC_FILE).write_text("{not json")
    assert driver.main([str(run_dir)]) == driver.PLAN_ERROR_EXIT_CODE == 2
    err = capsys.readouterr().err
    assert err.startswith(f"hpcrl: {run_dir / JOBSPEC_FILE} cannot be read as JSON (")
    assert "Traceback" not in err


def test_the_machine_needs_are_decided_by_the_plan_and_read_back_from_jobspec_json(tmp_path):
    """The plan records each setting that needs Transformer Engine or CUDA with its value (a
    flag or a name); the job reads the same list back and checks only that."""
    recipe = megatron_recipe(num_nodes=1, gpus_per_node=2, sequence_parallel=True,
                             tensor_model_parallel_size=2, attention_backend="flash")  # fmt: skip
    spec = plan(recipe, plain_slurm_profile(), run_dir=str(tmp_path), recipe_source="grpo-x")
    assert [(need.needs, need.path, need.value) for need in spec.machine_needs] == [
        ("transformer_engine", "policy.megatron_cfg.sequence_parallel", True),
        ("transformer_engine", "policy.megatron_cfg.attention_backend", "flash"),
    ]
    write_jobspec(spec)
    read_back = read_jobspec(tmp_path)
    assert read_back.machine_needs == spec.machine_needs
    problems = machine_problems(read_back, cuda_available=has_gpu, transformer_engine=has_no_gpu)
    assert [(problem.path, problem.value) for problem in problems] == [
        ("policy.megatron_cfg.sequence_parallel", True),
        ("policy.megatron_cfg.attention_backend", "flash"),
    ]
    assert machine_problems(read_back, cuda_available=has_gpu, transformer_engine=has_gpu) == []
    # the preflight holds the node to the plan's list, not to the recipe's sections
    unneeded = attrs.evolve(read_back, machine_needs=())
    assert machine_problems(unneeded, cuda_available=has_gpu, transformer_engine=has_no_gpu) == []
