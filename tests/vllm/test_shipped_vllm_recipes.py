"""Every shipped recipe with ``generation.backend: vllm`` that plans on the ``local`` profile
runs its model on this machine's vLLM engine, built the way the driver builds it: greedy
outputs equal the torch sampler's on the same weights (a head_dim-16 model would not even
start: vLLM's CPU attention rejects it); and every shipped vLLM CPU recipe runs through
``hpcrl submit --cluster local --wait`` with the real driver."""

from __future__ import annotations

import os

import attrs
import pytest
import torch

from hpcrl.config import ConfigError, list_recipes, load_profile, load_recipe
from hpcrl.config.locate import shipped_profiles_dir
from hpcrl.core.generation.engine import engine_spec
from hpcrl.core.models.tiny import resolve_model_path
from hpcrl.plan.planner import plan
from hpcrl.run.job_record import read_job_record
from tests.shipped_cpu_recipes import (
    assert_finite_steps,
    few_steps,
    read_metrics,
    recipes_routed,
    submit_and_wait,
)
from tests.slurm.harness import wait_no_job_processes
from tests.submit.jobs_harness import job_env, output_of, own_ray_ports_env
from tests.vllm.harness import encode, responses, torch_sampler_generate

SUBMIT_TIMEOUT_S = 600


def _local_vllm_recipes() -> list[str]:
    profile = load_profile(shipped_profiles_dir() / "local.yaml")
    names = []
    for name in sorted(list_recipes()):
        recipe = load_recipe(name).recipe
        if recipe.algorithm != "grpo" or recipe.policy.generation.backend != "vllm":
            continue
        try:
            plan(recipe, profile, run_dir="/tmp/hpcrl-plan-check", recipe_source=name)
        except ConfigError:
            continue  # a GPU recipe
        names.append(name)
    return names


LOCAL_VLLM_RECIPES = _local_vllm_recipes()


def test_a_vllm_recipe_ships_for_the_local_profile() -> None:
    assert "grpo-tiny-vllm-1n-cpu" in LOCAL_VLLM_RECIPES


@pytest.mark.parametrize("name", LOCAL_VLLM_RECIPES)
def test_shipped_vllm_recipe_model_runs_on_the_engine(name: str, tmp_path) -> None:
    from transformers import AutoModelForCausalLM

    from hpcrl.core.models.tokenizer import load_tokenizer

    recipe = load_recipe(name).recipe
    model_path = resolve_model_path(recipe.policy.model_name, cache_dir=str(tmp_path))
    tokenizer = load_tokenizer(model_path)
    prompts = encode(tokenizer)
    greedy = attrs.evolve(recipe.policy.generation, temperature=0.0)
    engine = engine_spec(recipe, model_path, "cpu").build()
    try:
        out = engine.generate(prompts, greedy, seed=0)
    finally:
        engine.shutdown()
    model = AutoModelForCausalLM.from_pretrained(model_path, dtype=torch.float32).eval()
    expected = torch_sampler_generate(model, tokenizer, prompts, greedy)
    assert responses(out) == responses(expected)


@pytest.mark.slow
@pytest.mark.timeout(SUBMIT_TIMEOUT_S + 60)
@pytest.mark.parametrize("name", recipes_routed("vllm"))
def test_shipped_vllm_cpu_recipe_runs_through_hpcrl_submit(name: str, tmp_path) -> None:
    """The shipped CPU recipes' submit test (tests/shipped_cpu_recipes.py) for the vLLM ones:
    ``hpcrl submit --cluster local --wait`` from this environment, a few steps."""
    env = job_env(**own_ray_ports_env(os.getpid() % 30))
    run = tmp_path / "run"
    result = submit_and_wait(
        name, "local", few_steps(name, 2, tmp_path), run, env, SUBMIT_TIMEOUT_S
    )
    assert result.returncode == 0, output_of(result)
    assert "COMPLETED" in result.stdout, output_of(result)
    records = read_metrics(run)
    assert_finite_steps(records, 2, "grpo")
    assert all(record["engine_generated_tokens"] > 0 for record in records)  # vLLM sampled
    # No Ray worker, driver or vLLM engine process (EngineCore and its workers inherit the
    # local job's id from the task) outlives the job.
    wait_no_job_processes(read_job_record(run).job_id, variable="SUBMITIT_LOCAL_JOB_ID")
