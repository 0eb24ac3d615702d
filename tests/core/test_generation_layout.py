"""The runtime's check of separate vLLM engines (``generation_layout``, for runs without a
plan) says exactly what the planner says, engines bigger than a node included. No Ray: the
node size is passed in, as ``wrap_policy`` passes Ray's largest node."""

from __future__ import annotations

import pytest

from hpcrl.config.errors import ConfigError
from hpcrl.core.generation.vllm_workers import generation_layout
from tests.plan.planning_inputs import automodel_recipe, pyxis_profile
from tests.plan.test_generation_plan import RESOURCES, error_text, separate

ENGINE_SIZE = "policy.generation.vllm_cfg.tensor_parallel_size × pipeline_parallel_size"


def runtime_error(recipe, node_gpus: int) -> str:
    with pytest.raises(ConfigError) as caught:
        generation_layout(recipe, "cuda", node_gpus)
    (problem,) = caught.value.problems
    return problem.format()


def planner_error(recipe) -> str:
    return error_text(recipe, pyxis_profile())[f"{RESOURCES}.gpus_per_node"]


def test_an_engine_bigger_than_a_node_names_only_engine_sizes_that_fit():
    recipe = separate(automodel_recipe(num_nodes=1, gpus_per_node=8), 1, 8, tp=16)
    text = runtime_error(recipe, node_gpus=8)
    assert text == (
        f"error: {RESOURCES}.gpus_per_node = 8: 8 GPUs per node do not split into vLLM engines "
        f"of {ENGINE_SIZE} = 16 × 1 = 16 GPUs, and no node can hold one: an engine runs inside "
        "one node and this job's Ray cluster offers 8 GPUs per node\n"
        f"  fix: set {ENGINE_SIZE} to one of [1, 2, 4, 8]"
    )
    assert text == planner_error(recipe).replace("profile 'site'", "this job's Ray cluster")


def test_engines_that_do_not_tile_a_node_get_the_planners_fix():
    recipe = separate(automodel_recipe(num_nodes=1, gpus_per_node=2), 1, 6, tp=4)
    text = runtime_error(recipe, node_gpus=8)
    assert text == (
        f"error: {RESOURCES}.gpus_per_node = 6: 6 GPUs per node do not split into vLLM engines "
        f"of {ENGINE_SIZE} = 4 × 1 = 4 GPUs\n"
        f"  fix: set {RESOURCES}.gpus_per_node to a multiple of 4 (one of [4, 8]) or "
        f"{ENGINE_SIZE} to one of [1, 2, 3, 6]"
    )
    assert text == planner_error(recipe)


def test_engines_that_tile_the_node_are_laid_out():
    recipe = separate(automodel_recipe(num_nodes=2, gpus_per_node=8), 1, 8, tp=2, pp=2)
    layout = generation_layout(recipe, "cuda", node_gpus=8)
    assert (layout.num_nodes, layout.engines_per_node, layout.gpus_per_engine) == (1, 2, 4)
    # CPU engines take one worker slot each.
    layout = generation_layout(separate(automodel_recipe(1, 1), 1, 1, tp=1), "cpu")
    assert (layout.engines_per_node, layout.gpus_per_engine) == (1, 0)
