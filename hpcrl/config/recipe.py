"""The recipe schema: what to train. Key names follow NeMo RL's so its users feel at home.

Every class is frozen and keyword-only; the converter in ``hpcrl.config.converter`` forbids
unknown keys. Each field says what it holds (type, default, unit) and, where it has one, its
range (``bounded``: ``hpcrl.config.field_bounds``). Cross-field rules live in
``hpcrl.config.rules``, not here. One schema in four files: ``policy`` in
``recipe_policy``, its Megatron backend in ``recipe_megatron``, ``grpo``/``sft``/``loss_fn`` in
``recipe_algorithms``, and the rest (data, environment, checkpointing, loggers, allocation)
with ``Recipe`` here, which re-exports every name.
"""

from __future__ import annotations

from typing import Any, Literal

import attrs

from hpcrl.config.field_bounds import (
    MAX_NODES,
    MAX_WORKER_SLOTS_PER_NODE,
    POSITIVE_COUNT,
    allocation_bound,
    at_least,
    bounded,
)
from hpcrl.config.recipe_algorithms import (  # noqa: F401  (re-exported: one schema, four files)
    AdvEstimatorCfg,
    AsyncGrpoCfg,
    GrpoCfg,
    LossFnCfg,
    RewardScalingCfg,
    RewardShapingCfg,
    SftCfg,
)
from hpcrl.config.recipe_async_rl import AsyncRlCfg, AsyncRlSamplerCfg  # noqa: F401  (re-exported)
from hpcrl.config.recipe_lora import LoraCfg  # noqa: F401  (re-exported)
from hpcrl.config.recipe_megatron import (  # noqa: F401  (re-exported: one schema, four files)
    DistributedDataParallelCfg,
    MegatronCfg,
    MegatronCheckpointCfg,
    MegatronOptimizerCfg,
    MegatronPeftCfg,
    MegatronSchedulerCfg,
    OffloadModule,
)
from hpcrl.config.recipe_policy import (  # noqa: F401  (re-exported: one schema, four files)
    AutomodelCfg,
    ColocatedCfg,
    DynamicBatchingCfg,
    GenerationCfg,
    GenerationResourcesCfg,
    LrSchedulerCfg,
    OptimizerCfg,
    PolicyCfg,
    SequencePackingCfg,
    TokenizerCfg,
    VllmCfg,
)
from hpcrl.config.recipe_reward_model import (  # noqa: F401  (re-exported)
    RewardModelEnvCfg,
    RewardModelResourcesCfg,
)
from hpcrl.config.shared_methods import SharedMethods


@attrs.frozen(kw_only=True)
class DatasetCfg(SharedMethods):
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
    # a seeded random subset of this many rows, taken before validation is carved out (as
    # NeMo RL's loaders that read it do; <= 0 or null: every row)
    max_samples: int | None = None


@attrs.frozen(kw_only=True)
class DataCfg(SharedMethods):
    """Training data (``data``): a local JSONL file (``train_path``, hpcrl's own form; relative
    paths resolve against the recipe's folder) or NeMo RL's data sets by name (``train`` /
    ``validation`` / ``default``, or the older flat ``dataset_name`` + ``prompt_file``)."""

    train_path: str | None = None
    val_path: str | None = None
    prompt_key: str = "prompt"
    response_key: str = "response"  # SFT targets
    answer_key: str = "answer"  # environment ground truth
    max_input_seq_length: int | None = bounded(None, at_least(1, "or null: no limit"))
    shuffle: bool = True
    num_workers: int = bounded(0, at_least(0, "0: load in the driver"))
    # NeMo RL's named data sets: one section, or a list of them (NeMo RL concatenates the
    # sets, each read with its own keys; hpcrl.core.data.named)
    train: DatasetCfg | tuple[DatasetCfg, ...] | None = None
    validation: DatasetCfg | tuple[DatasetCfg, ...] | None = None
    default: DatasetCfg | None = None
    dataset_name: str | None = None  # older NeMo RL configs: one set for train and validation
    env_name: str | None = None  # older NeMo RL configs: the environment of that set
    prompt_file: str | None = None
    system_prompt_file: str | None = None
    split: str | None = None
    seed: int | None = None
    output_key: str | None = None  # the target column (OpenMathInstruct-2 SFT: generated_solution)
    add_bos: bool = True  # SFT
    add_eos: bool = True
    add_generation_prompt: bool = False


@attrs.frozen(kw_only=True)
class MathEnvCfg(SharedMethods):
    """NeMo RL's ``env.math``: how responses are checked against the ground truth."""

    num_workers: int = 1  # accepted: scoring runs in one process (same rewards)
    # hf_math_verify: Hugging Face math-verify (symbolic; needs the math-verify package);
    # dapo_math_verify: NeMo RL's DAPO check (the normalised text after the last "Answer:");
    # hpcrl_numeric: hpcrl's numeric comparison of the last \boxed{} / stated / last number.
    math_verify_impl: Literal["hf_math_verify", "dapo_math_verify", "hpcrl_numeric"] = (
        "hf_math_verify"
    )


