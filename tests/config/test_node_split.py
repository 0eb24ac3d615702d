"""cluster.num_nodes is the whole job and non-colocated generation is carved out of it, as in
NeMo RL's GRPO setup: the rule's refusals (each one NeMo RL asserts), the split itself, and
NeMo RL's own 2n8g non-colocated recipe planned on eos (2 nodes, training DP 8; hpcrl used
to allocate 3 nodes and train DP 16)."""

from __future__ import annotations

import pytest

from hpcrl.config import load_profile
from hpcrl.config.node_split import NodeSplit, node_split
from hpcrl.plan.planner import plan
from hpcrl.render.script import render_sbatch
from tests.nemo_rl_snapshots import config_path, load_as_hpcrl
from tests.plan.planning_inputs import isolate_from_user_profiles
from tests.recipe_builder import base_dict, problems_for, with_keys

R = "policy.generation.colocated.resources"


def split_problems(num_nodes, gpus_per_node, gen_nodes, gen_gpus, backend="vllm"):
    return problems_for(
        cluster={"num_nodes": num_nodes, "gpus_per_node": gpus_per_node},
        policy__generation={
            "backend": backend,
            "colocated": {
                "enabled": False,
                "resources": {"num_nodes": gen_nodes, "gpus_per_node": gen_gpus},
            },
        },
    )


def formatted(problems) -> dict[str, str]:
    return {problem.path: problem.format() for problem in problems if problem.is_error}


def split_of(num_nodes, gpus_per_node, gen_nodes, gen_gpus, algorithm="grpo") -> NodeSplit:
    from hpcrl.config import structure_recipe

    data = with_keys(
        base_dict("automodel", algorithm),
        cluster={"num_nodes": num_nodes, "gpus_per_node": gpus_per_node},
        policy__generation={
            "backend": "vllm",
            "colocated": {
                "enabled": False,
                "resources": {"num_nodes": gen_nodes, "gpus_per_node": gen_gpus},
            },
        },
    )
    return node_split(structure_recipe(data))


def test_the_split_as_nemo_rl_makes_it():
    assert split_of(1, 8, None, 2) == NodeSplit(
        num_nodes=1,
        gpus_per_node=8,
        training_nodes=1,
        training_gpus_per_node=6,
        generation_nodes=1,
        generation_gpus_per_node=2,
        first_generation_node=0,
    )
    assert split_of(4, 8, 1, 8) == NodeSplit(
        num_nodes=4,
        gpus_per_node=8,
        training_nodes=3,
        training_gpus_per_node=8,
        generation_nodes=1,
        generation_gpus_per_node=8,
        first_generation_node=3,
    )
    # SFT never generates: its resources are not read, the whole job trains.
    assert split_of(2, 8, 1, 8, algorithm="sft").training_world_size == 16


def test_a_valid_split_has_no_problems():
    assert split_problems(1, 8, None, 4) == []
    assert split_problems(1, 8, 1, 4) == []
    assert split_problems(3, 8, 2, 8) == []


def test_one_node_refusals():
    problems = formatted(split_problems(1, 8, 2, 8))
    assert problems == {
        f"{R}.num_nodes": f"error: {R}.num_nodes = 2: must be 1 or null while "
        "cluster.num_nodes is 1: cluster.num_nodes counts every node of the job, generation's "
        "included, so training and generation share the one node\n"
        f"  fix: set {R}.num_nodes=null, or cluster.num_nodes=3 for 2 generation node(s) and "
        "one training node",
        f"{R}.gpus_per_node": f"error: {R}.gpus_per_node = 8: leaves no GPUs for training on "
        "the one node: cluster.gpus_per_node (8, the whole node) - 8 = 0\n"
        f"  fix: set {R}.gpus_per_node below 8 (e.g. 4), or raise cluster.gpus_per_node, or "
        "cluster.num_nodes for nodes of generation's own",
    }
    assert formatted(split_problems(1, 8, None, None)) == {
        f"{R}.gpus_per_node": f"error: {R}.gpus_per_node: on one node generation takes this "
        "many of its cluster.gpus_per_node (8) GPUs and training the rest; it must be at "
        "least 1\n"
        f"  fix: set {R}.gpus_per_node to part of 8, e.g. 4, or "
        "policy.generation.colocated.enabled=true"
    }


