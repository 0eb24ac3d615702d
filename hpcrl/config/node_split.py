"""How ``cluster.num_nodes`` splits between training and generation workers of their own,
as NeMo RL's GRPO setup splits it (``nemo_rl/algorithms/grpo.py``, setup()).

``cluster`` is the whole job: ``num_nodes`` nodes of ``gpus_per_node`` GPUs (CPU worker
slots on CPU profiles). Colocated generation shares every training rank. With
``policy.generation.colocated.enabled: false`` generation is carved out of that job:

- one node (``cluster.num_nodes: 1``): generation takes
  ``colocated.resources.gpus_per_node`` GPUs of it and training the other
  ``cluster.gpus_per_node - resources.gpus_per_node``; ``resources.num_nodes`` is 1 or null;
- several nodes: generation takes ``resources.num_nodes`` whole nodes (its ``gpus_per_node``
  equals ``cluster.gpus_per_node``), the last ones, and training the nodes before them.

A reward-model environment (data sets with ``env_name: reward_model``) is carved out first,
as NeMo RL carves it: on a one-node job it takes ``env.reward_model.resources.gpus_per_node``
GPUs of the node; on more nodes ``resources.num_nodes`` whole nodes, the last ones. The
split above then applies to the policy's part (its nodes and GPUs per node).

So a NeMo RL config's ``cluster.num_nodes`` is what the job allocates; nothing is added on
top. The rule here refuses what NeMo RL's setup asserts against, with the key to change.
"""

from __future__ import annotations

import attrs

from hpcrl.config.datasets import data_env_name
from hpcrl.config.errors import NO_VALUE, Problem
from hpcrl.config.recipe import Recipe, RewardModelResourcesCfg
from hpcrl.config.shared_methods import SharedMethods

COLOCATED = "policy.generation.colocated"
RESOURCES = f"{COLOCATED}.resources"


@attrs.frozen(kw_only=True)
class NodeSplit(SharedMethods):
    """The job's nodes by role. ``generation_nodes`` is 0 when generation is colocated (it
    runs inside the training ranks); ``first_generation_node`` is 0 when generation shares
    the one node with training."""

    num_nodes: int
    gpus_per_node: int
    training_nodes: int
    training_gpus_per_node: int
    generation_nodes: int = 0
    generation_gpus_per_node: int = 0
    first_generation_node: int = 0
    # the reward-model environment's scorers (0 nodes: none); first node 0: it shares the
    # one node of the job
    reward_model_nodes: int = 0
    reward_model_gpus_per_node: int = 0
    first_reward_model_node: int = 0

    @property
    def training_world_size(self) -> int:
        return self.training_nodes * self.training_gpus_per_node

    @property
    def separate(self) -> bool:
        return self.generation_nodes > 0


def has_separate_generation(recipe: Recipe) -> bool:
    """GRPO whose generation has workers of its own (SFT never generates)."""
    return recipe.algorithm == "grpo" and not recipe.policy.generation.colocated.enabled


def reward_model_resources(recipe: Recipe) -> RewardModelResourcesCfg | None:
    """``env.reward_model.resources`` when a GRPO run's data sets are scored by the reward
    model (``hpcrl.config.reward_model_rules`` requires the section then)."""
    if recipe.algorithm != "grpo" or data_env_name(recipe) != "reward_model":
        return None
    section = recipe.env.reward_model
    return None if section is None else section.resources


@attrs.frozen(kw_only=True)
class _PolicyPart(SharedMethods):
    """What the reward model leaves to the policy (training and generation)."""

    nodes: int
    gpus_per_node: int
    reward_model_nodes: int = 0
    reward_model_gpus_per_node: int = 0


def _policy_part(recipe: Recipe) -> _PolicyPart:
    total, per_node = recipe.cluster.num_nodes, recipe.cluster.gpus_per_node
    resources = reward_model_resources(recipe)
    if resources is None:
        return _PolicyPart(nodes=total, gpus_per_node=per_node)
    if total == 1:
        return _PolicyPart(
            nodes=1,
            gpus_per_node=per_node - resources.gpus_per_node,
            reward_model_nodes=1,
            reward_model_gpus_per_node=resources.gpus_per_node,
        )
    return _PolicyPart(
        nodes=total - resources.num_nodes,
        gpus_per_node=per_node,
        reward_model_nodes=resources.num_nodes,
        reward_model_gpus_per_node=resources.gpus_per_node,
    )


def node_split(recipe: Recipe) -> NodeSplit:
    """The split of a recipe that ``rule_node_split`` accepts."""
    part = _policy_part(recipe)
    roles = NodeSplit(
        num_nodes=recipe.cluster.num_nodes,
        gpus_per_node=recipe.cluster.gpus_per_node,
        training_nodes=part.nodes,
        training_gpus_per_node=part.gpus_per_node,
        reward_model_nodes=part.reward_model_nodes,
        reward_model_gpus_per_node=part.reward_model_gpus_per_node,
        first_reward_model_node=(
            part.nodes if part.reward_model_nodes and recipe.cluster.num_nodes > 1 else 0
        ),
    )
    if not has_separate_generation(recipe):
        return roles
    resources = recipe.policy.generation.colocated.resources
    generation_per_node = resources.gpus_per_node
    assert generation_per_node is not None, "rule_node_split requires it"
    if part.nodes == 1:
        return attrs.evolve(
            roles,
            training_gpus_per_node=part.gpus_per_node - generation_per_node,
            generation_nodes=1,
            generation_gpus_per_node=generation_per_node,
        )
    generation_nodes = resources.num_nodes
    assert generation_nodes is not None, "rule_node_split requires it"
    return attrs.evolve(
        roles,
        training_nodes=part.nodes - generation_nodes,
        generation_nodes=generation_nodes,
        generation_gpus_per_node=generation_per_node,
        first_generation_node=part.nodes - generation_nodes,
    )


