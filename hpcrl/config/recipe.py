"""The recipe schema: what to train. Key names follow NeMo RL's so its users feel at home.

Every class is frozen and keyword-only; the converter in ``hpcrl.config.converter`` forbids
unknown keys. Cross-field rules live in ``hpcrl.config.rules``, not here: these classes only
say what each field holds (type, default, unit).
"""

from __future__ import annotations

from typing import Any, Literal

import attrs

frozen = attrs.frozen(kw_only=True)

OffloadModule = Literal[
    "attn_norm",
    "qkv_linear",
    "core_attn",
    "attn_proj",
    "mlp_norm",
    "expert_fc1",
    "moe_act",
    "fused_group_mlp",
]


# --------------------------------------------------------------------------- policy.* (shared)
@frozen
class TokenizerCfg:
    """Tokenizer to load; a local path or hub name (defaults to the model's)."""

    name: str | None = None
    chat_template: str | None = None


@frozen
class OptimizerCfg:
    """Optimizer of the Automodel backend (``policy.optimizer``)."""

    name: Literal["adamw", "adam", "sgd"] = "adamw"
    lr: float = 1e-5
    weight_decay: float = 0.0
    betas: tuple[float, float] = (0.9, 0.999)
    eps: float = 1e-8
    momentum: float = 0.0  # sgd only


@frozen
class SchedulerCfg:
    """LR schedule of the Automodel backend (``policy.scheduler``), stepped per optimizer step."""

    name: Literal["constant", "linear", "cosine"] = "constant"
    warmup_steps: int = 0
    min_lr_ratio: float = 0.0
    total_steps: int | None = None  # None: the algorithm's max_num_steps


@frozen
class VllmCfg:
    """Settings of the vLLM generation backend (``policy.generation.vllm_cfg``)."""

    precision: Literal["float32", "bfloat16", "float16"] = "bfloat16"
    tensor_parallel_size: int = 1
    pipeline_parallel_size: int = 1
    gpu_memory_utilization: float = 0.6
    max_model_len: int | None = None
    enforce_eager: bool = False
    kv_cache_memory_mb: int | None = None  # CPU engines: bound the KV cache explicitly


@frozen
class GenerationResourcesCfg:
    """Where non-colocated generation workers run."""

    num_nodes: int | None = None
    gpus_per_node: int | None = None


@frozen
class ColocatedCfg:
    """Colocated: generation shares the training workers; otherwise it gets its own."""

    enabled: bool = True
    resources: GenerationResourcesCfg = attrs.field(factory=GenerationResourcesCfg)


@frozen
class GenerationCfg:
    """How rollouts are sampled (``policy.generation``)."""

    backend: Literal["torch", "vllm"] = "torch"
    max_new_tokens: int = 64
    temperature: float = 1.0
    top_p: float = 1.0
    top_k: int | None = None
    stop_token_ids: tuple[int, ...] = ()
    stop_strings: tuple[str, ...] = ()
    colocated: ColocatedCfg = attrs.field(factory=ColocatedCfg)
    vllm_cfg: VllmCfg = attrs.field(factory=VllmCfg)


# --------------------------------------------------------------------------- automodel_cfg
@frozen
class AutomodelCfg:
    """Automodel backend: HF model + FSDP2 / HSDP / TP (``policy.automodel_cfg``).

    dp_shard is derived: world_size / (dp_replicate_size * tensor_parallel_size * context_parallel_size).
    """

    enabled: bool = False
    dp_replicate_size: int = 1  # > 1: HSDP, shard inside a node, replicate across nodes
    tensor_parallel_size: int = 1
    context_parallel_size: int = 1
    sequence_parallel: bool = False
    activation_checkpointing: bool = False
    cpu_offload: bool = False
    torch_compile: bool = True  # GPU only: torch.compile each decoder block


