"""The recipe schema: what to train. Key names follow NeMo RL's so its users feel at home.

Every class is frozen and keyword-only; the converter in ``hpcrl.config.converter`` forbids
unknown keys. Cross-field rules live in ``hpcrl.config.rules``, not here: these classes only
say what each field holds (type, default, unit).
"""

from __future__ import annotations

from typing import Any, ClassVar, Literal

import attrs

from hpcrl.config.recipe_megatron import (  # noqa: F401  (re-exported: one schema, two files)
    DistributedDataParallelCfg,
    MegatronCfg,
    MegatronCheckpointCfg,
    MegatronOptimizerCfg,
    MegatronSchedulerCfg,
    OffloadModule,
)


# --------------------------------------------------------------------------- policy.* (shared)
@attrs.frozen(kw_only=True)
class TokenizerCfg:
    """Tokenizer to load; a local path or hub name (defaults to the model's)."""

    name: str | None = None
    chat_template: str | None = None
    # more arguments of every apply_chat_template call (NeMo RL's; e.g. enable_thinking)
    chat_template_kwargs: dict[str, Any] = attrs.field(factory=dict)


@attrs.frozen(kw_only=True)
class OptimizerCfg:
    """``policy.optimizer`` of the Automodel backend, as NeMo RL writes it: a torch optimizer
    class path and its keyword arguments (``hpcrl.config.optimizers`` lists the classes and
    arguments accepted; the rules check them)."""

    name: str = "torch.optim.AdamW"
    kwargs: dict[str, Any] = attrs.field(factory=lambda: {"lr": 1.0e-5})

    # Read-only views with torch's defaults, for rules, metrics and tests.
    @property
    def lr(self) -> float:
        return float(self.kwargs.get("lr", 1.0e-3))

    @property
    def weight_decay(self) -> float:
        default = 0.01 if self.name.endswith("AdamW") else 0.0
        return float(self.kwargs.get("weight_decay", default))

    @property
    def betas(self) -> tuple[float, ...]:
        return tuple(self.kwargs.get("betas", (0.9, 0.999)))

    @property
    def eps(self) -> float:
        return float(self.kwargs.get("eps", 1.0e-8))

    @property
    def momentum(self) -> float:
        return float(self.kwargs.get("momentum", 0.0))


@attrs.frozen(kw_only=True)
class LrSchedulerCfg:
    """One entry of NeMo RL's ``policy.scheduler`` list: a torch LR scheduler class path and
    its kwargs, or (one entry, when there are several schedulers) the ``milestones`` at which
    ``SequentialLR`` hands over from one to the next. A single mapping means a one-entry list."""

    ACCEPTS_SINGLE_MAPPING: ClassVar[bool] = (
        True  # read by the converter: `scheduler: {name: ...}` is a list of one
    )

    name: str | None = None
    kwargs: dict[str, Any] = attrs.field(factory=dict)
    milestones: tuple[int, ...] | None = None


@attrs.frozen(kw_only=True)
class VllmCfg:
    """Settings of the vLLM generation backend (``policy.generation.vllm_cfg``)."""

    precision: Literal["float32", "bfloat16", "float16"] = "bfloat16"
    tensor_parallel_size: int = 1
    pipeline_parallel_size: int = 1
    gpu_memory_utilization: float = 0.6
    max_model_len: int | None = None
    enforce_eager: bool = False
    kv_cache_memory_mb: int | None = None  # CPU engines: bound the KV cache explicitly
    enable_prefix_caching: bool | None = None  # None: vLLM's own default
    # set in each vLLM engine's environment before it starts (NeMo RL: its vLLM workers')
    env_vars: dict[str, str] = attrs.field(factory=dict)


@attrs.frozen(kw_only=True)
class GenerationResourcesCfg:
    """Where non-colocated generation workers run."""

    num_nodes: int | None = None
    gpus_per_node: int | None = None


@attrs.frozen(kw_only=True)
class ColocatedCfg:
    """Colocated: generation shares the training workers; otherwise it gets its own."""

    enabled: bool = True
    resources: GenerationResourcesCfg = attrs.field(factory=GenerationResourcesCfg)


@attrs.frozen(kw_only=True)
class GenerationCfg:
    """How rollouts are sampled (``policy.generation``)."""

    backend: Literal["torch", "vllm"] = "torch"
    max_new_tokens: int = 64
    temperature: float = 1.0
    top_p: float = 1.0
    top_k: int | None = None
    # Validation samples (as in NeMo RL, never greedily) at these; None: temperature, top_p
    # (NeMo RL writes ${.temperature} and ${.top_p}; its val_top_k is left to its key registry,
    # which accepts only ${.top_k}, as NeMo RL honours no other value).
    val_temperature: float | None = None
    val_top_p: float | None = None
    stop_token_ids: tuple[int, ...] = ()
    stop_strings: tuple[str, ...] = ()
    colocated: ColocatedCfg = attrs.field(factory=ColocatedCfg)
    vllm_cfg: VllmCfg = attrs.field(factory=VllmCfg)
    # more vllm.LLM keyword arguments, as NeMo RL passes them (rules refuse hpcrl's own)
    vllm_kwargs: dict[str, Any] = attrs.field(factory=dict)


