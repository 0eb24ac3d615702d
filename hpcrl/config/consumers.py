"""Where each recipe field NeMo RL also has takes effect: the code sites that read its value
and act on it (``CONSUMED_BY``), or why none does (``NOT_CONSUMED``).

This is what ``docs/nemo-rl-compat.md`` (``hpcrl.config.compat``) calls "implemented": a
field is implemented only through the sites listed here, never for being a schema field.
Two tests hold the declarations to the code: ``tests/config/test_consumers.py`` (every
NeMo RL field of the schema is declared, every site exists and reads the field) and
``tests/core/test_consumers_downstream.py`` (each implemented key, set to a value other
than its default, changes what its sites build: the JobSpec and script, the engine's
arguments, the batch plan, the loss, a GRPO/SFT step, the optimizer, the model provider).

A site is ``module:qualified.name``; text only, so this module imports nothing heavy.
"""

from __future__ import annotations

from typing import Literal

import attrs

PLAN = "hpcrl.plan.planner:plan"
LAYOUT = "hpcrl.plan.layout:plan_layout"
GEN_PLAN = "hpcrl.plan.generation:plan_generation"
ENGINE = "hpcrl.core.generation.engine:engine_spec"
VLLM_ARGS = "hpcrl.core.generation.vllm_engine:engine_kwargs"
VLLM_ENV = "hpcrl.core.generation.vllm_engine:engine_env"
DIST = "hpcrl.core.token_distribution:TokenDistribution.of_generation"
BATCHING = "hpcrl.core.workers.micro_batches:BatchingSettings.from_recipe"
GRPO_STEP = "hpcrl.core.algorithms.grpo:grpo_step"
SAMPLE = "hpcrl.core.algorithms.grpo:sample_rollouts"
EXPAND = "hpcrl.core.algorithms.grpo:expand_prompts"
BUDGET = "hpcrl.core.algorithms.grpo:context_length"
TRAIN_BATCH = "hpcrl.core.algorithms.grpo:build_train_batch"
FINISH_BATCH = "hpcrl.core.algorithms.grpo:finish_train_batch"
ADVANTAGES = "hpcrl.core.algorithms.advantages:estimate_advantages"
ESTIMATOR_FLAGS = "hpcrl.core.algorithms.advantages:estimator_flags"
SHAPE_REWARDS = "hpcrl.core.algorithms.reward_terms:shape_rewards"
TRAIN = "hpcrl.core.algorithms.grpo:train_on_batch"
TRUNCATED = "hpcrl.core.algorithms.grpo:truncated_responses"
STEP_ROLLOUTS = "hpcrl.core.algorithms.grpo:step_rollouts"
SHAPE = "hpcrl.core.algorithms.reward_terms:overlong_penalty"
SCALE = "hpcrl.core.algorithms.reward_terms:scale_rewards"
LOSS = "hpcrl.core.algorithms.losses:grpo_loss"
KL = "hpcrl.core.algorithms.losses:_kl_term"
IS_WEIGHTS = "hpcrl.core.algorithms.losses:importance_weights"
SFT_STEP = "hpcrl.core.algorithms.sft:sft_step"
SFT_BATCH = "hpcrl.core.algorithms.sft:build_sft_batch"
STEPS = "hpcrl.core.driver:planned_num_steps"
RUN_STEPS = "hpcrl.core.driver:_run_logged_steps"
VAL_ROWS = "hpcrl.core.driver:_limit_validation"
VAL_SAMPLING = "hpcrl.core.algorithms.validation:validation_sampling"
STORE = "hpcrl.core.driver:checkpoint_store"
SAMPLER = "hpcrl.core.driver:training_sampler"
LOGGERS = "hpcrl.core.loggers.sinks:build_loggers"
NAMED = "hpcrl.core.data.named:load_named_rows"
NAMED_SET = "hpcrl.core.data.named:_named"
SPLIT = "hpcrl.core.data.named:_split_of"
DATA_SEED = "hpcrl.core.data.named:_seed"
CARVE = "hpcrl.core.data.named:_carve"
LOCAL = "hpcrl.core.data.named:_load_table"
FIELDS = "hpcrl.core.data.named:_problem_and_target"
MATH_PROMPT = "hpcrl.core.data.named:math_prompt"
SFT_EXAMPLE = "hpcrl.core.data.named:sft_example"
ENV = "hpcrl.core.environments.build:build_environment"
AM_OPTIM = "hpcrl.core.backends.automodel.optim:build_optimizer"
AM_SCHED = "hpcrl.core.backends.automodel.optim:build_lr_scheduler"
AM_TRAIN_OPTIM = "hpcrl.core.backends.automodel.optim:build_training_optimizer"
AM_CLIP = "hpcrl.core.backends.automodel.worker:AutomodelWorker.train_step"
AM_PLAN = "hpcrl.core.backends.automodel.parallelize:parallelize_steps"
AM_LORA = "hpcrl.core.backends.automodel.lora:apply_lora"
MG_PROVIDER = "hpcrl.core.backends.megatron.provider:apply_megatron_cfg"
MG_LORA = "hpcrl.core.backends.megatron.lora:lora_for"
MG_OVERRIDES = "hpcrl.core.backends.megatron.provider:prepare_provider"
MG_CONVERT = "hpcrl.core.backends.megatron.worker:MegatronWorker._ensure_conversion"
MG_OPTIM = "hpcrl.core.backends.megatron.model:optimizer_config"
MG_SCHED = "hpcrl.core.backends.megatron.model:scheduler_settings"
MG_DDP = "hpcrl.core.backends.megatron.model:ddp_config"
JOB_ENV = "hpcrl.plan.planner:_job_env"
AM_LOAD = "hpcrl.core.backends.automodel.model:load_hf_model"

