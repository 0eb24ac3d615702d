"""What each key of ``test_consumers_downstream.py`` is set to: a value other than the base
recipe's (``CHANGES``; keys it does not list get a flipped bool or a doubled number there), and
the context a key needs to take effect (dotted keys set on both recipes: vLLM generation,
separate generation nodes, importance sampling, ...). Shared with test_group_selection.py.
"""

from __future__ import annotations

from typing import Any

import attrs


@attrs.frozen
class Change:
    """``value`` for the key under test; ``context``: dotted keys set on both recipes."""

    value: Any
    context: dict[str, Any] = attrs.field(factory=dict)
    base: str = ""  # "" : chosen by the key's section
    also: dict[str, Any] = attrs.field(factory=dict)  # set with the key (it needs them)


#: a GRPO recipe scored by the reward model (env.reward_model is read then)
#: (half of the base's 8 GPUs: training keeps dp 4, which its batch sizes divide)
RM: dict[str, Any] = {
    "env.name": "reward_model",
    "env.reward_model": {"model_name": "rm", "resources": {"gpus_per_node": 4}},
}

CHECKPOINTS_ELSEWHERE = "<tmp>/elsewhere"  # made absolute below the test's folder
CHAT_TEMPLATE = (
    "{% for m in messages %}<{{ m['role'] }}>{{ m['content'] }}{% endfor %}"
    "{% if add_generation_prompt %}<assistant>{% endif %}"
)
THINKING_TEMPLATE = CHAT_TEMPLATE + "{% if enable_thinking %}<think>{% endif %}"
LINEAR = {
    "name": "torch.optim.lr_scheduler.LinearLR",
    "kwargs": {"start_factor": 0.1, "end_factor": 1.0, "total_iters": 4},
}
VLLM = {"policy.generation.backend": "vllm"}
PACKING = {"policy.sequence_packing.enabled": True}
DYNAMIC = {"policy.dynamic_batching.enabled": True}
SHAPING = {
    "grpo.reward_shaping.enabled": True,
    "grpo.reward_shaping.max_response_length": 6,
    "grpo.reward_shaping.overlong_buffer_length": 3,
}
SCALING = {"grpo.reward_scaling.enabled": True}
IS = {"loss_fn.use_importance_sampling_correction": True}
#: NeMo RL's single-controller form, as its configs write it (no IS correction needed)
SC = {
    "async_rl.sampler.name": "in_order",
    "async_rl.min_groups_for_streaming_train": 24,  # SEPARATE's grpo.num_prompts_per_step
    "async_rl.max_buffered_rollouts": 96,  # room for lookahead 2
}
#: NeMo RL's ready_first sampler, every group it may dispatch in flight at once
READY_FIRST = {
    **IS,
    "async_rl.sampler.name": "ready_first",
    "async_rl.max_inflight_prompts": 96,
}
TIS = {**IS, "loss_fn.truncated_importance_sampling_type": "icepop"}
TIS_BOUNDS = {
    **TIS,
    "loss_fn.truncated_importance_sampling_ratio": 2.0,
    "loss_fn.truncated_importance_sampling_ratio_min": 0.5,
}
SEPARATE = {
    **VLLM,
    "policy.generation.colocated.enabled": False,
    "policy.generation.colocated.resources.num_nodes": 1,
    "policy.generation.colocated.resources.gpus_per_node": 8,
    "cluster.num_nodes": 2,
    # enough rollouts for any data-parallel size these layouts give
    "grpo.num_prompts_per_step": 24,
    "policy.train_global_batch_size": 96,
}
TO_MEGATRON = {
    "policy.automodel_cfg.enabled": False,
    "policy.megatron_cfg.enabled": True,
    "policy.optimizer": None,
}
MG_OFFLOAD = {
    "policy.megatron_cfg.optimizer.optimizer_cpu_offload": True,
    "policy.megatron_cfg.optimizer.optimizer_offload_fraction": 0.5,
}
RECOMPUTE = {"policy.megatron_cfg.activation_checkpointing": True}
FLEX = {"policy.megatron_cfg.moe_token_dispatcher_type": "flex"}
HYBRIDEP = {**FLEX, "policy.megatron_cfg.moe_flex_dispatcher_backend": "hybridep"}
LORA = "policy.automodel_cfg.lora_cfg"
LORA_ON = {f"{LORA}.enabled": True}
LORA_PICKED = {**LORA_ON, f"{LORA}.match_all_linear": False}
PEFT = "policy.megatron_cfg.peft"
PEFT_ON = {f"{PEFT}.enabled": True}
FINE_OFFLOAD = {
    "policy.megatron_cfg.fine_grained_activation_offloading": True,
    "policy.megatron_cfg.offload_modules": ["attn_norm"],
}