# --------------------------------------------------------------------------- megatron_cfg
@frozen
class MegatronOptimizerCfg:
    """megatron-core OptimizerConfig subset (``policy.megatron_cfg.optimizer``)."""

    optimizer: str = "adam"  # adam | sgd; a str so the rule can report a bad value with its fix
    lr: float = 1e-5
    min_lr: float = 0.0
    weight_decay: float = 0.0
    bf16: bool = False
    fp16: bool = False
    params_dtype: Literal["float32", "bfloat16", "float16"] = "float32"
    adam_beta1: float = 0.9
    adam_beta2: float = 0.999
    adam_eps: float = 1e-8
    sgd_momentum: float = 0.9
    use_distributed_optimizer: bool = True
    use_precision_aware_optimizer: bool = False
    clip_grad: float = 1.0
    optimizer_cpu_offload: bool = False
    optimizer_offload_fraction: float = 0.0
    overlap_cpu_optimizer_d2h_h2d: bool = False


@frozen
class MegatronSchedulerCfg:
    """megatron-core OptimizerParamScheduler settings (``policy.megatron_cfg.scheduler``)."""

    start_weight_decay: float = 0.0
    end_weight_decay: float = 0.0
    weight_decay_incr_style: Literal["constant", "linear", "cosine"] = "constant"
    lr_decay_style: Literal["constant", "linear", "cosine", "inverse-square-root", "WSD"] = (
        "constant"
    )
    lr_decay_iters: int | None = None
    lr_warmup_iters: int = 0
    lr_warmup_init: float = 0.0


@frozen
class DistributedDataParallelCfg:
    """megatron-core DistributedDataParallelConfig subset."""

    grad_reduce_in_fp32: bool = False
    overlap_grad_reduce: bool = False
    overlap_param_gather: bool = False
    average_in_collective: bool = False
    use_custom_fsdp: bool = False
    data_parallel_sharding_strategy: Literal[
        "no_shard", "optim", "optim_grads", "optim_grads_params"
    ] = "no_shard"


@frozen
class MegatronCheckpointCfg:
    """How Megatron checkpoints are read and written (``policy.megatron_cfg.checkpoint``)."""

    save_format: Literal["torch_dist"] = "torch_dist"
    fully_parallel_save: bool = True
    fully_parallel_load: bool = True
    async_save: bool = False
    parallel_read_threads: int = 1  # 1 = PyTorch's own FileSystemReader


@frozen
class MegatronCfg:
    """Megatron backend: megatron-core through megatron-bridge (``policy.megatron_cfg``)."""

    enabled: bool = False
    tensor_model_parallel_size: int = 1
    pipeline_model_parallel_size: int = 1
    context_parallel_size: int = 1
    expert_model_parallel_size: int = 1
    expert_tensor_parallel_size: int = 1
    num_layers_in_first_pipeline_stage: int | None = None
    num_layers_in_last_pipeline_stage: int | None = None
    pipeline_dtype: Literal["float32", "bfloat16", "float16"] | None = None
    sequence_parallel: bool = False
    activation_checkpointing: bool = False
    recompute_granularity: Literal["full", "selective"] | None = None
    recompute_method: Literal["uniform", "block"] | None = None
    recompute_num_layers: int | None = None
    recompute_modules: tuple[str, ...] = ()
    cpu_offloading: bool = False
    cpu_offloading_num_layers: int = 0
    fine_grained_activation_offloading: bool = False
    offload_modules: tuple[str, ...] = ()  # names checked by rules (see OffloadModule)
    cuda_graph_impl: Literal["none", "local", "transformer_engine", "full_iteration"] = "none"
    empty_unused_memory_level: int = 0
    freeze_moe_router: bool = False
    # MoE provider settings, NeMo RL's names; None/False: the provider's own value
    moe_router_dtype: Literal["fp32", "fp64"] | None = None
    moe_router_load_balancing_type: str | None = None
    moe_router_bias_update_rate: float | None = None
    moe_token_dispatcher_type: str | None = None
    moe_permute_fusion: bool = False  # Transformer Engine only (switched off without it)
    moe_shared_expert_overlap: bool = False
    moe_per_layer_logging: bool = False
    apply_rope_fusion: bool = False
    bias_activation_fusion: bool = False
    env_vars: dict[str, str] = attrs.field(factory=dict)
    model_overrides: dict[str, Any] = attrs.field(factory=dict)  # provider fields; checked in-job
    force_reconvert_from_hf: bool = False
    manual_gc: bool = False
    manual_gc_interval: Any = 0  # Any: the rule rejects bools and non-ints with a clear message
    checkpoint: MegatronCheckpointCfg = attrs.field(factory=MegatronCheckpointCfg)
    optimizer: MegatronOptimizerCfg = attrs.field(factory=MegatronOptimizerCfg)
    scheduler: MegatronSchedulerCfg = attrs.field(factory=MegatronSchedulerCfg)
    distributed_data_parallel_config: DistributedDataParallelCfg = attrs.field(
        factory=DistributedDataParallelCfg
    )


