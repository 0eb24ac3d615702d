"""Rules of the reward-model environment (``env.reward_model``, read when a GRPO run's data
sets name ``env_name: reward_model``): what NeMo RL's RewardModelEnvironment asserts, what
hpcrl's scorer cannot honour, and how its GPUs fit in ``cluster`` (hpcrl.config.node_split).
"""

from __future__ import annotations

from hpcrl.config.datasets import data_env_name
from hpcrl.config.errors import NO_VALUE, Problem
from hpcrl.config.recipe import Recipe, RewardModelEnvCfg

SECTION = "env.reward_model"
EXAMPLE = "NeMo RL's examples/configs/grpo_rm_1B.yaml"


def _section(recipe: Recipe) -> RewardModelEnvCfg | None:
    if recipe.algorithm != "grpo" or data_env_name(recipe) != "reward_model":
        return None
    return recipe.env.reward_model


def rule_reward_model_section(recipe: Recipe) -> list[Problem]:
    """The data sets name the reward model: its section must be there."""
    if recipe.algorithm != "grpo" or data_env_name(recipe) != "reward_model":
        return []
    if recipe.env.reward_model is not None:
        return []
    return [
        Problem(
            path=SECTION,
            value=NO_VALUE,
            message="the data sets are scored by the reward-model environment (env_name: "
            "reward_model), whose model this section names",
            fix=f"add {SECTION} with model_name and resources (as {EXAMPLE})",
        )
    ]


#: (key below env.reward_model, the value NeMo RL asserts, why)
NEMO_RL_ASSERTS = (
    ("reward_model_cfg.enabled", True, "NeMo RL's reward-model environment asserts it"),
    ("dynamic_batching.enabled", False, "NeMo RL does not support it for reward models"),
    ("sequence_packing.enabled", False, "NeMo RL does not support it for reward models"),
    ("dtensor_cfg.enabled", True, "NeMo RL runs reward models on its DTensor policy only"),
    ("dtensor_cfg.cpu_offload", False, "NeMo RL does not support it for reward models"),
    ("dtensor_cfg.activation_checkpointing", False, "the reward model never trains"),
    ("max_grad_norm", None, "the reward model never trains (NeMo RL asserts null)"),
    ("checkpoint_path", None, "hpcrl loads the reward model from model_name's Hugging Face "
     "folder only, not from a training checkpoint"),
)  # fmt: skip

#: parallel sizes of NeMo RL's reward-model policy; hpcrl's scorer holds the whole model
ONE_ONLY = ("dtensor_cfg.tensor_parallel_size", "dtensor_cfg.context_parallel_size")


def _value(section: RewardModelEnvCfg, dotted: str) -> object:
    value: object = section
    for part in dotted.split("."):
        value = getattr(value, part)
    return value


def rule_reward_model_settings(recipe: Recipe) -> list[Problem]:
    section = _section(recipe)
    if section is None:
        return []
    problems = [
        Problem(
            path=f"{SECTION}.{key}",
            value=_value(section, key),
            message=f"must be {_yaml(wanted)}: {why}",
            fix=f"set {SECTION}.{key}={_yaml(wanted)}",
        )
        for key, wanted, why in NEMO_RL_ASSERTS
        if _value(section, key) != wanted
    ]
    problems += [
        Problem(
            path=f"{SECTION}.{key}",
            value=_value(section, key),
            message="hpcrl's reward-model scorer holds the whole model on each of its GPUs "
            "(the conversations are split over them), so it does not shard the model",
            fix=f"set {SECTION}.{key}=1 (the scores are the same)",
        )
        for key in ONE_ONLY
        if _value(section, key) != 1
    ]
    return problems


def rule_reward_model_split(recipe: Recipe) -> list[Problem]:
    """The reward model's GPUs fit in the job as NeMo RL's GRPO setup asserts."""
    section = _section(recipe)
    total, per_node = recipe.cluster.num_nodes, recipe.cluster.gpus_per_node
    if section is None or total < 1 or per_node < 1:
        return []  # rule_positive_counts reports non-positive counts
    resources, path = section.resources, f"{SECTION}.resources"
    if total == 1 and resources.gpus_per_node >= per_node:
        return [
            Problem(
                path=f"{path}.gpus_per_node",
                value=resources.gpus_per_node,
                message=f"on a one-node job the reward model takes this many of the node's "
                f"cluster.gpus_per_node ({per_node}) GPUs, which leaves "
                f"{per_node - resources.gpus_per_node} for the policy",
                fix=f"set {path}.gpus_per_node below {per_node} (e.g. 1), or raise "
                "cluster.gpus_per_node, or cluster.num_nodes for nodes of the reward model's own",
            )
        ]
    if total == 1:
        return []
    problems = []
    if resources.num_nodes >= total:
        problems.append(
            Problem(
                path=f"{path}.num_nodes",
                value=resources.num_nodes,
                message=f"leaves no node for the policy: with cluster.num_nodes={total} the "
                f"reward model takes this many whole nodes of the job",
                fix=f"set {path}.num_nodes below {total}, or raise cluster.num_nodes",
            )
        )
    if resources.gpus_per_node > per_node:
        problems.append(
            Problem(
                path=f"{path}.gpus_per_node",
                value=resources.gpus_per_node,
                message=f"more than a node's cluster.gpus_per_node ({per_node})",
                fix=f"set {path}.gpus_per_node to at most {per_node}",
            )
        )
    return problems


def _yaml(value: object) -> str:
    if value is None:
        return "null"
    return str(value).lower() if isinstance(value, bool) else str(value)


REWARD_MODEL_RULES = (
    rule_reward_model_section,
    rule_reward_model_settings,
    rule_reward_model_split,
)
