"""vLLM engines larger than a node through the real planner: laid over whole nodes as NeMo RL
lays them, shapes that would split a node refused; tensor parallel engines planned, colocated
or on generation nodes of their own (the job starts them across nodes:
hpcrl.core.generation.vllm_nodes, tests/vllm/test_grpo_cross_node.py), pipeline parallelism
across nodes still refused with the reason (hpcrl.plan.engine_nodes)."""

from __future__ import annotations

from hpcrl.plan.engine_nodes import NO_PIPELINE, EngineNodeLayout
from tests.plan.planning_inputs import pyxis_profile
from tests.plan.test_generation_plan import (
    ENGINE_SIZE,
    VLLM,
    colocated,
    error_text,
    generation_checks,
    make_plan,
    separate,
)
from tests.recipe_builder import automodel_recipe

TP = f"{VLLM}.tensor_parallel_size"
PP = f"{VLLM}.pipeline_parallel_size"
FIX = f"  fix: set {ENGINE_SIZE} to one of [1, 2, 4, 8] (one node per engine)"
EXECUTOR = (
    "each through vLLM's multiprocessing executor across nodes (the engine on its first node, "
    "each other node's workers started there), refitted through files in the run folder"
)


def test_a_16_gpu_engine_takes_two_whole_8_gpu_nodes():
    layout = EngineNodeLayout(
        gpus_per_engine=16, gpus_per_node=8, first_node=2, num_nodes=4, colocated=False
    )
    assert (layout.nodes_per_engine, layout.num_engines) == (2, 2)
    assert [list(layout.engine_nodes(k)) for k in range(2)] == [[2, 3], [4, 5]]


def test_colocated_deepseek_v3_shape_is_laid_out_and_planned():
    # NeMo RL's grpo-deepseek-v3-32n8g shape, scaled: tp 32 on 8-GPU nodes, 8 nodes.
    spec = make_plan(colocated(8, 8, tp=32), pyxis_profile())
    assert (spec.world_size, spec.colocated_engine_ranks, spec.generation) == (64, 32, None)
    assert generation_checks(spec) == [
        "colocated: vLLM engines across nodes: 2 engine(s) of 32 GPUs (GPUs shared with "
        "training), each on 4 whole nodes of 8 GPUs (engine 0: nodes 0-3; engine 1: nodes "
        f"4-7); {EXECUTOR}"
    ]


def test_pipeline_parallel_engines_across_nodes_are_refused():
    assert error_text(colocated(4, 8, tp=8, pp=2), pyxis_profile()) == {
        PP: f"error: {PP} = 2: {ENGINE_SIZE} = 16 GPUs span 2 whole nodes each (vLLM engines "
        "across nodes: 2 engine(s) of 16 GPUs (GPUs shared with training), each on 2 whole "
        f"nodes of 8 GPUs (engine 0: nodes 0-1; engine 1: nodes 2-3); {EXECUTOR}); "
        f"{NO_PIPELINE}\n{FIX}"
    }


def test_separate_engines_across_generation_nodes_are_laid_out_and_planned():
    # 4 nodes: 2 train, 2 generate with one 16-GPU engine (tp 16) of their own.
    recipe = separate(automodel_recipe(num_nodes=4, gpus_per_node=8), 2, 8, tp=16)
    spec = make_plan(recipe, pyxis_profile())
    placement = spec.generation
    assert (placement.first_node, placement.num_nodes, placement.num_engines) == (2, 2, 1)
    assert (placement.slots_per_engine, placement.nodes_per_engine) == (16, 2)
    assert generation_checks(spec)[-2:] == [
        "training on nodes 0-1 (8 GPUs each); vLLM generation on nodes 2-3 (8 GPUs each; "
        "1 engine(s) of 16 across 2 nodes each)",
        "separate: vLLM engines across nodes: 1 engine(s) of 16 GPUs (GPUs of their own), "
        f"each on 2 whole nodes of 8 GPUs (engine 0: nodes 2-3); {EXECUTOR}",
    ]


def test_separate_pipeline_parallel_engines_across_nodes_stay_refused():
    recipe = separate(automodel_recipe(num_nodes=4, gpus_per_node=8), 2, 8, tp=8, pp=2)
    assert error_text(recipe, pyxis_profile())[PP] == (
        f"error: {PP} = 2: {ENGINE_SIZE} = 16 GPUs span 2 whole nodes each (vLLM engines "
        "across nodes: 1 engine(s) of 16 GPUs (GPUs of their own), each on 2 whole nodes of 8 "
        f"GPUs (engine 0: nodes 2-3); {EXECUTOR}); {NO_PIPELINE}\n{FIX}"
    )


def test_engines_that_would_split_a_node_are_refused():
    # 12 GPUs on 8-GPU nodes: the second engine would take half of a node.
    assert error_text(colocated(3, 8, tp=12), pyxis_profile())[TP] == (
        f"error: {TP} = 12: {ENGINE_SIZE} = 12 GPUs is more than a node's 8 GPUs and not "
        "a whole multiple of them: an engine across nodes takes whole nodes, and this one "
        f"would split a node between engines\n{FIX}"
    )
    # Whole nodes, but 3 nodes do not hold 2-node engines.
    assert error_text(colocated(3, 8, tp=16), pyxis_profile())[TP] == (
        f"error: {TP} = 16: {ENGINE_SIZE} = 16 GPUs span 2 whole nodes, and the 3 node(s) "
        f"that hold the engines do not split into groups of 2\n{FIX}"
    )
