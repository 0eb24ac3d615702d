"""The NeMo RL fields of the schema that nothing acts on, and why that is right
(``NOT_CONSUMED``): the other half of ``hpcrl.config.consumers``, which lists where each
implemented field takes effect. ``tests/config/test_compat.py`` holds every NeMo RL field of
the schema to exactly one of the two.
"""

from __future__ import annotations

from typing import Literal

import attrs

from hpcrl.config.shared_methods import SharedMethods


@attrs.frozen
class NotConsumed(SharedMethods):
    """A schema field nothing acts on, and why that is right.

    inert: whatever it holds, nothing could change (``reason`` says why); off_only: only
    ``off`` is accepted, the rule ``rule`` (``module:function``) refuses any other value
    with the reason."""

    status: Literal["inert", "off_only"]
    reason: str
    off: str = ""
    rule: str = ""


NOT_CONSUMED: dict[str, NotConsumed] = {
    "policy.generation.refit_transport": NotConsumed(
        "inert",
        "how NeMo RL moves the trainer's weights into vLLM (NCCL reshard, lossless sparse "
        "deltas over S3/ZeroMQ, NIXL): the same weights arrive; hpcrl refits through its own "
        "path (hpcrl.config.generation_rules refuses it without vLLM, as NeMo RL does)",
    ),
    "grpo.skip_reference_policy_logprobs_calculation": NotConsumed(
        "inert",
        "true is accepted only with loss_fn.reference_policy_kl_penalty 0 (NeMo RL asserts "
        "it; hpcrl.config.grpo_option_rules refuses it otherwise), and at penalty 0 hpcrl "
        "never computes the reference policy's log-probs (NeMo RL turns the switch on itself "
        "then): either value trains the same",
    ),
    "policy.megatron_cfg.use_fused_linear_logprobs": NotConsumed(
        "inert",
        "NeMo RL's memory saving: log-probs computed from the hidden states in sequence "
        "chunks, the same values as its unfused path, which hpcrl computes (with the full "
        "logits: the memory saving itself is not implemented); "
        "hpcrl.config.fused_logprobs_rules refuses what NeMo RL refuses with it, and a "
        "temperature other than 1, where its fused path computes something else",
    ),
    "grpo.val_batch_size": NotConsumed(
        "inert",
        "how many validation prompts NeMo RL generates per call; hpcrl samples every "
        "validation prompt in one call, each row with its own seed: the batch size does not "
        "change what is sampled",
    ),
    "async_rl.diagnostics": NotConsumed(
        "inert", "NeMo RL prints a preview of each finished rollout: the log, not the run"
    ),
    "data.num_workers": NotConsumed(
        "inert",
        "worker processes of NeMo RL's data loader: how fast rows are read, not which rows "
        "(hpcrl's sampler reads them in the driver, in the seed's order)",
    ),
    "env.math.num_workers": NotConsumed(
        "inert",
        "processes NeMo RL scores responses with; hpcrl scores them in one process: the same "
        "rewards",
    ),
    "env.math_multi_reward.math_verify_impl": NotConsumed(
        "inert",
        "hf_math_verify is the only value NeMo RL's multi-reward worker takes (the schema "
        "refuses any other), and its three rewards are plain string checks",
    ),
    "env.math_multi_reward.num_workers": NotConsumed(
        "inert",
        "processes NeMo RL scores responses with; hpcrl scores them in one process: the same "
        "rewards",
    ),
    "policy.megatron_cfg.checkpoint.async_save": NotConsumed(
        "inert",
        "NeMo RL writes Megatron checkpoints from a background worker when set; hpcrl writes "
        "them before the step returns: the same checkpoint, written at another time",
    ),
    "policy.megatron_cfg.empty_unused_memory_level": NotConsumed(
        "inert",
        "how often NeMo RL's Megatron worker returns cached CUDA memory to the driver "
        "(torch.cuda.empty_cache): memory, not values",
    ),
    "policy.megatron_cfg.peft.a2a_experimental": NotConsumed(
        "off_only",
        "the all-to-all exchange of expert adapters is not supported by hpcrl yet",
        off="false",
        rule="hpcrl.config.lora_rules:rule_megatron_peft",
    ),
    "policy.megatron_cfg.peft.lora_dtype": NotConsumed(
        "off_only",
        "adapters take the model's parameter dtype; a dtype of their own is not supported yet",
        off="null",
        rule="hpcrl.config.lora_rules:rule_megatron_peft",
    ),
    "policy.automodel_cfg.lora_cfg.use_triton": NotConsumed(
        "inert",
        "NeMo Automodel's Triton kernel for the adapter's product B(A(x)); hpcrl computes the "
        "same product with PyTorch's matmuls: the same values",
    ),
    "policy.megatron_cfg.distributed_data_parallel_config.use_custom_fsdp": NotConsumed(
        "off_only",
        "Megatron FSDP is not supported by the Megatron backend yet",
        off="false",
        rule="hpcrl.config.rules:rule_megatron_custom_fsdp",
    ),
    "grpo.max_rollout_turns": NotConsumed(
        "off_only",
        "multi-turn rollouts (environments that answer back) are not supported yet",
        off="1",
        rule="hpcrl.config.grpo_option_rules:rule_single_turn",
    ),
    "env.reward_model.processor": NotConsumed(
        "inert",
        "NeMo RL's reward-model environment does not read it (the data sets' processors "
        "format the prompts)",
    ),
    "env.reward_model.offload_optimizer_for_logprob": NotConsumed(
        "inert", "the reward model has no optimizer to offload"
    ),
    "env.reward_model.dtensor_cfg.sequence_parallel": NotConsumed(
        "inert",
        "splits the sequence over tensor-parallel ranks, and the scorer has none (its "
        "tensor_parallel_size must be 1): the same scores",
    ),
    "env.reward_model.reward_model_cfg.reward_model_type": NotConsumed(
        "inert", "bradley_terry is the only value NeMo RL and the schema accept"
    ),
    "env.reward_model.checkpoint_path": NotConsumed(
        "off_only",
        "the scorer loads model_name's Hugging Face folder, not a training checkpoint",
        off="null",
        rule="hpcrl.config.reward_model_rules:rule_reward_model_settings",
    ),
    "env.reward_model.max_grad_norm": NotConsumed(
        "off_only",
        "the reward model never trains (NeMo RL asserts null)",
        off="null",
        rule="hpcrl.config.reward_model_rules:rule_reward_model_settings",
    ),
    "env.reward_model.reward_model_cfg.enabled": NotConsumed(
        "off_only",
        "NeMo RL's reward-model environment asserts it",
        off="true",
        rule="hpcrl.config.reward_model_rules:rule_reward_model_settings",
    ),
    "env.reward_model.dtensor_cfg.enabled": NotConsumed(
        "off_only",
        "NeMo RL runs reward models on its DTensor policy only",
        off="true",
        rule="hpcrl.config.reward_model_rules:rule_reward_model_settings",
    ),
    "env.reward_model.dtensor_cfg.cpu_offload": NotConsumed(
        "off_only",
        "NeMo RL does not support it for reward models",
        off="false",
        rule="hpcrl.config.reward_model_rules:rule_reward_model_settings",
    ),
    "env.reward_model.dtensor_cfg.activation_checkpointing": NotConsumed(
        "off_only",
        "the reward model never trains",
        off="false",
        rule="hpcrl.config.reward_model_rules:rule_reward_model_settings",
    ),
    "env.reward_model.dtensor_cfg.tensor_parallel_size": NotConsumed(
        "off_only",
        "the scorer holds the whole model on each of its GPUs",
        off="1",
        rule="hpcrl.config.reward_model_rules:rule_reward_model_settings",
    ),
    "env.reward_model.dtensor_cfg.context_parallel_size": NotConsumed(
        "off_only",
        "the scorer holds the whole model on each of its GPUs",
        off="1",
        rule="hpcrl.config.reward_model_rules:rule_reward_model_settings",
    ),
    "env.reward_model.dynamic_batching.enabled": NotConsumed(
        "off_only",
        "NeMo RL does not support it for reward models",
        off="false",
        rule="hpcrl.config.reward_model_rules:rule_reward_model_settings",
    ),
    "env.reward_model.sequence_packing.enabled": NotConsumed(
        "off_only",
        "NeMo RL does not support it for reward models",
        off="false",
        rule="hpcrl.config.reward_model_rules:rule_reward_model_settings",
    ),
}