@frozen
class PolicyCfg:
    """The model being trained (``policy``)."""

    model_name: str
    tokenizer: TokenizerCfg = attrs.field(factory=TokenizerCfg)
    train_global_batch_size: int = 8
    train_micro_batch_size: int = 1
    logprob_batch_size: int | None = None  # None: train_micro_batch_size
    max_total_sequence_length: int = 512
    precision: Literal["float32", "bfloat16", "float16"] = "bfloat16"
    max_grad_norm: float | None = 1.0
    optimizer: OptimizerCfg = attrs.field(factory=OptimizerCfg)
    scheduler: SchedulerCfg = attrs.field(factory=SchedulerCfg)
    generation: GenerationCfg = attrs.field(factory=GenerationCfg)
    automodel_cfg: AutomodelCfg = attrs.field(factory=AutomodelCfg)
    megatron_cfg: MegatronCfg = attrs.field(factory=MegatronCfg)


# --------------------------------------------------------------------------- algorithms
@frozen
class AsyncGrpoCfg:
    """Overlap generation of the next batch with training on the current one."""

    enabled: bool = False
    max_trajectory_age_steps: int = 1


@frozen
class GrpoCfg:
    """GRPO settings (``grpo``)."""

    num_prompts_per_step: int = 8
    num_generations_per_prompt: int = 4
    max_num_steps: int = 100
    max_num_epochs: int = 1
    normalize_rewards: bool = True
    use_leave_one_out_baseline: bool = True  # NeMo RL's default (its advantage estimator's)
    overlong_filtering: bool = False  # truncated responses (no stop) are left out of the loss
    val_period: int = 0  # 0: no validation
    val_at_start: bool = False
    seed: int = 42
    async_grpo: AsyncGrpoCfg = attrs.field(factory=AsyncGrpoCfg)


@frozen
class SftCfg:
    """SFT settings (``sft``)."""

    max_num_steps: int = 100
    max_num_epochs: int = 1
    val_period: int = 0
    val_at_start: bool = False
    # validation on the first val_batches x val_global_batch_size examples (None: all)
    val_batches: int | None = None
    val_global_batch_size: int | None = None
    seed: int = 42


@frozen
class LossFnCfg:
    """Policy-gradient loss (``loss_fn``); SFT ignores it. Names, meanings and defaults are
    NeMo RL's (ClippedPGLossConfig); docs/algorithms.md gives every formula."""

    reference_policy_kl_penalty: float = 0.01  # 0: no KL term, no reference log-probs
    reference_policy_kl_type: Literal["k1", "k2", "k3"] = "k3"
    kl_input_clamp_value: float | None = 20.0  # |ref − logp| clamp; None: off
    kl_output_clamp_value: float | None = 10.0  # |per-token KL| clamp; None: off
    ratio_clip_min: float = 0.2
    ratio_clip_max: float = 0.2
    ratio_clip_c: float | None = None  # dual-clip, > 1; None: off
    use_on_policy_kl_approximation: bool = False
    use_importance_sampling_correction: bool = False
    truncated_importance_sampling_type: Literal["tis", "icepop", "seq-mask-tis"] | None = None
    truncated_importance_sampling_ratio: float | None = None  # upper bound of the weights
    truncated_importance_sampling_ratio_min: float | None = None  # lower bound
    sequence_level_importance_ratios: bool = False  # GSPO; only false is supported
    token_level_loss: bool = True


@frozen
class DataCfg:
    """Local JSONL data (``data``). Relative paths resolve against the recipe's folder."""

    train_path: str
    val_path: str | None = None
    prompt_key: str = "prompt"
    response_key: str = "response"  # SFT targets
    answer_key: str = "answer"  # environment ground truth
    max_input_seq_length: int | None = None
    shuffle: bool = True
    num_workers: int = 0


@frozen
class EnvCfg:
    """Reward environment (``env``)."""

    name: Literal["math", "toy_count"] = "math"
    kwargs: dict[str, Any] = attrs.field(factory=dict)