def test_whole_node_refusals():
    assert formatted(split_problems(2, 8, 2, 4)) == {
        f"{R}.num_nodes": f"error: {R}.num_nodes = 2: leaves no node for training: "
        "cluster.num_nodes (2) counts every node of the job, generation's included, and "
        "2 - 2 = 0\n"
        f"  fix: set cluster.num_nodes=3 or more (training on the nodes beyond generation's), "
        f"or lower {R}.num_nodes",
        f"{R}.gpus_per_node": f"error: {R}.gpus_per_node = 4: with cluster.num_nodes=2 "
        "generation takes whole nodes, so it must equal cluster.gpus_per_node (8)\n"
        f"  fix: set {R}.gpus_per_node=8",
    }
    assert formatted(split_problems(2, 8, None, 8)) == {
        f"{R}.num_nodes": f"error: {R}.num_nodes: with cluster.num_nodes=2 generation takes "
        "whole nodes of the job; it needs at least 1\n"
        f"  fix: set {R}.num_nodes (e.g. 1: training on 1 node(s))"
    }


def test_the_torch_engine_cannot_have_workers_of_its_own():
    assert formatted(split_problems(1, 8, None, 4, backend="torch")) == {
        "policy.generation.colocated.enabled": "error: policy.generation.colocated.enabled = "
        "False: policy.generation.backend torch samples inside the training workers; "
        "generation workers of their own need the vLLM or megatron backend\n"
        "  fix: set policy.generation.backend=vllm (or megatron with the Megatron policy), or "
        "policy.generation.colocated.enabled=true"
    }


@pytest.fixture
def eos(monkeypatch, tmp_path):
    isolate_from_user_profiles(monkeypatch, tmp_path)
    return load_profile("eos")


def test_nemo_rl_2n8g_non_colocated_recipe_on_eos(eos):
    path = config_path("recipes/llm/grpo-llama3.1-8b-instruct-2n8g-fsdp2tp1-noncolocated.yaml")
    recipe = load_as_hpcrl(path).recipe
    spec = plan(recipe, eos, run_dir="/runs/nemo-rl", recipe_source=str(path))
    assert (spec.num_nodes, spec.slots_per_node, spec.world_size, spec.layout.dp) == (2, 8, 8, 8)
    assert (spec.generation.first_node, spec.generation.num_nodes) == (1, 1)
    script = render_sbatch(spec)
    assert "#SBATCH --nodes=2\n" in script
    assert (
        "# Split: training on node 0 (8 GPUs each); vLLM generation on node 1 "
        "(8 GPUs each; 8 engine(s) of 1).\n" in script
    )
    assert "global batch 512 = dp 8 × micro 1 × 64 accumulation step(s)" in [
        check.message for check in spec.checks
    ]


def test_nemo_rl_one_node_split_on_eos(eos):
    # grpo_math_1B writes resources.num_nodes: null; split its node 4 + 4.
    path = config_path("grpo_math_1B.yaml")
    overrides = [
        "policy.generation.colocated.enabled=false",
        f"{R}.gpus_per_node=4",
        "cluster.gpus_per_node=8",
    ]
    recipe = load_as_hpcrl(path, overrides).recipe
    spec = plan(recipe, eos, run_dir="/runs/nemo-rl", recipe_source=str(path))
    assert (spec.num_nodes, spec.slots_per_node, spec.world_size) == (1, 8, 4)
    assert (spec.generation.first_node, spec.generation.training_slots_per_node) == (0, 4)
    assert (
        "# Split: training on node 0 (4 GPUs each); vLLM generation on node 0 "
        "(the other 4 GPUs each; 4 engine(s) of 1).\n" in render_sbatch(spec)
    )


RM = "env.reward_model"


def reward_model_recipe(num_nodes, gpus_per_node, rm_nodes, rm_gpus, **more):
    """GRPO scored by the reward model (env.name; data sets' env_name reads the same)."""
    from hpcrl.config import structure_recipe

    data = with_keys(
        base_dict("automodel"),
        cluster={"num_nodes": num_nodes, "gpus_per_node": gpus_per_node},
        env={
            "name": "reward_model",
            "reward_model": {
                "model_name": "Skywork/Skywork-Reward-V2-Qwen3-0.6B",
                "resources": {"num_nodes": rm_nodes, "gpus_per_node": rm_gpus},
            },
        },
        **more,
    )
    return data, structure_recipe


