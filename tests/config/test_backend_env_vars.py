"""NeMo RL's per-backend environment variables, as its example configs set them:
``policy.dtensor_cfg.env_vars`` (hpcrl's ``policy.automodel_cfg.env_vars``) is exported in
job.sbatch for an Automodel job, as ``megatron_cfg.env_vars`` is for a Megatron one;
``policy.generation.vllm_cfg.env_vars`` reaches each vLLM engine's environment and not the
job's (NeMo RL sets them on its vLLM workers only). Where a value cannot take effect (the
other backend's mapping, vLLM's without vLLM, one variable with two values in one process),
the recipe is refused by that key."""

from __future__ import annotations

import pytest

from hpcrl.config import ConfigError, load_profile
from hpcrl.core.generation.engine import engine_spec
from hpcrl.core.generation.vllm_engine import engine_env
from hpcrl.plan.planner import plan
from hpcrl.render.script import render_sbatch
from tests.nemo_rl_snapshots import config_path, load_as_hpcrl

# The values NeMo RL's own recipes set (grpo-qwen3.5-35ba3b-2n8g-automodel-ep16.yaml's
# dtensor_cfg, grpo-nemotron3-super-120BA12B-32n4g-async-1off.yaml's vllm_cfg).
ALLOC = "expandable_segments:True"
DTENSOR_ENV = f"policy.dtensor_cfg.env_vars.PYTORCH_CUDA_ALLOC_CONF={ALLOC}"
VLLM_ENV = "policy.generation.vllm_cfg.env_vars.NRL_REFIT_NUM_BUFFERS='1'"


def load(*overrides: str):
    return load_as_hpcrl(config_path("grpo_math_1B.yaml"), list(overrides))


def planned(recipe):
    return plan(recipe, load_profile("eos"), run_dir="/runs/probe", recipe_source="probe.yaml")


def errors(*overrides: str) -> dict[str, str]:
    with pytest.raises(ConfigError) as caught:
        load(*overrides)
    return {problem.path: problem.message for problem in caught.value.errors}


def test_dtensor_env_vars_are_exported_in_an_automodel_job():
    recipe = load(DTENSOR_ENV).recipe
    assert recipe.policy.automodel_cfg.env_vars == {"PYTORCH_CUDA_ALLOC_CONF": ALLOC}
    spec = planned(recipe)
    assert spec.env_dict()["PYTORCH_CUDA_ALLOC_CONF"] == ALLOC
    assert f"export PYTORCH_CUDA_ALLOC_CONF={ALLOC}\n" in render_sbatch(spec)
    assert "PYTORCH_CUDA_ALLOC_CONF" not in planned(load().recipe).env_dict()


def test_vllm_env_vars_reach_the_engine_and_not_the_job():
    recipe = load(VLLM_ENV).recipe
    assert recipe.policy.generation.vllm_cfg.env_vars == {"NRL_REFIT_NUM_BUFFERS": "1"}
    spec = engine_spec(recipe, "/models/m", "cuda")
    env = engine_env("cuda", True, spec.vllm_cfg.env_vars)
    assert env["NRL_REFIT_NUM_BUFFERS"] == "1"
    # the recipe's value wins over hpcrl's own, as NeMo RL's env_vars win on its workers
    assert (
        engine_env("cpu", True, {"TOKENIZERS_PARALLELISM": "true"})["TOKENIZERS_PARALLELISM"]
        == "true"
    )
    assert "NRL_REFIT_NUM_BUFFERS" not in planned(recipe).env_dict()


def test_env_vars_where_nothing_reads_them_are_refused_by_key():
    found = errors(
        "policy.dtensor_cfg.enabled=false",
        "policy.megatron_cfg.enabled=true",
        "policy.optimizer=null",
        DTENSOR_ENV,
        "policy.generation.backend=torch",
        VLLM_ENV,
    )
    # said in the user's spelling (dtensor_cfg)
    assert (
        "trains with the Megatron backend"
        in found["policy.dtensor_cfg.env_vars.PYTORCH_CUDA_ALLOC_CONF"]
    )
    assert "no vLLM engine" in found["policy.generation.vllm_cfg.env_vars.NRL_REFIT_NUM_BUFFERS"]


def test_colocated_vllm_cannot_hold_two_values_of_one_variable():
    vllm_alloc = "policy.generation.vllm_cfg.env_vars.PYTORCH_CUDA_ALLOC_CONF="
    found = errors(DTENSOR_ENV, vllm_alloc + "expandable_segments:False")
    assert (
        "colocated vLLM runs in the training worker's process"
        in found["policy.generation.vllm_cfg.env_vars.PYTORCH_CUDA_ALLOC_CONF"]
    )
    # the same value in both is one value
    assert load(DTENSOR_ENV, vllm_alloc + ALLOC).recipe.policy.generation.vllm_cfg.env_vars


def test_vllm_env_var_names_are_checked_when_planning():
    recipe = load("policy.generation.vllm_cfg.env_vars.HPCRL_RUN_DIR=/x").recipe
    with pytest.raises(ConfigError) as caught:
        planned(recipe)
    paths = [problem.path for problem in caught.value.errors]
    assert paths == ["policy.generation.vllm_cfg.env_vars.HPCRL_RUN_DIR"]
