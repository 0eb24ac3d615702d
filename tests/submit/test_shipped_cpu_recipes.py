"""Every shipped CPU recipe runs through ``hpcrl submit <recipe> --cluster <profile> --wait``
with the real driver (tests/shipped_cpu_recipes.py says which test runs which): here the
ones for the ``local`` profile, a few steps each (and multi-node ones other than the demo on
the Slurm test cluster), and the check that no CPU recipe is left without a submit test
that can run it."""

from __future__ import annotations

import os
from pathlib import Path

import pytest

from hpcrl.config import load_profile, load_recipe
from hpcrl.plan.planner import plan
from tests.shipped_cpu_recipes import (
    PROFILE_OF_ROUTE,
    RECIPES,
    assert_finite_steps,
    cpu_recipes,
    few_steps,
    read_metrics,
    recipes_routed,
    route,
    submit_and_wait,
)
from tests.submit.jobs_harness import job_env, output_of, own_ray_ports_env

NUM_STEPS = 2
SUBMIT_TIMEOUT_S = 600
#: The 2-node demo runs as tests/submit/test_slurm_faults.py's job; others here, if any ship.
FAULTS_TEST_RECIPE = "grpo-tiny-2n-cpu"
OTHER_MULTI_NODE = [name for name in recipes_routed("slurm") if name != FAULTS_TEST_RECIPE]


def test_every_shipped_cpu_recipe_plans_where_its_submit_test_runs_it(tmp_path: Path) -> None:
    routes = {name: route(name) for name in cpu_recipes()}
    # The demo, the Megatron demo and SFT on `local`; 2 nodes on the Slurm test cluster; vLLM
    # in its own environment (a new CPU recipe joins one of these by what it is).
    assert {"grpo-tiny-1n-cpu", "grpo-tiny-1n-cpu-megatron", "sft-tiny-1n-cpu"} <= set(routes)
    assert routes["grpo-tiny-1n-cpu"] == "quickstart"
    assert routes["grpo-tiny-1n-cpu-megatron"] == routes["sft-tiny-1n-cpu"] == "local"
    assert routes.get(FAULTS_TEST_RECIPE) == "slurm"
    assert routes.get("grpo-tiny-vllm-1n-cpu") == "vllm"
    for name, where in routes.items():
        recipe = load_recipe(RECIPES / f"{name}.yaml", few_steps(name, NUM_STEPS, tmp_path))
        profile = load_profile(PROFILE_OF_ROUTE[where], environ={})
        plan(recipe.recipe, profile, run_dir=str(tmp_path / name), recipe_source=name)


@pytest.mark.slow
@pytest.mark.timeout(SUBMIT_TIMEOUT_S + 60)
@pytest.mark.parametrize("name", recipes_routed("local"))
def test_shipped_cpu_recipe_runs_through_hpcrl_submit(name: str, tmp_path: Path) -> None:
    env = job_env(**own_ray_ports_env(os.getpid() % 30))
    run = tmp_path / "run"
    overrides = few_steps(name, NUM_STEPS, tmp_path)
    result = submit_and_wait(name, "local", overrides, run, env, SUBMIT_TIMEOUT_S)
    assert result.returncode == 0, output_of(result)
    assert "COMPLETED" in result.stdout, output_of(result)
    algorithm = load_recipe(RECIPES / f"{name}.yaml").recipe.algorithm
    assert_finite_steps(read_metrics(run), NUM_STEPS, algorithm)


if OTHER_MULTI_NODE:  # defined only when there is one: no empty parametrization to skip

    @pytest.mark.slurm
    @pytest.mark.timeout(SUBMIT_TIMEOUT_S + 60)
    @pytest.mark.parametrize("name", OTHER_MULTI_NODE)
    def test_shipped_multi_node_cpu_recipe_runs_on_the_slurm_test_cluster(name, tmp_path) -> None:
        run = tmp_path / "run"
        overrides = few_steps(name, NUM_STEPS, tmp_path)
        result = submit_and_wait(name, "slurm-test", overrides, run, job_env(), SUBMIT_TIMEOUT_S)
        assert result.returncode == 0 and "COMPLETED" in result.stdout, output_of(result)
        algorithm = load_recipe(RECIPES / f"{name}.yaml").recipe.algorithm
        assert_finite_steps(read_metrics(run), NUM_STEPS, algorithm)