#: schema path (hpcrl's spelling) -> the sites that read its value and act on it
CONSUMED_BY: dict[str, tuple[str, ...]] = {
    # ------------------------------------------------------------------ policy
    "policy.model_name": ("hpcrl.core.driver:train_recipe", "hpcrl.plan.hf_cache:model_names"),
    "policy.tokenizer.name": (ENGINE, "hpcrl.core.data.prompts:load_tokenizer"),
    "policy.tokenizer.chat_template": (EXPAND, "hpcrl.core.data.prompts:load_tokenizer"),
    "policy.tokenizer.chat_template_kwargs": (EXPAND, SFT_BATCH),
    "policy.train_global_batch_size": (TRAIN, "hpcrl.plan.layout:check_batch_sizes"),
    "policy.train_micro_batch_size": (BATCHING,),
    "policy.logprob_batch_size": (BATCHING,),
    "policy.max_total_sequence_length": (BUDGET, BATCHING, ENGINE, SFT_EXAMPLE),
    "policy.precision": (ENGINE, AM_PLAN, MG_PROVIDER),
    "policy.max_grad_norm": (AM_CLIP,),
    "policy.optimizer.name": (AM_OPTIM,),
    "policy.optimizer.kwargs": (AM_OPTIM,),
    "policy.scheduler": (AM_SCHED,),
    "policy.make_sequence_length_divisible_by": (BATCHING,),
    # ------------------------------------------------------------------ generation
    "policy.generation.backend": (ENGINE, GEN_PLAN),
    "policy.generation.max_new_tokens": (SAMPLE, BUDGET, TRUNCATED),
    "policy.generation.temperature": (SAMPLE, DIST),
    "policy.generation.top_p": (SAMPLE, DIST),
    "policy.generation.top_k": (SAMPLE, DIST),
    "policy.generation.val_temperature": (VAL_SAMPLING,),
    "policy.generation.val_top_p": (VAL_SAMPLING,),
    "policy.generation.stop_token_ids": (SAMPLE, TRUNCATED),
    "policy.generation.stop_strings": (SAMPLE, TRUNCATED),
    "policy.generation.colocated.enabled": (
        GEN_PLAN,
        "hpcrl.core.generation.engine:colocated_engine_spec",
    ),
    "policy.generation.colocated.resources.num_nodes": (GEN_PLAN,),
    "policy.generation.colocated.resources.gpus_per_node": (GEN_PLAN,),
    "policy.generation.vllm_cfg.precision": (VLLM_ARGS,),
    "policy.generation.vllm_cfg.tensor_parallel_size": (VLLM_ARGS, GEN_PLAN),
    "policy.generation.vllm_cfg.pipeline_parallel_size": (VLLM_ARGS, GEN_PLAN),
    "policy.generation.vllm_cfg.gpu_memory_utilization": (VLLM_ARGS,),
    "policy.generation.vllm_cfg.max_model_len": (VLLM_ARGS,),
    "policy.generation.vllm_cfg.enforce_eager": (VLLM_ARGS,),
    "policy.generation.vllm_cfg.enable_prefix_caching": (VLLM_ARGS,),
    "policy.generation.vllm_cfg.env_vars": (ENGINE, VLLM_ENV),
    "policy.generation.vllm_kwargs": (ENGINE, VLLM_ARGS),
    # ------------------------------------------------------------------ micro-batching
    "policy.dynamic_batching.enabled": (BATCHING,),
    "policy.dynamic_batching.train_mb_tokens": (BATCHING,),
    "policy.dynamic_batching.logprob_mb_tokens": (BATCHING,),
    "policy.dynamic_batching.sequence_length_round": (BATCHING,),
    "policy.sequence_packing.enabled": (BATCHING,),
    "policy.sequence_packing.train_mb_tokens": (BATCHING,),
    "policy.sequence_packing.logprob_mb_tokens": (BATCHING,),
    "policy.sequence_packing.algorithm": (BATCHING,),
    "policy.sequence_packing.sequence_length_round": (BATCHING,),
    # ------------------------------------------------------------------ automodel_cfg
    "policy.automodel_cfg.enabled": (LAYOUT,),
    "policy.automodel_cfg.dp_replicate_size": (LAYOUT,),
    "policy.automodel_cfg.tensor_parallel_size": (LAYOUT,),
    "policy.automodel_cfg.activation_checkpointing": (AM_PLAN,),
    "policy.automodel_cfg.cpu_offload": (AM_PLAN,),
    # hpcrl's own key (NeMo RL's dtensor_cfg has none)
    "policy.automodel_cfg.optimizer_offload_fraction": (AM_TRAIN_OPTIM,),
    "policy.automodel_cfg.env_vars": (JOB_ENV,),
    "policy.automodel_cfg.lora_cfg.enabled": (AM_PLAN,),
    "policy.automodel_cfg.lora_cfg.target_modules": (AM_LORA,),
    "policy.automodel_cfg.lora_cfg.exclude_modules": (AM_LORA,),
    "policy.automodel_cfg.lora_cfg.match_all_linear": (AM_LORA,),
    "policy.automodel_cfg.lora_cfg.dim": (AM_LORA,),
    "policy.automodel_cfg.lora_cfg.alpha": (AM_LORA,),
    "policy.automodel_cfg.lora_cfg.dropout": (AM_LORA,),
    "policy.automodel_cfg.lora_cfg.dropout_position": (AM_LORA,),
    "policy.automodel_cfg.lora_cfg.lora_A_init": (AM_LORA,),
    "policy.hf_config_overrides": (AM_LOAD, ENGINE, VLLM_ARGS),
    # ------------------------------------------------------------------ megatron_cfg
    "policy.megatron_cfg.enabled": (LAYOUT,),
    "policy.megatron_cfg.peft.enabled": (MG_LORA,),
    "policy.megatron_cfg.peft.target_modules": (MG_LORA,),
    "policy.megatron_cfg.peft.exclude_modules": (MG_LORA,),
    "policy.megatron_cfg.peft.dim": (MG_LORA,),
    "policy.megatron_cfg.peft.alpha": (MG_LORA,),
    "policy.megatron_cfg.peft.dropout": (MG_LORA,),
    "policy.megatron_cfg.peft.dropout_position": (MG_LORA,),
    "policy.megatron_cfg.peft.lora_A_init_method": (MG_LORA,),
    "policy.megatron_cfg.peft.lora_B_init_method": (MG_LORA,),
    "policy.megatron_cfg.tensor_model_parallel_size": (LAYOUT, MG_PROVIDER),
    "policy.megatron_cfg.pipeline_model_parallel_size": (LAYOUT, MG_PROVIDER),
    "policy.megatron_cfg.expert_model_parallel_size": (LAYOUT, MG_PROVIDER),
    "policy.megatron_cfg.expert_tensor_parallel_size": (LAYOUT, MG_PROVIDER),
    "policy.megatron_cfg.num_layers_in_first_pipeline_stage": (MG_PROVIDER,),
    "policy.megatron_cfg.num_layers_in_last_pipeline_stage": (MG_PROVIDER,),
    "policy.megatron_cfg.pipeline_dtype": (MG_PROVIDER,),
    "policy.megatron_cfg.sequence_parallel": (MG_PROVIDER,),
    "policy.megatron_cfg.activation_checkpointing": (MG_PROVIDER,),
    "policy.megatron_cfg.recompute_granularity": (MG_PROVIDER,),
    "policy.megatron_cfg.recompute_modules": (MG_PROVIDER,),
    "policy.megatron_cfg.fine_grained_activation_offloading": (MG_PROVIDER,),
    "policy.megatron_cfg.offload_modules": (MG_PROVIDER,),
    "policy.megatron_cfg.cuda_graph_impl": (MG_PROVIDER,),
    "policy.megatron_cfg.attention_backend": (MG_PROVIDER,),
    "policy.megatron_cfg.freeze_moe_router": (MG_PROVIDER,),
    "policy.megatron_cfg.moe_router_dtype": (MG_PROVIDER,),
    "policy.megatron_cfg.moe_router_load_balancing_type": (MG_PROVIDER,),
    "policy.megatron_cfg.moe_router_bias_update_rate": (MG_PROVIDER,),
    "policy.megatron_cfg.moe_token_dispatcher_type": (MG_PROVIDER,),
    "policy.megatron_cfg.moe_permute_fusion": (MG_PROVIDER,),
    "policy.megatron_cfg.moe_shared_expert_overlap": (MG_PROVIDER,),
    "policy.megatron_cfg.moe_per_layer_logging": (MG_PROVIDER,),
    "policy.megatron_cfg.moe_grouped_gemm": (MG_PROVIDER,),
    "policy.megatron_cfg.moe_router_enable_expert_bias": (MG_PROVIDER,),
    "policy.megatron_cfg.apply_rope_fusion": (MG_PROVIDER,),
    "policy.megatron_cfg.bias_activation_fusion": (MG_PROVIDER,),
    "policy.megatron_cfg.env_vars": (JOB_ENV,),
    "policy.megatron_cfg.model_overrides": (MG_OVERRIDES,),
    "policy.megatron_cfg.force_reconvert_from_hf": (MG_CONVERT,),
    "policy.megatron_cfg.optimizer.optimizer": (MG_OPTIM,),
    "policy.megatron_cfg.optimizer.lr": (MG_OPTIM, MG_SCHED),
    "policy.megatron_cfg.optimizer.min_lr": (MG_OPTIM, MG_SCHED),
    "policy.megatron_cfg.optimizer.weight_decay": (MG_OPTIM,),
    "policy.megatron_cfg.optimizer.bf16": (MG_OPTIM,),
    "policy.megatron_cfg.optimizer.fp16": (MG_OPTIM,),
    "policy.megatron_cfg.optimizer.params_dtype": (MG_OPTIM,),
    "policy.megatron_cfg.optimizer.adam_beta1": (MG_OPTIM,),
    "policy.megatron_cfg.optimizer.adam_beta2": (MG_OPTIM,),
    "policy.megatron_cfg.optimizer.adam_eps": (MG_OPTIM,),
    "policy.megatron_cfg.optimizer.sgd_momentum": (MG_OPTIM,),
    "policy.megatron_cfg.optimizer.use_distributed_optimizer": (MG_OPTIM, MG_DDP),
    # decided here, then passed to megatron-core's OptimizerConfig (MG_OPTIM)
    "policy.megatron_cfg.optimizer.use_precision_aware_optimizer": (
        "hpcrl.core.backends.megatron.offload:precision_aware_optimizer_on",
    ),
    "policy.megatron_cfg.optimizer.clip_grad": (MG_OPTIM,),
    "policy.megatron_cfg.optimizer.optimizer_cpu_offload": (MG_OPTIM,),
    "policy.megatron_cfg.optimizer.optimizer_offload_fraction": (MG_OPTIM,),
    "policy.megatron_cfg.optimizer.overlap_cpu_optimizer_d2h_h2d": (MG_OPTIM,),
    "policy.megatron_cfg.scheduler.start_weight_decay": (MG_SCHED,),
    "policy.megatron_cfg.scheduler.end_weight_decay": (MG_SCHED,),
    "policy.megatron_cfg.scheduler.weight_decay_incr_style": (MG_SCHED,),
    "policy.megatron_cfg.scheduler.lr_decay_style": (MG_SCHED,),
    "policy.megatron_cfg.scheduler.lr_decay_iters": (MG_SCHED,),
    "policy.megatron_cfg.scheduler.lr_warmup_iters": (MG_SCHED,),
    "policy.megatron_cfg.scheduler.lr_warmup_init": (MG_SCHED,),
    "policy.megatron_cfg.distributed_data_parallel_config.grad_reduce_in_fp32": (MG_DDP,),
    "policy.megatron_cfg.distributed_data_parallel_config.overlap_grad_reduce": (MG_DDP,),
    "policy.megatron_cfg.distributed_data_parallel_config.overlap_param_gather": (MG_DDP,),
    "policy.megatron_cfg.distributed_data_parallel_config.average_in_collective": (MG_DDP,),
    "policy.megatron_cfg.distributed_data_parallel_config.data_parallel_sharding_strategy": (
        MG_DDP,
    ),
    # ------------------------------------------------------------------ data
    "data.max_input_seq_length": (EXPAND,),
    "data.shuffle": (SAMPLER,),
    "data.add_bos": (SFT_EXAMPLE,),
    "data.add_eos": (SFT_EXAMPLE,),
    "data.add_generation_prompt": (SFT_EXAMPLE,),
    # ------------------------------------------------------------------ grpo
    "grpo.num_prompts_per_step": (STEP_ROLLOUTS,),
    "grpo.num_generations_per_prompt": (EXPAND, TRAIN_BATCH),
    "grpo.max_num_steps": (STEPS,),
    "grpo.max_num_epochs": (STEPS,),
    "grpo.normalize_rewards": (ESTIMATOR_FLAGS,),
    "grpo.use_leave_one_out_baseline": (ESTIMATOR_FLAGS,),
    "grpo.adv_estimator.name": (ADVANTAGES,),
    "grpo.adv_estimator.normalize_rewards": (ESTIMATOR_FLAGS,),
    "grpo.adv_estimator.use_leave_one_out_baseline": (ESTIMATOR_FLAGS,),
    "grpo.adv_estimator.minus_baseline": (ADVANTAGES,),
    "grpo.advantage_clip_low": (ADVANTAGES,),
    "grpo.advantage_clip_high": (ADVANTAGES,),
    "grpo.seq_logprob_error_threshold": (FINISH_BATCH,),
    "grpo.overlong_filtering": (TRAIN_BATCH,),
    "grpo.val_period": (RUN_STEPS,),
    "grpo.val_at_start": (RUN_STEPS,),
    "grpo.val_at_end": (RUN_STEPS,),
    "grpo.seed": (SAMPLE, SAMPLER),
    "grpo.async_grpo.enabled": ("hpcrl.core.driver:_make_step_fn",),
    "grpo.async_grpo.max_trajectory_age_steps": (
        "hpcrl.core.algorithms.async_grpo:AsyncGrpoStep.__init__",
    ),
    "grpo.async_grpo.in_flight_weight_updates": (
        "hpcrl.core.algorithms.async_grpo:AsyncGrpoStep.__init__",
    ),
    "grpo.async_grpo.recompute_kv_cache_after_weight_updates": (
        "hpcrl.core.algorithms.async_grpo:AsyncGrpoStep.__init__",
    ),
    # NeMo RL's async_rl, read onto the same loop (hpcrl.config.recipe_async_rl)
    "async_rl.sampler.max_lookahead_versions": (
        "hpcrl.core.driver:_make_step_fn",
        "hpcrl.core.algorithms.async_grpo:AsyncGrpoStep.__init__",
    ),
    "async_rl.recompute_kv_cache_after_weight_updates": (
        "hpcrl.core.algorithms.async_grpo:AsyncGrpoStep.__init__",
    ),
    "grpo.use_dynamic_sampling": (STEP_ROLLOUTS,),
    "grpo.dynamic_sampling_max_gen_batches": (STEP_ROLLOUTS,),
    "grpo.batch_multiplier": (STEP_ROLLOUTS,),
    "grpo.reward_shaping.enabled": (SHAPE,),
    "grpo.reward_shaping.overlong_buffer_length": (SHAPE,),
    "grpo.reward_shaping.overlong_buffer_penalty": (SHAPE,),
    "grpo.reward_shaping.max_response_length": (SHAPE,),
    "grpo.reward_shaping.stop_properly_penalty_coef": (SHAPE_REWARDS,),
    "grpo.reward_scaling.enabled": (SCALE,),
    "grpo.reward_scaling.source_min": (SCALE,),
    "grpo.reward_scaling.source_max": (SCALE,),
    "grpo.reward_scaling.target_min": (SCALE,),
    "grpo.reward_scaling.target_max": (SCALE,),
    "grpo.max_val_samples": (VAL_ROWS,),
    # ------------------------------------------------------------------ sft
    "sft.max_num_steps": (STEPS,),
    "sft.max_num_epochs": (STEPS,),
    "sft.val_period": (RUN_STEPS,),
    "sft.val_at_start": (RUN_STEPS,),
    "sft.val_at_end": (RUN_STEPS,),
    "sft.val_batches": (VAL_ROWS,),
    "sft.val_global_batch_size": (VAL_ROWS,),
    "sft.seed": (SAMPLER,),
    # ------------------------------------------------------------------ loss_fn
    "loss_fn.reference_policy_kl_penalty": (LOSS,),
    "loss_fn.reference_policy_kl_type": (KL,),
    "loss_fn.kl_input_clamp_value": (KL,),
    "loss_fn.kl_output_clamp_value": (KL,),
    "loss_fn.ratio_clip_min": (LOSS,),
    "loss_fn.ratio_clip_max": (LOSS,),
    "loss_fn.ratio_clip_c": (LOSS,),
    "loss_fn.use_on_policy_kl_approximation": (KL,),
    "loss_fn.use_importance_sampling_correction": (LOSS,),
    "loss_fn.truncated_importance_sampling_type": (IS_WEIGHTS,),
    "loss_fn.truncated_importance_sampling_ratio": (IS_WEIGHTS,),
    "loss_fn.truncated_importance_sampling_ratio_min": (IS_WEIGHTS,),
    "loss_fn.token_level_loss": (LOSS,),
    "loss_fn.force_on_policy_ratio": (LOSS,),
    "loss_fn.use_cispo": (LOSS,),
    "loss_fn.sequence_level_importance_ratios": (LOSS,),
    # ------------------------------------------------------------------ env
    "env.math.math_verify_impl": (ENV,),
    # ------------------------------------------------------------------ checkpointing
    "checkpointing.enabled": (STORE,),
    "checkpointing.checkpoint_dir": (STORE,),
    "checkpointing.save_period": (STORE,),
    "checkpointing.keep_top_k": (STORE,),
    "checkpointing.metric_name": (STORE,),
    "checkpointing.higher_is_better": (STORE,),
    "checkpointing.save_consolidated": (STORE,),
    "checkpointing.checkpoint_must_save_by": (RUN_STEPS,),
    # ------------------------------------------------------------------ logger
    "logger.log_dir": (LOGGERS,),
    "logger.wandb_enabled": (LOGGERS,),
    "logger.tensorboard_enabled": (LOGGERS,),
    "logger.mlflow_enabled": (LOGGERS,),
    "logger.monitor_gpus": (LOGGERS,),
    "logger.wandb.project": ("hpcrl.core.loggers.wandb:WandbLogger._init",),
    "logger.wandb.name": ("hpcrl.core.loggers.wandb:WandbLogger._init",),
    "logger.wandb.entity": ("hpcrl.core.loggers.wandb:WandbLogger._init",),
    "logger.tensorboard.log_dir": ("hpcrl.core.loggers.tensorboard:TensorboardLogger.__init__",),
    "logger.mlflow.experiment_name": ("hpcrl.core.loggers.mlflow:MlflowLogger.__init__",),
    "logger.mlflow.run_name": ("hpcrl.core.loggers.mlflow:MlflowLogger.__init__",),
    "logger.mlflow.tracking_uri": ("hpcrl.core.loggers.mlflow:tracking_uri",),
    "logger.gpu_monitoring.collection_interval": (LOGGERS,),
    "logger.gpu_monitoring.flush_interval": (LOGGERS,),
    # ------------------------------------------------------------------ cluster
    "cluster.num_nodes": (PLAN,),
    "cluster.gpus_per_node": (PLAN,),
}