CHANGES: dict[str, Change] = {
    "policy.model_name": Change("tiny:llama"),
    "policy.tokenizer.name": Change("/tokenizers/other"),
    "policy.tokenizer.chat_template": Change(CHAT_TEMPLATE),
    "policy.tokenizer.chat_template_kwargs": Change(
        {"enable_thinking": True}, {"policy.tokenizer.chat_template": THINKING_TEMPLATE}
    ),
    "policy.train_global_batch_size": Change(32, {"grpo.num_prompts_per_step": 8}),
    "policy.train_micro_batch_size": Change(1),
    "policy.logprob_batch_size": Change(1),
    "policy.max_total_sequence_length": Change(24),
    "policy.precision": Change("float32"),
    "policy.max_grad_norm": Change(0.5),
    "policy.optimizer.name": Change("torch.optim.SGD", {"policy.optimizer.kwargs": {"lr": 0.1}}),
    "policy.optimizer.kwargs": Change({"lr": 3e-4, "weight_decay": 0.1}),
    "policy.scheduler": Change([LINEAR]),
    "policy.make_sequence_length_divisible_by": Change(8),
    "policy.generation.backend": Change("vllm"),
    "policy.generation.max_new_tokens": Change(4),
    "policy.generation.temperature": Change(0.7),
    "policy.generation.top_p": Change(0.9),
    "policy.generation.top_k": Change(5),
    "policy.generation.stop_token_ids": Change([7]),
    "policy.generation.stop_strings": Change(["a"]),
    "policy.generation.colocated.enabled": Change(
        False, {**SEPARATE, "policy.generation.colocated.enabled": True}
    ),
    "policy.generation.colocated.resources.num_nodes": Change(
        2, {**SEPARATE, "cluster.num_nodes": 3}
    ),
    # NeMo RL's split: more than one node gives generation whole nodes; one node splits
    "policy.generation.colocated.resources.gpus_per_node": Change(
        4,
        {
            **SEPARATE,
            "cluster.num_nodes": 1,
            "policy.generation.colocated.resources.gpus_per_node": 2,
        },
    ),
    "policy.generation.vllm_cfg.precision": Change("float16", VLLM),
    "policy.generation.vllm_cfg.tensor_parallel_size": Change(2, SEPARATE),
    "policy.generation.vllm_cfg.pipeline_parallel_size": Change(2, SEPARATE),
    "policy.generation.vllm_cfg.gpu_memory_utilization": Change(0.3, VLLM),
    "policy.generation.vllm_cfg.max_model_len": Change(32, VLLM),
    "policy.generation.vllm_cfg.enforce_eager": Change(True, VLLM),
    "policy.generation.vllm_cfg.enable_prefix_caching": Change(False, VLLM),
    "policy.generation.vllm_cfg.env_vars": Change({"VLLM_PROBE_VAR": "1"}, VLLM),
    "policy.automodel_cfg.env_vars": Change({"PROBE_VAR": "1"}),
    "policy.hf_config_overrides": Change({"rms_norm_eps": 1e-3}, VLLM),
    "policy.generation.vllm_kwargs": Change({"max_num_seqs": 8}, VLLM),
    "policy.dynamic_batching.enabled": Change(True),
    "policy.dynamic_batching.train_mb_tokens": Change(128, DYNAMIC),
    "policy.dynamic_batching.logprob_mb_tokens": Change(128, DYNAMIC),
    "policy.dynamic_batching.sequence_length_round": Change(16, DYNAMIC),
    "policy.sequence_packing.enabled": Change(True),
    "policy.sequence_packing.train_mb_tokens": Change(128, PACKING),
    "policy.sequence_packing.logprob_mb_tokens": Change(128, PACKING),
    "policy.sequence_packing.algorithm": Change("first_fit_shuffle", PACKING),
    "policy.sequence_packing.sequence_length_round": Change(16, PACKING),
    "policy.automodel_cfg.enabled": Change(False, also=TO_MEGATRON),
    "policy.automodel_cfg.dp_replicate_size": Change(2),
    "policy.automodel_cfg.tensor_parallel_size": Change(2),
    "policy.automodel_cfg.context_parallel_size": Change(2),
    # with TP 1 it has nothing to split (a config warning): both recipes get TP 2
    "policy.automodel_cfg.sequence_parallel": Change(
        True, {"policy.automodel_cfg.tensor_parallel_size": 2}
    ),
    "policy.automodel_cfg.expert_parallel_size": Change(2),
    "policy.automodel_cfg.moe_parallelizer.ignore_router_for_ac": Change(
        True,
        {
            "policy.automodel_cfg.activation_checkpointing": True,
            "policy.automodel_cfg.expert_parallel_size": 2,
        },
    ),
    "policy.automodel_cfg.cpu_offload": Change(True),
    f"{LORA}.enabled": Change(True),
    f"{LORA}.target_modules": Change(
        ["*q_proj"], {**LORA_PICKED, f"{LORA}.target_modules": ["*_proj"]}
    ),
    f"{LORA}.exclude_modules": Change(
        ["*mlp*"], {**LORA_PICKED, f"{LORA}.exclude_modules": ["lm_head"]}
    ),
    f"{LORA}.match_all_linear": Change(False, LORA_ON, also={f"{LORA}.exclude_modules": ["*mlp*"]}),
    f"{LORA}.dim": Change(4, LORA_ON),
    f"{LORA}.alpha": Change(8, LORA_ON),
    f"{LORA}.dropout": Change(0.1, LORA_ON),
    f"{LORA}.dropout_position": Change("pre", LORA_ON),
    f"{LORA}.lora_A_init": Change("uniform", LORA_ON),
    "policy.megatron_cfg.enabled": Change(True, base="grpo", also=TO_MEGATRON),
    f"{PEFT}.enabled": Change(True),
    f"{PEFT}.target_modules": Change(["linear_qkv"], PEFT_ON),
    f"{PEFT}.exclude_modules": Change(["*linear_fc2"], PEFT_ON),
    f"{PEFT}.dim": Change(4, PEFT_ON),
    f"{PEFT}.alpha": Change(8, PEFT_ON),
    f"{PEFT}.dropout": Change(0.1, PEFT_ON),
    f"{PEFT}.dropout_position": Change("pre", PEFT_ON),
    f"{PEFT}.lora_A_init_method": Change("kaiming", PEFT_ON),
    f"{PEFT}.lora_B_init_method": Change("normal", PEFT_ON),
    "policy.megatron_cfg.pipeline_model_parallel_size": Change(2),
    "policy.megatron_cfg.num_layers_in_first_pipeline_stage": Change(
        1, {"policy.megatron_cfg.pipeline_model_parallel_size": 2}
    ),
    "policy.megatron_cfg.num_layers_in_last_pipeline_stage": Change(
        1, {"policy.megatron_cfg.pipeline_model_parallel_size": 2}
    ),
    "policy.megatron_cfg.sequence_parallel": Change(
        True, {"policy.megatron_cfg.tensor_model_parallel_size": 2}
    ),
    "policy.megatron_cfg.expert_model_parallel_size": Change(2),
    "policy.megatron_cfg.expert_tensor_parallel_size": Change(2),
    "policy.megatron_cfg.pipeline_dtype": Change("float32"),
    "policy.megatron_cfg.recompute_granularity": Change("selective", RECOMPUTE),
    "policy.megatron_cfg.recompute_modules": Change(
        ["mlp"], {**RECOMPUTE, "policy.megatron_cfg.recompute_granularity": "selective"}
    ),
    "policy.megatron_cfg.fine_grained_activation_offloading": Change(
        True, also={"policy.megatron_cfg.offload_modules": ["attn_norm"]}
    ),
    "policy.megatron_cfg.offload_modules": Change(["mlp_norm"], FINE_OFFLOAD),
    "policy.megatron_cfg.cuda_graph_impl": Change("local"),
    "policy.megatron_cfg.attention_backend": Change("flash"),
    "policy.megatron_cfg.moe_router_dtype": Change("fp64"),
    "policy.megatron_cfg.moe_router_load_balancing_type": Change("aux_loss"),
    "policy.megatron_cfg.moe_router_bias_update_rate": Change(0.001),
    "policy.megatron_cfg.moe_token_dispatcher_type": Change("alltoall"),
    "policy.megatron_cfg.moe_enable_deepep": Change(True, FLEX),
    "policy.megatron_cfg.moe_flex_dispatcher_backend": Change("hybridep", FLEX),
    "policy.megatron_cfg.moe_hybridep_num_sms": Change(32, HYBRIDEP),
    "policy.megatron_cfg.hybridep_num_ranks_per_nvlink_domain": Change(4, HYBRIDEP),
    "policy.megatron_cfg.hybridep_use_mnnvl": Change(True, HYBRIDEP),
    "policy.megatron_cfg.env_vars": Change({"PROBE_VAR": "1"}),
    "policy.megatron_cfg.env_vars.PYTORCH_CUDA_ALLOC_CONF": Change("expandable_segments:True"),
    "policy.megatron_cfg.optimizer.min_lr": Change(1e-6),
    "policy.megatron_cfg.model_overrides": Change({"hidden_dropout": 0.1}),
    "policy.megatron_cfg.optimizer.optimizer": Change("sgd"),
    "policy.megatron_cfg.optimizer.bf16": Change(True, {"policy.precision": "float32"}),
    "policy.megatron_cfg.optimizer.fp16": Change(True, {"policy.precision": "float32"}),
    "policy.megatron_cfg.optimizer.params_dtype": Change("bfloat16"),
    "policy.megatron_cfg.optimizer.optimizer_cpu_offload": Change(
        True, {"policy.megatron_cfg.optimizer.optimizer_offload_fraction": 0.5}
    ),
    "policy.megatron_cfg.optimizer.optimizer_offload_fraction": Change(1.0, MG_OFFLOAD),
    "policy.megatron_cfg.optimizer.overlap_cpu_optimizer_d2h_h2d": Change(True, MG_OFFLOAD),
    "policy.megatron_cfg.optimizer.use_precision_aware_optimizer": Change(True),
    "policy.megatron_cfg.scheduler.weight_decay_incr_style": Change(
        "linear", {"policy.megatron_cfg.scheduler.end_weight_decay": 0.1}
    ),
    "policy.megatron_cfg.scheduler.lr_decay_style": Change("linear"),
    "policy.megatron_cfg.scheduler.lr_decay_iters": Change(50),
    "policy.megatron_cfg.scheduler.lr_warmup_iters": Change(5),
    "policy.megatron_cfg.distributed_data_parallel_config.data_parallel_sharding_strategy": Change(
        "optim"
    ),
    "data.max_input_seq_length": Change(8),
    "grpo.num_prompts_per_step": Change(8),
    "grpo.num_generations_per_prompt": Change(8),
    "grpo.max_num_steps": Change(1),
    "grpo.max_num_epochs": Change(2, {"grpo.max_num_steps": 1000}),
    "grpo.val_period": Change(3),
    "grpo.val_at_start": Change(True),
    "policy.generation.val_temperature": Change(0.6),
    "policy.generation.val_top_p": Change(0.9),
    # 6 steps, validation every 4: [4] becomes [4, 6]
    "grpo.val_at_end": Change(True, {"grpo.val_period": 4}),
    "grpo.async_grpo.enabled": Change(True, {**SEPARATE, **IS}),
    "grpo.async_grpo.max_trajectory_age_steps": Change(
        2, {**SEPARATE, **IS, "grpo.async_grpo.enabled": True}
    ),
    "grpo.async_grpo.in_flight_weight_updates": Change(
        True, {**SEPARATE, **IS, "grpo.async_grpo.enabled": True}
    ),
    "grpo.async_grpo.recompute_kv_cache_after_weight_updates": Change(
        True,
        {
            **SEPARATE,
            **IS,
            "grpo.async_grpo.enabled": True,
            "grpo.async_grpo.in_flight_weight_updates": True,
        },
    ),
    # NeMo RL's async_rl form (in_order, lookahead 1 unless changed): the same loop
    "async_rl.sampler.max_lookahead_versions": Change(2, {**SEPARATE, **SC}),
    "async_rl.recompute_kv_cache_after_weight_updates": Change(True, {**SEPARATE, **SC}),
    # the grouped loop (windowed / ready_first): which finished groups each step takes
    "async_rl.sampler.name": Change("windowed", {**SEPARATE, **SC}),
    "async_rl.sampler.max_staleness_versions": Change(2, {**SEPARATE, **SC, **READY_FIRST}),
    "async_rl.min_groups_for_streaming_train": Change(1, {**SEPARATE, **SC, **READY_FIRST}),
    "async_rl.max_inflight_prompts": Change(8, {**SEPARATE, **SC, **READY_FIRST}),
    "async_rl.max_buffered_rollouts": Change(
        50, {**SEPARATE, **SC, **READY_FIRST, "async_rl.sampler.name": "windowed"}
    ),
    "grpo.use_dynamic_sampling": Change(True),
    "grpo.dynamic_sampling_max_gen_batches": Change(1, {"grpo.use_dynamic_sampling": True}),
    "grpo.batch_multiplier": Change(2, {"grpo.use_dynamic_sampling": True}),
    "grpo.reward_shaping.enabled": Change(
        True,
        {
            "grpo.reward_shaping.max_response_length": 6,
            "grpo.reward_shaping.overlong_buffer_length": 3,
        },
    ),
    "grpo.reward_shaping.overlong_buffer_length": Change(2, SHAPING),
    "grpo.reward_shaping.overlong_buffer_penalty": Change(0.5, SHAPING),
    "grpo.reward_shaping.max_response_length": Change(5, SHAPING),
    "grpo.reward_scaling.enabled": Change(True, {"grpo.reward_scaling.target_max": 2.0}),
    "grpo.reward_scaling.source_min": Change(0.5, SCALING),
    "grpo.reward_scaling.source_max": Change(0.5, SCALING),
    "grpo.reward_scaling.target_min": Change(-1.0, SCALING),
    "grpo.reward_scaling.target_max": Change(3.0, SCALING),
    "grpo.max_val_samples": Change(10),
    "grpo.adv_estimator.name": Change("reinforce_plus_plus"),
    "grpo.adv_estimator.normalize_rewards": Change(False),
    "grpo.adv_estimator.use_leave_one_out_baseline": Change(False),
    "grpo.adv_estimator.minus_baseline": Change(
        False, {"grpo.adv_estimator.name": "reinforce_plus_plus"}
    ),
    "grpo.adv_estimator.reward_weights": Change(
        [2.0, 0.5, 1.0], {"grpo.adv_estimator.name": "gdpo", "env.name": "math_multi_reward"}
    ),
    "grpo.advantage_clip_low": Change(-0.1),
    "grpo.advantage_clip_high": Change(0.1),
    "grpo.seq_logprob_error_threshold": Change(1.0001),
    "grpo.reward_shaping.stop_properly_penalty_coef": Change(0.5, SHAPING),
    "sft.max_num_steps": Change(1),
    "sft.max_num_epochs": Change(2, {"sft.max_num_steps": 1000}),
    "sft.val_period": Change(3),
    "sft.val_at_start": Change(True),
    "sft.val_at_end": Change(True, {"sft.val_period": 4}),
    "sft.val_batches": Change(2, {"sft.val_global_batch_size": 4}),
    "sft.val_global_batch_size": Change(4, {"sft.val_batches": 2}),
    "loss_fn.reference_policy_kl_type": Change("k1"),
    "loss_fn.kl_input_clamp_value": Change(0.1),
    "loss_fn.kl_output_clamp_value": Change(0.01),
    "loss_fn.ratio_clip_min": Change(0.01),
    "loss_fn.ratio_clip_max": Change(0.01),
    "loss_fn.ratio_clip_c": Change(1.5),
    "loss_fn.sequence_level_importance_ratios": Change(True, {"loss_fn.token_level_loss": False}),
    "loss_fn.use_on_policy_kl_approximation": Change(True),
    "loss_fn.use_importance_sampling_correction": Change(True),
    "loss_fn.truncated_importance_sampling_type": Change(
        "icepop",
        IS,
        also={
            "loss_fn.truncated_importance_sampling_ratio": 1.05,
            "loss_fn.truncated_importance_sampling_ratio_min": 0.99,
        },
    ),
    "loss_fn.truncated_importance_sampling_ratio": Change(0.84, TIS_BOUNDS),
    "loss_fn.truncated_importance_sampling_ratio_min": Change(0.83, TIS_BOUNDS),
    "env.math.math_verify_impl": Change("hf_math_verify"),
    "env.reward_model.model_name": Change("other-rm", RM),
    "env.reward_model.tokenizer.name": Change("rm-tokenizer", RM),
    "env.reward_model.precision": Change("float32", RM),
    "env.reward_model.batch_size": Change(3, RM),
    "env.reward_model.max_model_len": Change(64, RM),
    "env.reward_model.resources.gpus_per_node": Change(6, RM),
    "env.reward_model.resources.num_nodes": Change(
        2,
        {
            "env.name": "reward_model",
            "env.reward_model": {"model_name": "rm", "resources": {"gpus_per_node": 2}},
            "cluster.num_nodes": 3,
            "cluster.gpus_per_node": 2,
        },
    ),
    "checkpointing.enabled": Change(False),
    "checkpointing.checkpoint_dir": Change(CHECKPOINTS_ELSEWHERE),
    "checkpointing.save_period": Change(3),
    "checkpointing.checkpoint_must_save_by": Change("00:00:00:00"),
    "checkpointing.keep_top_k": Change(1),
    "checkpointing.metric_name": Change("train:reward", {"checkpointing.keep_top_k": 2}),
    "checkpointing.higher_is_better": Change(
        False, {"checkpointing.keep_top_k": 1, "checkpointing.metric_name": "val:accuracy"}
    ),
    "checkpointing.save_consolidated": Change(True),
    "logger.log_dir": Change("other_logs", {"logger.tensorboard_enabled": True}),
    "logger.mlflow_enabled": Change(True),
    "logger.monitor_gpus": Change(True),
    "logger.wandb.project": Change("probe", {"logger.wandb_enabled": True}),
    "logger.wandb.name": Change("probe-run", {"logger.wandb_enabled": True}),
    "logger.wandb.entity": Change("probe-team", {"logger.wandb_enabled": True}),
    "logger.tensorboard.log_dir": Change("tb_elsewhere", {"logger.tensorboard_enabled": True}),
    "logger.mlflow.experiment_name": Change("probe", {"logger.mlflow_enabled": True}),
    "logger.mlflow.run_name": Change("probe-run", {"logger.mlflow_enabled": True}),
    "logger.mlflow.tracking_uri": Change(
        "file:///tmp/hpcrl-probe-mlruns", {"logger.mlflow_enabled": True}
    ),
    "logger.gpu_monitoring.collection_interval": Change(2.0, {"logger.monitor_gpus": True}),
    "logger.gpu_monitoring.flush_interval": Change(2.0, {"logger.monitor_gpus": True}),
    "cluster.num_nodes": Change(
        2, {"grpo.num_prompts_per_step": 8, "policy.train_global_batch_size": 32}
    ),
    "cluster.gpus_per_node": Change(4),
    "data.add_generation_prompt": Change(True),
    "policy.optimizer.kwargs.lr": Change(3e-4),
    "policy.optimizer.kwargs.weight_decay": Change(0.1),
    "policy.optimizer.kwargs.betas": Change([0.8, 0.95]),
    "policy.optimizer.kwargs.eps": Change(1e-6),
    "policy.optimizer.kwargs.foreach": Change(True),
    "policy.optimizer.kwargs.fused": Change(False),
}

#: hpcrl's own keys with consumer sites (no NeMo RL field, so not in the compat table)
HPCRL_KEYS = {"policy.automodel_cfg.optimizer_offload_fraction": Change(0.5)}