# --------------------------------------------------------------------------- micro-batching
@attrs.frozen(kw_only=True)
class DynamicBatchingCfg:
    """NeMo RL's ``policy.dynamic_batching``: micro-batches of similar-length rows within a
    token budget, each cut to its longest row (``hpcrl.core.workers.micro_batches``)."""

    enabled: bool = False
    train_mb_tokens: int | None = None  # None: policy.max_total_sequence_length
    logprob_mb_tokens: int | None = None
    sequence_length_round: int = 64


@attrs.frozen(kw_only=True)
class SequencePackingCfg:
    """NeMo RL's ``policy.sequence_packing``: rows bin-packed into one long row per
    micro-batch, attention and positions restarting at each sequence."""

    enabled: bool = False
    train_mb_tokens: int | None = None  # None: policy.max_total_sequence_length
    logprob_mb_tokens: int | None = None
    # a str: read only while enabled (NeMo RL's configs carry a value it never reads when
    # packing is off); hpcrl.config.batching_rules checks it against PACKING_ALGORITHMS
    algorithm: str = "modified_first_fit_decreasing"
    sequence_length_round: int = 64


# --------------------------------------------------------------------------- automodel_cfg
@attrs.frozen(kw_only=True)
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
    # exported in job.sbatch for an Automodel job (NeMo RL: dtensor_cfg.env_vars, on its
    # policy workers), as megatron_cfg.env_vars is for a Megatron one
    env_vars: dict[str, str] = attrs.field(factory=dict)


@attrs.frozen(kw_only=True)
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
    # None: NeMo RL's Megatron configs write `optimizer: null` (megatron_cfg.optimizer applies)
    optimizer: OptimizerCfg | None = attrs.field(factory=OptimizerCfg)
    # None or empty: a constant learning rate. Stepped once per optimizer step.
    scheduler: tuple[LrSchedulerCfg, ...] | None = None
    generation: GenerationCfg = attrs.field(factory=GenerationCfg)
    dynamic_batching: DynamicBatchingCfg = attrs.field(factory=DynamicBatchingCfg)
    sequence_packing: SequencePackingCfg = attrs.field(factory=SequencePackingCfg)
    make_sequence_length_divisible_by: int | None = 1  # None: 1
    automodel_cfg: AutomodelCfg = attrs.field(factory=AutomodelCfg)
    megatron_cfg: MegatronCfg = attrs.field(factory=MegatronCfg)
    # changes to the model's Hugging Face config (hpcrl.core.models.hf_config), for training
    # and sampling alike; a nested mapping changes the sub-config it names
    hf_config_overrides: dict[str, Any] = attrs.field(factory=dict)


# --------------------------------------------------------------------------- algorithms
@attrs.frozen(kw_only=True)
class AsyncGrpoCfg:
    """Overlap generation of the next batch with training on the current one."""

    enabled: bool = False
    max_trajectory_age_steps: int = 1
    # Refit the engines right after each training step, at the next decode step of the
    # generations in flight, instead of behind them (hpcrl.core.generation.in_flight).
    in_flight_weight_updates: bool = False
    # With in-flight refits: the requests in flight recompute their KV caches with the new
    # weights (else they attend to what the old weights cached).
    recompute_kv_cache_after_weight_updates: bool = False


@attrs.frozen(kw_only=True)
class RewardShapingCfg:
    """``grpo.reward_shaping``, applied after ``reward_scaling``: DAPO's overlong penalty (a
    response longer than max_response_length − overlong_buffer_length loses
    overlong_buffer_penalty per buffer length beyond it, without a floor), or with
    stop_properly_penalty_coef set, truncated responses' rewards times that coefficient."""

    enabled: bool = False
    overlong_buffer_length: int | None = 128  # None only with stop_properly_penalty_coef
    overlong_buffer_penalty: float | None = 1.0  # >= 0; None only with the coefficient
    max_response_length: int | None = None  # None: policy.generation.max_new_tokens
    stop_properly_penalty_coef: float | None = None  # in [0, 1]; None: DAPO's penalty


@attrs.frozen(kw_only=True)
class RewardScalingCfg:
    """``grpo.reward_scaling``: rewards clamped to [source_min, source_max] and mapped
    linearly onto [target_min, target_max] before advantages."""

    enabled: bool = False
    source_min: float = 0.0
    source_max: float = 1.0
    target_min: float = 0.0
    target_max: float = 1.0


