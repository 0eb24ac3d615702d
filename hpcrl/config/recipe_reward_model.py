"""The recipe schema's reward-model environment (``env.reward_model``, NeMo RL's form): the
settings of the environment that data sets with ``env_name: reward_model`` are scored by.
Part of ``hpcrl.config.recipe`` (which re-exports it); cross-field rules in
``hpcrl.config.reward_model_rules``, the scorer in
``hpcrl.core.environments.reward_model_env``.

NeMo RL runs the reward model as a policy of its own (DTensor, no optimizer) on GPUs carved
out of ``cluster``; hpcrl runs one scorer per GPU of ``resources`` (the whole model on each,
conversations split evenly over them), which computes the same scores.
"""

from __future__ import annotations

from typing import Any, Literal

import attrs

from hpcrl.config.field_bounds import FieldBound, bounded
from hpcrl.config.recipe_policy import TokenizerCfg
from hpcrl.config.shared_methods import SharedMethods

AT_LEAST_ONE = FieldBound(low=1, message="must be at least 1", fix="set {path} to 1 or more")


@attrs.frozen(kw_only=True)
class RewardModelResourcesCfg(SharedMethods):
    """Where the reward model runs, carved out of ``cluster`` as NeMo RL carves it: on a
    one-node job ``gpus_per_node`` of the node's GPUs (``num_nodes`` is not read); on more
    nodes ``num_nodes`` whole nodes of the job, ``gpus_per_node`` GPUs used on each."""

    gpus_per_node: int = bounded(1, AT_LEAST_ONE)
    num_nodes: int = bounded(1, AT_LEAST_ONE)


@attrs.frozen(kw_only=True)
class RewardModelTypeCfg(SharedMethods):
    """NeMo RL's ``reward_model_cfg``: it runs Bradley-Terry models only (one logit)."""

    enabled: bool = True
    reward_model_type: Literal["bradley_terry"] = "bradley_terry"


@attrs.frozen(kw_only=True)
class RewardModelDtensorCfg(SharedMethods):
    """NeMo RL's ``dtensor_cfg`` of the reward model: how its reward-model policy is sharded.
    hpcrl's scorer holds the whole model on each GPU: sizes other than 1 and the training
    switches are refused (hpcrl.config.reward_model_rules); ``sequence_parallel`` splits
    only what TP > 1 would, so it is inert here."""

    enabled: bool = True
    tensor_parallel_size: int = 1
    context_parallel_size: int = 1
    sequence_parallel: bool = False
    cpu_offload: bool = False
    activation_checkpointing: bool = False


@attrs.frozen(kw_only=True)
class SwitchCfg(SharedMethods):
    """A NeMo RL section that only switches a feature (``dynamic_batching``,
    ``sequence_packing`` of the reward model: NeMo RL asserts both off)."""

    enabled: bool = False


@attrs.frozen(kw_only=True)
class RewardModelEnvCfg(SharedMethods):
    """NeMo RL's ``env.reward_model`` (its examples/configs/grpo_rm_1B.yaml)."""

    model_name: str
    tokenizer: TokenizerCfg = attrs.field(factory=TokenizerCfg)  # name None: the model's
    precision: Literal["bfloat16", "float16", "float32"] = "bfloat16"
    batch_size: int = bounded(8, AT_LEAST_ONE)  # conversations per forward
    max_model_len: int = bounded(2048, AT_LEAST_ONE)  # longer conversations keep their start
    # a DCP checkpoint of the reward model (NeMo RL's weights_path): refused unless null
    checkpoint_path: str | None = None
    processor: str | None = None  # not read by NeMo RL's reward-model environment
    offload_optimizer_for_logprob: bool = False  # the scorer has no optimizer
    logprob_batch_size: int | None = None  # NeMo RL's policy key; the scorer uses batch_size
    resources: RewardModelResourcesCfg = attrs.field(factory=RewardModelResourcesCfg)
    reward_model_cfg: RewardModelTypeCfg = attrs.field(factory=RewardModelTypeCfg)
    dtensor_cfg: RewardModelDtensorCfg = attrs.field(factory=RewardModelDtensorCfg)
    dynamic_batching: SwitchCfg = attrs.field(factory=SwitchCfg)
    sequence_packing: SwitchCfg = attrs.field(factory=SwitchCfg)
    max_grad_norm: float | None = None  # NeMo RL asserts null: the scorer does not train
    generation: dict[str, Any] | None = None  # NeMo RL's, unused by its reward-model env
