"""Every shipped recipe and cluster profile loads, validates and follows the naming rule."""

import re
from pathlib import Path

import pytest

from hpcrl.config import list_profiles, list_recipes, load_profile, load_recipe
from hpcrl.config.locate import shipped_recipes_dir

GPU_NAME = re.compile(r"^(grpo|sft)-[a-z0-9.]+(-[a-z0-9.]+)*-(\d+)n(\d+)g-(automodel|megatron)$")
CPU_NAME = re.compile(r"^(grpo|sft)-[a-z0-9.]+(-[a-z0-9.]+)*-(\d+)n-cpu(-megatron)?$")

SHIPPED_RECIPES = sorted(list_recipes())
SHIPPED_PROFILES = sorted(list_profiles(environ={"XDG_CONFIG_HOME": "/nonexistent"}))


def test_the_expected_recipes_ship():
    expected = {
        "grpo-tiny-1n-cpu",
        "grpo-tiny-2n-cpu",
        "grpo-tiny-1n-cpu-megatron",
        "grpo-tiny-vllm-1n-cpu",
        "sft-tiny-1n-cpu",
        "grpo-qwen2-1.5b-2n8g-megatron",
        "grpo-llama3.1-8b-2n8g-automodel",
        "sft-llama3.1-8b-1n8g-megatron",
        "grpo-llama-1b-1n1g-automodel",
        "grpo-llama-1b-1n1g-megatron",
        "grpo-llama3.1-8b-1n1g-automodel",
        "grpo-llama3.1-8b-1n1g-megatron",
    }
    assert expected <= set(SHIPPED_RECIPES)


def test_the_expected_profiles_ship():
    assert {"eos", "local", "slurm-test", "slurm-test-pyxis"} <= set(SHIPPED_PROFILES)


@pytest.mark.parametrize("name", SHIPPED_RECIPES)
def test_shipped_recipe_name_states_algorithm_size_and_backend(name):
    loaded = load_recipe(name)
    recipe = loaded.recipe
    gpu, cpu = GPU_NAME.match(name), CPU_NAME.match(name)
    assert gpu or cpu, (
        f"{name}: use <algo>-<model>-<N>n<G>g-<backend> or <algo>-<model>-<N>n-cpu[-megatron]"
    )
    assert name.split("-")[0] == recipe.algorithm
    if gpu:
        assert (int(gpu.group(3)), int(gpu.group(4))) == (
            recipe.cluster.num_nodes,
            recipe.cluster.gpus_per_node,
        )
        assert gpu.group(5) == recipe.backend
    else:
        assert int(cpu.group(3)) == recipe.cluster.num_nodes
        assert recipe.backend == ("megatron" if cpu.group(4) else "automodel")
        assert recipe.policy.precision == "float32"


@pytest.mark.parametrize("name", SHIPPED_RECIPES)
def test_shipped_recipe_loads_without_warnings_and_absolute_data_paths(name):
    loaded = load_recipe(name)
    assert loaded.warnings == []
    assert loaded.source_path == shipped_recipes_dir() / f"{name}.yaml"
    assert loaded.recipe.data.train_path.startswith(str(shipped_recipes_dir() / "data"))
    assert loaded.resolved_dict["data"]["train_path"] == loaded.recipe.data.train_path
    assert "defaults" not in loaded.resolved_dict


@pytest.mark.parametrize("name", SHIPPED_PROFILES)
def test_shipped_profile_loads(name):
    profile = load_profile(name, environ={"XDG_CONFIG_HOME": "/nonexistent"})
    assert profile.name == name


def test_demo_recipe_is_the_tiny_cpu_grpo_run():
    recipe = load_recipe("grpo-tiny-1n-cpu").recipe
    assert (recipe.algorithm, recipe.backend, recipe.policy.model_name) == (
        "grpo",
        "automodel",
        "tiny:qwen2",
    )
    assert (recipe.cluster.num_nodes, recipe.cluster.gpus_per_node) == (1, 2)
    assert recipe.env.name == "toy_count"
    assert recipe.policy.generation.backend == "torch"


def test_qwen2_megatron_recipe_offloads_half_the_optimizer_and_collects_manually():
    cfg = load_recipe("grpo-qwen2-1.5b-2n8g-megatron").recipe.policy.megatron_cfg
    assert cfg.tensor_model_parallel_size == 2
    assert (cfg.optimizer.optimizer_cpu_offload, cfg.optimizer.optimizer_offload_fraction) == (
        True,
        0.5,
    )
    assert cfg.optimizer.use_distributed_optimizer
    assert (cfg.manual_gc, cfg.manual_gc_interval) == (True, 10)
    assert cfg.env_vars == {"CUDA_DEVICE_MAX_CONNECTIONS": "1"}


def test_eos_profile_passes_secrets_by_name_only():
    profile = load_profile("eos", environ={"XDG_CONFIG_HOME": "/nonexistent"})
    assert profile.pass_env == ("HF_TOKEN", "WANDB_API_KEY")
    assert profile.container is not None and "/lustre:/lustre" in profile.container.mounts
    assert profile.env["HF_HOME"].startswith("/lustre/")


def test_pyxis_test_profile_extends_the_plain_one():
    plain = load_profile("slurm-test", environ={})
    pyxis = load_profile("slurm-test-pyxis", environ={})
    assert pyxis.slurm == plain.slurm
    assert pyxis.container is not None and pyxis.container.image == "hpcrl-test:latest"
    assert plain.container is None


@pytest.mark.parametrize("name", ["grpo-tiny-1n-cpu", "grpo-qwen2-1.5b-2n8g-megatron"])
def test_effective_dict_holds_defaults_and_round_trips(name):
    from hpcrl.config import structure_recipe

    loaded = load_recipe(name)
    effective = loaded.effective_dict()
    assert "pipeline_model_parallel_size" in effective["policy"]["megatron_cfg"]
    assert structure_recipe(effective) == loaded.recipe


@pytest.mark.parametrize("name", SHIPPED_RECIPES)
def test_shipped_recipe_data_files_exist(name):
    data = load_recipe(name).recipe.data
    for path in filter(None, (data.train_path, data.val_path)):
        assert Path(path).is_file(), f"{name}: {path} is not shipped in recipes/data/"