@frozen
class CheckpointingCfg:
    """Training checkpoints (``checkpointing``). checkpoint_dir None: <run folder>/checkpoints."""

    enabled: bool = False
    checkpoint_dir: str | None = None
    save_period: int = 10
    keep_top_k: int | None = None
    # keep the keep_top_k best by this step metric (NeMo RL's names: val_reward, val:val_loss,
    # train:loss) and the newest; None: the newest keep_top_k
    metric_name: str | None = None
    higher_is_better: bool = True


@frozen
class WandbCfg:
    """Weights & Biases (``logger.wandb``). Offline (files under the log folder) unless the job
    has WANDB_API_KEY or sets WANDB_MODE; the files can be synced later with ``wandb sync``."""

    project: str = "hpcrl"
    name: str | None = None  # None: the run folder's name
    entity: str | None = None


@frozen
class TensorboardCfg:
    """TensorBoard event files (``logger.tensorboard``). log_dir None: <log_dir>/tensorboard;
    relative: below logger.log_dir."""

    log_dir: str | None = None


@frozen
class MlflowCfg:
    """MLflow (``logger.mlflow``). tracking_uri None: a file store in <log_dir>/mlruns."""

    experiment_name: str = "hpcrl"
    run_name: str | None = None  # None: the run folder's name
    tracking_uri: str | None = None


@frozen
class GpuMonitoringCfg:
    """GPU utilisation and memory of every node, sampled while the job trains."""

    collection_interval: float = 10.0  # seconds between samples
    flush_interval: float = 10.0  # seconds between writes to the loggers


@frozen
class LoggerCfg:
    """Where metrics go besides <run folder>/metrics.jsonl (``logger``), with NeMo RL's keys.

    log_dir: where the loggers write; relative paths are below the run folder. The loggers
    run in the driver on node 0 and need their package in the job's Python (hpcrl[loggers]).
    """

    log_dir: str = "logs"
    wandb_enabled: bool = False
    tensorboard_enabled: bool = False
    mlflow_enabled: bool = False
    monitor_gpus: bool = False
    wandb: WandbCfg = attrs.field(factory=WandbCfg)
    tensorboard: TensorboardCfg = attrs.field(factory=TensorboardCfg)
    mlflow: MlflowCfg = attrs.field(factory=MlflowCfg)
    gpu_monitoring: GpuMonitoringCfg = attrs.field(factory=GpuMonitoringCfg)


@frozen
class ClusterCfg:
    """The allocation the recipe is written for (``cluster``).

    On CPU profiles gpus_per_node counts worker slots (one training worker per slot).
    """

    num_nodes: int = 1
    gpus_per_node: int = 8


@frozen
class ValueCfg:
    """PPO value model (``value``); only its megatron_cfg manual-GC keys matter today."""

    model_name: str | None = None
    megatron_cfg: MegatronCfg = attrs.field(factory=MegatronCfg)


@frozen
class TeacherCfg:
    """Distillation teacher (``teacher``). Overrides apply on top of policy.megatron_cfg."""

    model_name: str | None = None
    megatron_cfg_overrides: dict[str, Any] = attrs.field(factory=dict)


@frozen
class Recipe:
    """A whole recipe after `defaults:` merging and overrides."""

    policy: PolicyCfg
    data: DataCfg
    grpo: GrpoCfg | None = None
    sft: SftCfg | None = None
    loss_fn: LossFnCfg = attrs.field(factory=LossFnCfg)
    env: EnvCfg = attrs.field(factory=EnvCfg)
    checkpointing: CheckpointingCfg = attrs.field(factory=CheckpointingCfg)
    logger: LoggerCfg = attrs.field(factory=LoggerCfg)
    cluster: ClusterCfg = attrs.field(factory=ClusterCfg)
    value: ValueCfg | None = None
    teacher: TeacherCfg | None = None

    @property
    def algorithm(self) -> str:
        """'grpo' or 'sft' (the rules guarantee exactly one section is set)."""
        return "grpo" if self.grpo is not None else "sft"

    @property
    def backend(self) -> str:
        """'megatron' or 'automodel' (the rules guarantee exactly one is enabled)."""
        return "megatron" if self.policy.megatron_cfg.enabled else "automodel"