#: NeMo RL's data-set keys, the same in data.train, data.validation and data.default (and
#: the older flat data.*): consumed where the named set is loaded
_DATASET_SITES: dict[str, tuple[str, ...]] = {
    "dataset_name": (NAMED_SET,),
    "data_path": (LOCAL,),
    "split": (SPLIT,),
    "split_validation_size": (CARVE,),
    "seed": (DATA_SEED,),
    "input_key": (FIELDS,),
    "output_key": (FIELDS,),
    "prompt_file": (MATH_PROMPT,),
    "system_prompt_file": (MATH_PROMPT,),
    "processor": (MATH_PROMPT,),
    "repeat": (NAMED,),
}
for _section in ("data.train", "data.validation", "data.default"):
    for _key, _sites in _DATASET_SITES.items():
        CONSUMED_BY[f"{_section}.{_key}"] = _sites
for _key in ("dataset_name", "prompt_file", "system_prompt_file", "split", "seed", "output_key"):
    CONSUMED_BY[f"data.{_key}"] = _DATASET_SITES[_key]


@attrs.frozen
class NotConsumed:
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
    "grpo.val_batch_size": NotConsumed(
        "inert",
        "how many validation prompts NeMo RL generates per call; hpcrl samples every "
        "validation prompt in one call, each row with its own seed: the batch size does not "
        "change what is sampled",
    ),
    "async_rl.sampler.name": NotConsumed(
        "off_only",
        "hpcrl's asynchronous GRPO is NeMo RL's in_order sampler (each step trains on its own "
        "whole batch, generated at most max_lookahead_versions steps earlier); the samplers "
        "that pick finished groups out of order are not supported yet",
        off="in_order",
        rule="hpcrl.config.async_rl_rules:rule_async_rl_sampler",
    ),
    "async_rl.sampler.max_staleness_versions": NotConsumed(
        "inert",
        "the staleness window of the windowed, weight_fifo and ready_first samplers, which "
        "async_rl.sampler.name refuses; in_order reads max_lookahead_versions",
    ),
    "async_rl.min_groups_for_streaming_train": NotConsumed(
        "off_only",
        "streaming a step's prompt groups into training as they finish is not supported yet: "
        "hpcrl trains a step on its whole batch",
        off="${grpo.num_prompts_per_step}",
        rule="hpcrl.config.async_rl_rules:rule_async_rl_streaming",
    ),
    "async_rl.max_inflight_prompts": NotConsumed(
        "inert",
        "how many of NeMo RL's per-prompt rollouts run at once; hpcrl submits a step's whole "
        "batch to the engines, which batch it themselves: how fast, not which weights (the "
        "lookahead bounds those either way) nor what is sampled",
    ),
    "async_rl.max_buffered_rollouts": NotConsumed(
        "inert",
        "room for finished groups in NeMo RL's buffer (backpressure); hpcrl holds the "
        "lookahead's batches and no more. Too small to hold them is refused "
        "(hpcrl.config.async_rl_rules), as NeMo RL refuses it",
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
    "policy.automodel_cfg.context_parallel_size": NotConsumed(
        "off_only",
        "the Automodel backend has no context parallelism",
        off="1",
        rule="hpcrl.config.rules:rule_automodel_context_parallel",
    ),
    "policy.automodel_cfg.sequence_parallel": NotConsumed(
        "off_only",
        "sequence parallelism is not supported by the Automodel backend yet (accepted with "
        "tensor_parallel_size 1, where it has nothing to split: a warning)",
        off="false",
        rule="hpcrl.config.rules:rule_automodel_sequence_parallel",
    ),
    "policy.megatron_cfg.context_parallel_size": NotConsumed(
        "off_only",
        "context parallelism is not supported by the Megatron backend yet (sequences are not "
        "split across CP ranks)",
        off="1",
        rule="hpcrl.config.megatron_rules:rule_context_parallel",
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
    "data.train.env_name": NotConsumed(
        "off_only",
        "hpcrl has NeMo RL's math environment only",
        off="math",
        rule="hpcrl.config.datasets:rule_named_sets",
    ),
    "data.validation.env_name": NotConsumed(
        "off_only",
        "hpcrl has NeMo RL's math environment only",
        off="math",
        rule="hpcrl.config.datasets:rule_named_sets",
    ),
    "data.default.env_name": NotConsumed(
        "off_only",
        "hpcrl has NeMo RL's math environment only",
        off="math",
        rule="hpcrl.config.datasets:rule_named_sets",
    ),
}