def test_the_reward_model_is_carved_out_as_nemo_rl_carves_it():
    data, structure = reward_model_recipe(1, 8, 1, 2)
    assert node_split(structure(data)) == NodeSplit(
        num_nodes=1, gpus_per_node=8, training_nodes=1, training_gpus_per_node=6,
        reward_model_nodes=1, reward_model_gpus_per_node=2, first_reward_model_node=0,
    )  # fmt: skip
    data, structure = reward_model_recipe(4, 8, 1, 4)
    assert node_split(structure(data)) == NodeSplit(
        num_nodes=4, gpus_per_node=8, training_nodes=3, training_gpus_per_node=8,
        reward_model_nodes=1, reward_model_gpus_per_node=4, first_reward_model_node=3,
    )  # fmt: skip
    # non-colocated generation shares the policy's one node; the reward model has its own
    data, structure = reward_model_recipe(
        2, 8, 1, 8,
        policy__generation={
            "backend": "vllm",
            "colocated": {"enabled": False, "resources": {"num_nodes": None, "gpus_per_node": 2}},
        },
    )  # fmt: skip
    split = node_split(structure(data))
    assert (split.training_nodes, split.training_gpus_per_node) == (1, 6)
    assert (split.first_generation_node, split.generation_gpus_per_node) == (0, 2)
    assert (split.first_reward_model_node, split.reward_model_nodes) == (1, 1)


def rm_problems(num_nodes, gpus_per_node, rm_nodes, rm_gpus, **reward_model):
    data, _ = reward_model_recipe(num_nodes, gpus_per_node, rm_nodes, rm_gpus)
    data["env"]["reward_model"].update(reward_model)
    return formatted(problems_for(**{key: data[key] for key in ("cluster", "env")}))


def test_reward_model_refusals_name_path_value_reason_and_fix():
    assert rm_problems(1, 8, 1, 7) == {}
    assert rm_problems(1, 8, 1, 8) == {
        f"{RM}.resources.gpus_per_node": f"error: {RM}.resources.gpus_per_node = 8: on a "
        "one-node job the reward model takes this many of the node's cluster.gpus_per_node (8) "
        "GPUs, which leaves 0 for the policy\n"
        f"  fix: set {RM}.resources.gpus_per_node below 8 (e.g. 1), or raise "
        "cluster.gpus_per_node, or cluster.num_nodes for nodes of the reward model's own"
    }
    assert set(rm_problems(2, 8, 2, 9)) == {
        f"{RM}.resources.num_nodes",
        f"{RM}.resources.gpus_per_node",
    }
    refused = rm_problems(
        1, 8, 1, 1,
        checkpoint_path="/ckpt",
        dtensor_cfg={"enabled": True, "tensor_parallel_size": 2},
        reward_model_cfg={"enabled": False},
    )  # fmt: skip
    assert refused == {
        f"{RM}.reward_model_cfg.enabled": f"error: {RM}.reward_model_cfg.enabled = False: must "
        "be true: NeMo RL's reward-model environment asserts it\n"
        f"  fix: set {RM}.reward_model_cfg.enabled=true",
        f"{RM}.checkpoint_path": f"error: {RM}.checkpoint_path = '/ckpt': must be null: hpcrl "
        "loads the reward model from model_name's Hugging Face folder only, not from a "
        "training checkpoint\n"
        f"  fix: set {RM}.checkpoint_path=null",
        f"{RM}.dtensor_cfg.tensor_parallel_size": f"error: {RM}.dtensor_cfg.tensor_parallel_size"
        " = 2: hpcrl's reward-model scorer holds the whole model on each of its GPUs (the "
        "conversations are split over them), so it does not shard the model\n"
        f"  fix: set {RM}.dtensor_cfg.tensor_parallel_size=1 (the scores are the same)",
    }


def test_data_sets_scored_by_the_reward_model_need_its_section():
    problems = problems_for(env={"name": "reward_model"})
    assert formatted(problems) == {
        RM: f"error: {RM}: the data sets are scored by the reward-model environment "
        "(env_name: reward_model), whose model this section names\n"
        f"  fix: add {RM} with model_name and resources (as NeMo RL's "
        "examples/configs/grpo_rm_1B.yaml)"
    }


@pytest.mark.parametrize("release", ["v0.5.0", "main-7ea279a"])  # data.env_name / data.default
def test_nemo_rl_grpo_rm_1B_on_eos_gives_the_reward_model_one_of_two_gpus(eos, release):
    path = config_path("grpo_rm_1B.yaml", release)
    recipe = load_as_hpcrl(path).recipe
    spec = plan(recipe, eos, run_dir="/runs/nemo-rl", recipe_source=str(path))
    assert (spec.num_nodes, spec.slots_per_node, spec.world_size) == (1, 2, 1)
    assert (spec.reward_model.first_node, spec.reward_model.num_scorers) == (0, 1)
    assert recipe.env.reward_model.model_name == "Skywork/Skywork-Reward-V2-Qwen3-0.6B"
    assert (recipe.env.reward_model.batch_size, recipe.env.reward_model.max_model_len) == (4, 2048)
    assert (
        "# Environment: reward model: 1 GPU on node 0 (one scorer per GPU, the whole model on "
        "each; the conversations split evenly over them).\n" in render_sbatch(spec)
    )