@attrs.frozen(kw_only=True)
class AdvEstimatorCfg:
    """``grpo.adv_estimator`` (NeMo RL v0.7.0+): which advantage estimator, and its options
    (hpcrl.core.algorithms.advantages). gdpo and opd are refused by the rules."""

    name: str = "grpo"  # grpo or reinforce_plus_plus
    normalize_rewards: bool | None = None  # grpo; None: grpo.normalize_rewards
    use_leave_one_out_baseline: bool | None = None  # grpo; None: grpo.use_leave_one_out_...
    minus_baseline: bool = True  # reinforce_plus_plus: subtract the prompt group's mean


@attrs.frozen(kw_only=True)
class GrpoCfg:
    """GRPO settings (``grpo``)."""

    num_prompts_per_step: int = 8
    num_generations_per_prompt: int = 4
    max_num_steps: int = 100
    max_num_epochs: int = 1
    normalize_rewards: bool = True
    use_leave_one_out_baseline: bool = True  # NeMo RL's default (its advantage estimator's)
    overlong_filtering: bool = False  # truncated responses (no stop) are left out of the loss
    val_period: int = 0  # <= 0: no periodic validation (NeMo RL's -1 and 0)
    val_at_start: bool = False
    val_at_end: bool = False  # also validate after the last step (NeMo RL's meaning)
    seed: int = 42
    # None: off, as NeMo RL reads `async_grpo: null` (its single-controller configs write it)
    async_grpo: AsyncGrpoCfg | None = attrs.field(factory=AsyncGrpoCfg)
    # NeMo RL's options (hpcrl.core.algorithms.reward_terms, dynamic sampling in grpo.py)
    max_rollout_turns: int = 1  # single-turn only; the rules refuse more
    use_dynamic_sampling: bool = False
    dynamic_sampling_max_gen_batches: int = 10
    # prompts per generation batch = int(num_prompts_per_step x this), as in NeMo RL (a float)
    batch_multiplier: float = 1.0
    reward_shaping: RewardShapingCfg = attrs.field(factory=RewardShapingCfg)
    reward_scaling: RewardScalingCfg = attrs.field(factory=RewardScalingCfg)
    adv_estimator: AdvEstimatorCfg = attrs.field(factory=AdvEstimatorCfg)
    advantage_clip_low: float | None = None  # clamp advantages from below; None: off
    advantage_clip_high: float | None = None  # from above; None: off
    # leave sequences whose mean exp|train − sampler log-prob| exceeds this out of the loss
    seq_logprob_error_threshold: float | None = None  # >= 1; None: off (metrics still kept)
    max_val_samples: int | None = None  # None: the whole validation set
    val_batch_size: int | None = None

    @property
    def async_enabled(self) -> bool:
        return self.async_grpo is not None and self.async_grpo.enabled


@attrs.frozen(kw_only=True)
class SftCfg:
    """SFT settings (``sft``)."""

    max_num_steps: int = 100
    max_num_epochs: int = 1
    val_period: int = 0  # <= 0: no periodic validation
    val_at_start: bool = False
    val_at_end: bool = False  # also validate after the last step (NeMo RL's meaning)
    # validation on the first val_batches x val_global_batch_size examples (None: all)
    val_batches: int | None = None
    val_global_batch_size: int | None = None
    seed: int = 42


@attrs.frozen(kw_only=True)
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
    # ratio = exp(logp − logp.detach()) = 1: the old log-probs are the current ones (one
    # optimizer step per rollout batch, which the rules require)
    force_on_policy_ratio: bool = False


@attrs.frozen(kw_only=True)
class DatasetCfg:
    """One of NeMo RL's ``data.train`` / ``data.validation`` / ``data.default`` sections
    (``hpcrl.config.datasets`` lists the names; ``default`` fills what the others leave
    unset). Named sets load through Hugging Face ``datasets`` from ``data_path`` (a local
    folder or file in the hub set's own format) or else the HF cache (jobs run offline)."""

    dataset_name: str | None = None
    data_path: str | None = None
    split: str | None = None
    split_validation_size: float | None = None  # carve validation out of train (0: none)
    seed: int | None = None
    input_key: str | None = None  # ResponseDataset columns
    output_key: str | None = None
    prompt_file: str | None = None  # a template with one {} for the problem
    system_prompt_file: str | None = None
    processor: str | None = None  # math_hf_data_processor | math_data_processor | sft_processor
    env_name: str | None = None
    repeat: int | None = None  # the set's rows this many times over (NeMo RL's AIME: 16)