def rule_node_split(recipe: Recipe) -> list[Problem]:
    """What NeMo RL's setup asserts about a non-colocated split, as problems."""
    if not has_separate_generation(recipe):
        return []
    if recipe.policy.generation.backend == "torch":
        # hpcrl's own backend name for sampling inside the training ranks; NeMo RL's
        # megatron backend on workers of their own is served by the same sampler there.
        return [
            Problem(
                path=f"{COLOCATED}.enabled",
                value=False,
                message="policy.generation.backend torch samples inside the training "
                "workers; generation workers of their own need the vLLM or megatron backend",
                fix=f"set policy.generation.backend=vllm (or megatron with the Megatron "
                f"policy), or {COLOCATED}.enabled=true",
            )
        ]
    part = _policy_part(recipe)
    if part.nodes < 1 or part.gpus_per_node < 1:
        return []  # rule_positive_counts (or rule_reward_model_split) reports them
    if part.nodes == 1:
        return _one_node_problems(recipe, part.gpus_per_node)
    return _whole_node_problems(recipe, part.nodes, part.gpus_per_node)


def _one_node_problems(recipe: Recipe, per_node: int) -> list[Problem]:
    resources = recipe.policy.generation.colocated.resources
    problems = []
    if resources.num_nodes not in (None, 1):
        problems.append(
            Problem(
                path=f"{RESOURCES}.num_nodes",
                value=resources.num_nodes,
                message="must be 1 or null while cluster.num_nodes is 1: cluster.num_nodes "
                "counts every node of the job, generation's included, so training and "
                "generation share the one node",
                fix=f"set {RESOURCES}.num_nodes=null, or cluster.num_nodes="
                f"{resources.num_nodes + 1} for {resources.num_nodes} generation node(s) and "
                "one training node",
            )
        )
    generation = resources.gpus_per_node
    half = max(1, per_node // 2)
    if generation is None or generation < 1:
        problems.append(
            Problem(
                path=f"{RESOURCES}.gpus_per_node",
                value=_given(generation),
                message="on one node generation takes this many of its cluster.gpus_per_node "
                f"({per_node}) GPUs and training the rest; it must be at least 1",
                fix=f"set {RESOURCES}.gpus_per_node to part of {per_node}, e.g. {half}, or "
                f"{COLOCATED}.enabled=true",
            )
        )
    elif generation >= per_node:
        problems.append(
            Problem(
                path=f"{RESOURCES}.gpus_per_node",
                value=generation,
                message=f"leaves no GPUs for training on the one node: cluster.gpus_per_node "
                f"({per_node}, the whole node) - {generation} = {per_node - generation}",
                fix=f"set {RESOURCES}.gpus_per_node below {per_node} (e.g. {half}), or raise "
                "cluster.gpus_per_node, or cluster.num_nodes for nodes of generation's own",
            )
        )
    return problems


def _whole_node_problems(recipe: Recipe, total: int, per_node: int) -> list[Problem]:
    resources = recipe.policy.generation.colocated.resources
    problems = []
    generation_nodes = resources.num_nodes
    if generation_nodes is None or generation_nodes < 1:
        problems.append(
            Problem(
                path=f"{RESOURCES}.num_nodes",
                value=_given(generation_nodes),
                message=f"with cluster.num_nodes={total} generation takes whole nodes of the "
                "job; it needs at least 1",
                fix=f"set {RESOURCES}.num_nodes (e.g. 1: training on {total - 1} node(s))",
            )
        )
    elif generation_nodes >= total:
        problems.append(
            Problem(
                path=f"{RESOURCES}.num_nodes",
                value=generation_nodes,
                message=f"leaves no node for training: cluster.num_nodes ({total}) counts every "
                f"node of the job, generation's included, and {total} - {generation_nodes} = "
                f"{total - generation_nodes}",
                fix=f"set cluster.num_nodes={generation_nodes + 1} or more (training on the "
                f"nodes beyond generation's), or lower {RESOURCES}.num_nodes",
            )
        )
    if resources.gpus_per_node != per_node:
        problems.append(
            Problem(
                path=f"{RESOURCES}.gpus_per_node",
                value=_given(resources.gpus_per_node),
                message=f"with cluster.num_nodes={total} generation takes whole nodes, so it "
                f"must equal cluster.gpus_per_node ({per_node})",
                fix=f"set {RESOURCES}.gpus_per_node={per_node}",
            )
        )
    return problems


def _given(value: int | None) -> object:
    """A missing count (null) is shown as missing, not as ``= None``."""
    return NO_VALUE if value is None else value