@attrs.frozen(kw_only=True)
class MathMultiRewardEnvCfg(SharedMethods):
    """NeMo RL's ``env.math_multi_reward``: the environment of data sets whose env_name is
    math_multi_reward (hpcrl.core.environments.math_multi_reward_env; GDPO's rewards)."""

    num_workers: int = 1  # accepted: scoring runs in one process (same rewards)
    math_verify_impl: Literal["hf_math_verify"] = "hf_math_verify"  # NeMo RL's only choice


@attrs.frozen(kw_only=True)
class EnvCfg(SharedMethods):
    """Reward environment (``env``)."""

    # math_multi_reward: NeMo RL's three-reward math environment (for gdpo), which its
    # configs pick by data.*.env_name
    name: Literal["math", "toy_count", "math_multi_reward", "reward_model"] = "math"
    kwargs: dict[str, Any] = attrs.field(factory=dict)
    math: MathEnvCfg | None = None  # NeMo RL's form; None: hpcrl's numeric check
    math_multi_reward: MathMultiRewardEnvCfg | None = None  # for data.*.env_name of that name
    reward_model: RewardModelEnvCfg | None = None  # for data.*.env_name of that name


@attrs.frozen(kw_only=True)
class CheckpointingCfg(SharedMethods):
    """Training checkpoints (``checkpointing``). checkpoint_dir None: <run folder>/checkpoints."""

    enabled: bool = False
    checkpoint_dir: str | None = None
    save_period: int = bounded(
        10, at_least(1, "save every N >= 1 steps (checkpointing.enabled=false to save none)")
    )
    keep_top_k: int | None = bounded(None, at_least(1, "keep at least one, or null to keep all"))
    # keep the keep_top_k best by this step metric (NeMo RL's names: val_reward, val:val_loss,
    # train:loss) and the newest; None: the newest keep_top_k
    metric_name: str | None = None
    higher_is_better: bool = True
    # NeMo RL's key: also write each saved checkpoint's weights as a Hugging Face folder
    # (safetensors, config, tokenizer) in <checkpoint>/hf, which from_pretrained and vLLM load
    save_consolidated: bool = False
    # NeMo RL's wall-clock save deadline, DD:HH:MM:SS from the training loop's start: save
    # and stop once the next step would end past it (hpcrl.config.save_deadline)
    checkpoint_must_save_by: str | None = None


@attrs.frozen(kw_only=True)
class WandbCfg(SharedMethods):
    """Weights & Biases (``logger.wandb``). Offline (files under the log folder) unless the job
    has WANDB_API_KEY or sets WANDB_MODE; the files can be synced later with ``wandb sync``."""

    project: str = "hpcrl"
    name: str | None = None  # None: the run folder's name
    entity: str | None = None


@attrs.frozen(kw_only=True)
class TensorboardCfg(SharedMethods):
    """TensorBoard event files (``logger.tensorboard``). log_dir None: <log_dir>/tensorboard;
    relative: below logger.log_dir."""

    log_dir: str | None = None


@attrs.frozen(kw_only=True)
class MlflowCfg(SharedMethods):
    """MLflow (``logger.mlflow``). tracking_uri None: a file store in <log_dir>/mlruns."""

    experiment_name: str = "hpcrl"
    run_name: str | None = None  # None: the run folder's name
    tracking_uri: str | None = None


@attrs.frozen(kw_only=True)
class GpuMonitoringCfg(SharedMethods):
    """GPU utilisation and memory of every node, sampled while the job trains."""

    collection_interval: float = 10.0  # seconds between samples
    flush_interval: float = 10.0  # seconds between writes to the loggers


@attrs.frozen(kw_only=True)
class LoggerCfg(SharedMethods):
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
class ClusterCfg(SharedMethods):
    """The allocation the recipe is written for (``cluster``).

    On CPU profiles gpus_per_node counts worker slots (one training worker per slot).
    """

    num_nodes: int = bounded(1, POSITIVE_COUNT, allocation_bound(MAX_NODES))
    gpus_per_node: int = bounded(8, POSITIVE_COUNT, allocation_bound(MAX_WORKER_SLOTS_PER_NODE))


@attrs.frozen(kw_only=True)
class ValueCfg(SharedMethods):
    """PPO value model (``value``); only its megatron_cfg manual-GC keys matter today."""

    model_name: str | None = None
    megatron_cfg: MegatronCfg = attrs.field(factory=MegatronCfg)


@attrs.frozen(kw_only=True)
class TeacherCfg(SharedMethods):
    """Distillation teacher (``teacher``). Overrides apply on top of policy.megatron_cfg."""

    model_name: str | None = None
    megatron_cfg_overrides: dict[str, Any] = attrs.field(factory=dict)


@attrs.frozen(kw_only=True)
class Recipe(SharedMethods):
    """A whole recipe after `defaults:` merging and overrides."""

    policy: PolicyCfg
    data: DataCfg = attrs.field(factory=DataCfg)
    grpo: GrpoCfg | None = None
    sft: SftCfg | None = None
    # NeMo RL's single-controller async GRPO (hpcrl.config.recipe_async_rl); None: not given
    async_rl: AsyncRlCfg | None = None
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