@attrs.frozen(kw_only=True)
class DataCfg:
    """Training data (``data``): a local JSONL file (``train_path``, hpcrl's own form; relative
    paths resolve against the recipe's folder) or NeMo RL's data sets by name (``train`` /
    ``validation`` / ``default``, or the older flat ``dataset_name`` + ``prompt_file``)."""

    train_path: str | None = None
    val_path: str | None = None
    prompt_key: str = "prompt"
    response_key: str = "response"  # SFT targets
    answer_key: str = "answer"  # environment ground truth
    max_input_seq_length: int | None = None
    shuffle: bool = True
    num_workers: int = 0
    # NeMo RL's named data sets
    train: DatasetCfg | None = None
    validation: DatasetCfg | None = None
    default: DatasetCfg | None = None
    dataset_name: str | None = None  # older NeMo RL configs: one set for train and validation
    prompt_file: str | None = None
    system_prompt_file: str | None = None
    split: str | None = None
    seed: int | None = None
    output_key: str | None = None  # the target column (OpenMathInstruct-2 SFT: generated_solution)
    add_bos: bool = True  # SFT
    add_eos: bool = True
    add_generation_prompt: bool = False


@attrs.frozen(kw_only=True)
class MathEnvCfg:
    """NeMo RL's ``env.math``: how responses are checked against the ground truth."""

    num_workers: int = 1  # accepted: scoring runs in one process (same rewards)
    # hf_math_verify: Hugging Face math-verify (symbolic; needs the math-verify package);
    # hpcrl_numeric: hpcrl's numeric comparison of the last \boxed{} / stated / last number.
    math_verify_impl: Literal["hf_math_verify", "hpcrl_numeric"] = "hf_math_verify"


@attrs.frozen(kw_only=True)
class EnvCfg:
    """Reward environment (``env``)."""

    name: Literal["math", "toy_count"] = "math"
    kwargs: dict[str, Any] = attrs.field(factory=dict)
    math: MathEnvCfg | None = None  # NeMo RL's form; None: hpcrl's numeric check


@attrs.frozen(kw_only=True)
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
    # NeMo RL's key: also write each saved checkpoint's weights as a Hugging Face folder
    # (safetensors, config, tokenizer) in <checkpoint>/hf, which from_pretrained and vLLM load
    save_consolidated: bool = False


@attrs.frozen(kw_only=True)
class WandbCfg:
    """Weights & Biases (``logger.wandb``). Offline (files under the log folder) unless the job
    has WANDB_API_KEY or sets WANDB_MODE; the files can be synced later with ``wandb sync``."""

    project: str = "hpcrl"
    name: str | None = None  # None: the run folder's name
    entity: str | None = None


@attrs.frozen(kw_only=True)
class TensorboardCfg:
    """TensorBoard event files (``logger.tensorboard``). log_dir None: <log_dir>/tensorboard;
    relative: below logger.log_dir."""

    log_dir: str | None = None


@attrs.frozen(kw_only=True)
class MlflowCfg:
    """MLflow (``logger.mlflow``). tracking_uri None: a file store in <log_dir>/mlruns."""

    experiment_name: str = "hpcrl"
    run_name: str | None = None  # None: the run folder's name
    tracking_uri: str | None = None


@attrs.frozen(kw_only=True)
class GpuMonitoringCfg:
    """GPU utilisation and memory of every node, sampled while the job trains."""

    collection_interval: float = 10.0  # seconds between samples
    flush_interval: float = 10.0  # seconds between writes to the loggers


@attrs.frozen(kw_only=True)
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


@attrs.frozen(kw_only=True)
class ClusterCfg:
    """The allocation the recipe is written for (``cluster``).

    On CPU profiles gpus_per_node counts worker slots (one training worker per slot).
    """

    num_nodes: int = 1
    gpus_per_node: int = 8


@attrs.frozen(kw_only=True)
class ValueCfg:
    """PPO value model (``value``); only its megatron_cfg manual-GC keys matter today."""

    model_name: str | None = None
    megatron_cfg: MegatronCfg = attrs.field(factory=MegatronCfg)


@attrs.frozen(kw_only=True)
class TeacherCfg:
    """Distillation teacher (``teacher``). Overrides apply on top of policy.megatron_cfg."""

    model_name: str | None = None
    megatron_cfg_overrides: dict[str, Any] = attrs.field(factory=dict)


@attrs.frozen(kw_only=True)
class Recipe:
    """A whole recipe after `defaults:` merging and overrides."""

    policy: PolicyCfg
    data: DataCfg = attrs.field(factory=DataCfg)
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
    def algorithm(self) -> Literal["grpo", "sft"]:
        """'grpo' or 'sft' (the rules guarantee exactly one section is set)."""
        return "grpo" if self.grpo is not None else "sft"

    @property
    def backend(self) -> str:
        """'megatron' or 'automodel' (the rules guarantee exactly one is enabled)."""
        return "megatron" if self.policy.megatron_cfg.enabled else "automodel"
