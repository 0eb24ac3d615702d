"""Where each recipe field NeMo RL also has takes effect: the code sites that read its value
and act on it (``CONSUMED_BY``; the policy section's in
``hpcrl.config.consumers_policy``), or why none does (``hpcrl.config.not_consumed``).

This is what ``docs/nemo-rl-compat.md`` (``hpcrl.config.compat``) calls "implemented": a
field is implemented only through the sites listed here, never for being a schema field.
Two tests hold the declarations to the code: ``tests/config/test_compat.py`` (every
NeMo RL field of the schema is declared, every site exists and reads the field) and
``tests/core/test_consumers_downstream.py`` (each implemented key, set to a value other
than its default, changes what its sites build: the JobSpec and script, the engine's
arguments, the batch plan, the loss, a GRPO/SFT step, the optimizer, the model provider).

A site is ``module:qualified.name`` (``hpcrl.config.consumer_sites``); text only, so this
module imports nothing heavy.
"""

from __future__ import annotations

from hpcrl.config.consumer_sites import (
    ADVANTAGES,
    CAP,
    CARVE,
    DATA_SEED,
    ENV,
    ENV_NAME,
    ESTIMATOR_FLAGS,
    EXPAND,
    FIELDS,
    FINISH_BATCH,
    IS_WEIGHTS,
    KL,
    LOCAL,
    LOGGERS,
    LOSS,
    MATH_PROMPT,
    NAMED,
    NAMED_SET,
    NODE_SPLIT,
    PLAN,
    RM_KWARGS,
    RUN_STEPS,
    SAMPLE,
    SAMPLER,
    SCALE,
    SFT_EXAMPLE,
    SHAPE,
    SHAPE_REWARDS,
    SPLIT,
    STEP_ROLLOUTS,
    STEPS,
    STORE,
    TRAIN_BATCH,
    VAL_ROWS,
)
from hpcrl.config.consumers_policy import POLICY_CONSUMED_BY

#: NeMo RL's windowed and ready_first samplers (async_rl.sampler.name) read onto hpcrl
GROUPED = "hpcrl.core.algorithms.async_grpo_groups:GroupedAsyncGrpoStep.__init__"

#: schema path (hpcrl's spelling) -> the sites that read its value and act on it
CONSUMED_BY: dict[str, tuple[str, ...]] = {
    **POLICY_CONSUMED_BY,
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
    "grpo.adv_estimator.reward_weights": (ADVANTAGES,),
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
    # NeMo RL's windowed and ready_first samplers: the grouped loop
    "async_rl.sampler.name": ("hpcrl.core.driver:_make_step_fn", GROUPED),
    "async_rl.sampler.max_staleness_versions": (GROUPED,),
    "async_rl.min_groups_for_streaming_train": (GROUPED,),
    "async_rl.max_inflight_prompts": (GROUPED,),
    "async_rl.max_buffered_rollouts": (GROUPED,),
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
    # the environment the data sets name: math, math_multi_reward or reward_model (whose
    # GPUs the node split carves out)
    "data.train.env_name": (ENV_NAME, NODE_SPLIT),
    "data.validation.env_name": (ENV_NAME, NODE_SPLIT),
    "data.default.env_name": (ENV_NAME, NODE_SPLIT),
    "data.env_name": (ENV_NAME, NODE_SPLIT),
    "env.reward_model.model_name": (RM_KWARGS,),
    "env.reward_model.tokenizer.name": (RM_KWARGS,),
    "env.reward_model.precision": (RM_KWARGS,),
    "env.reward_model.batch_size": (RM_KWARGS,),
    "env.reward_model.max_model_len": (RM_KWARGS,),
    "env.reward_model.resources.gpus_per_node": (NODE_SPLIT,),
    "env.reward_model.resources.num_nodes": (NODE_SPLIT,),
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
    "max_samples": (CAP,),
}
for _section in ("data.train", "data.validation", "data.default"):
    for _key, _sites in _DATASET_SITES.items():
        CONSUMED_BY[f"{_section}.{_key}"] = _sites
for _key in ("dataset_name", "prompt_file", "system_prompt_file", "split", "seed", "output_key"):
    CONSUMED_BY[f"data.{_key}"] = _DATASET_SITES[_key]
