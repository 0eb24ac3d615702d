"""The recipe schema's Megatron section (``policy.megatron_cfg``): megatron-core's option
names, as NeMo RL spells them. Part of ``hpcrl.config.recipe`` (which re-exports every name);
frozen and keyword-only like the rest, cross-field rules in ``hpcrl.config.megatron_rules``.
"""

from __future__ import annotations

from typing import Any, Literal

import attrs

from hpcrl.config.field_bounds import AT_LEAST_ZERO, PARALLEL_SIZE, FieldBound, at_least, bounded
from hpcrl.config.shared_methods import SharedMethods

_ADAM_BETA = FieldBound(low=0.0, high=1.0, high_open=True, fix="e.g. 0.9 and 0.999")

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


# --------------------------------------------------------------------------- megatron_cfg
@attrs.frozen(kw_only=True)
class MegatronOptimizerCfg(SharedMethods):
    """megatron-core OptimizerConfig subset (``policy.megatron_cfg.optimizer``)."""

    optimizer: str = "adam"  # adam | sgd; a str so the rule can report a bad value with its fix
    lr: float = bounded(1e-5, AT_LEAST_ZERO)
    min_lr: float = bounded(0.0, AT_LEAST_ZERO)
    weight_decay: float = bounded(0.0, AT_LEAST_ZERO)
    bf16: bool = False
    fp16: bool = False
    params_dtype: Literal["float32", "bfloat16", "float16"] = "float32"
    adam_beta1: float = bounded(0.9, _ADAM_BETA)
    adam_beta2: float = bounded(0.999, _ADAM_BETA)
    adam_eps: float = bounded(
        1e-8, FieldBound(low=0.0, low_open=True, message="must be positive", fix="e.g. 1.0e-8")
    )
    sgd_momentum: float = bounded(0.9, AT_LEAST_ZERO)
    use_distributed_optimizer: bool = True
    use_precision_aware_optimizer: bool = False
    # 0: no clipping. null only under a disabled megatron_cfg (NeMo RL's configs write
    # ${policy.max_grad_norm}, null when the Automodel backend clips nothing)
    clip_grad: float | None = bounded(1.0, AT_LEAST_ZERO)
    optimizer_cpu_offload: bool = False
    # The share of optimizer state megatron-core keeps on the host; set while
    # optimizer_cpu_offload is off it is ignored (megatron_rules.rule_optimizer_offload)
    optimizer_offload_fraction: float = bounded(
        0.0,
        FieldBound(low=0.0, high=1.0, why="the share of optimizer state kept on the CPU",
                   fix="set {path} to e.g. 0.5 or 1.0"),
        FieldBound(
            low=0.0, low_open=True, when="optimizer_cpu_offload",
            message="must be above 0 when {section}.optimizer_cpu_offload is true (the share "
            "of optimizer state kept on the CPU; 0 keeps none there)",
            fix="set {path} to e.g. 0.5 or 1.0, or {section}.optimizer_cpu_offload=false",
        ),
        when="enabled",
    )  # fmt: skip
    overlap_cpu_optimizer_d2h_h2d: bool = False


@attrs.frozen(kw_only=True)
class MegatronSchedulerCfg(SharedMethods):
    """megatron-core OptimizerParamScheduler settings (``policy.megatron_cfg.scheduler``)."""

    start_weight_decay: float = 0.0
    end_weight_decay: float = 0.0
    weight_decay_incr_style: Literal["constant", "linear", "cosine"] = "constant"
    lr_decay_style: Literal["constant", "linear", "cosine", "inverse-square-root", "WSD"] = (
        "constant"
    )
    lr_decay_iters: int | None = bounded(None, at_least(1, "or null"))
    lr_warmup_iters: int = bounded(0, at_least(0, "0 for none"))
    lr_warmup_init: float = bounded(0.0, at_least(0.0, "e.g. 0.0"))


@attrs.frozen(kw_only=True)
class DistributedDataParallelCfg(SharedMethods):
    """megatron-core DistributedDataParallelConfig subset."""

    grad_reduce_in_fp32: bool = False
    overlap_grad_reduce: bool = False
    overlap_param_gather: bool = False
    average_in_collective: bool = False
    use_custom_fsdp: bool = False
    data_parallel_sharding_strategy: Literal[
        "no_shard", "optim", "optim_grads", "optim_grads_params"
    ] = "no_shard"


@attrs.frozen(kw_only=True)
class MegatronCheckpointCfg(SharedMethods):
    """How Megatron checkpoints are read and written (``policy.megatron_cfg.checkpoint``)."""

    save_format: Literal["torch_dist"] = "torch_dist"
    fully_parallel_save: bool = True
    fully_parallel_load: bool = True
    async_save: bool = False
    parallel_read_threads: int = bounded(  # 1 = PyTorch's own FileSystemReader
        1,
        FieldBound(low=1, message="must be a positive integer",
                   fix="set {path}=1 (PyTorch's own reader) or more threads"),
        when="enabled",
    )  # fmt: skip
    # The distributed optimizer's state on disk (megatron-core's names): "dp_reshardable" keeps
    # its buffers as they are (no gathers) and resumes at another DP size only;
    # "fully_reshardable" gathers it over DP into model-space tensors at save and resumes at
    # any TP/PP/DP (docs/megatron.md, "Training checkpoints").
    optimizer_format: Literal["dp_reshardable", "fully_reshardable"] = "dp_reshardable"


@attrs.frozen(kw_only=True)
class MegatronPeftCfg(SharedMethods):
    """LoRA adapters on megatron-core's linear layers (``policy.megatron_cfg.peft``), applied
    by megatron-bridge's own ``LoRA`` as NeMo RL's Megatron worker applies it:
    ``y = W x + (alpha / dim) * B(A(x))``, W frozen, only A (``linear_in``) and B
    (``linear_out``) trained; tensor-parallel adapters beside tensor-parallel linears.

    Which linears: ``target_modules`` (megatron names such as ``linear_qkv``, ``linear_proj``,
    ``linear_fc1``, ``linear_fc2``, or wildcard patterns of the full module name); empty:
    every linear except those ``exclude_modules`` names (megatron-bridge's matcher).
    """

    enabled: bool = False
    target_modules: tuple[str, ...] = ()
    exclude_modules: tuple[str, ...] = ()
    dim: int = 8  # the rank r
    alpha: float = 32.0  # the adapter's output is scaled by alpha / dim
    dropout: float = 0.0
    dropout_position: Literal["pre", "post"] = "post"
    # megatron-bridge's init names: xavier = xavier_normal_, normal = N(0, 0.2),
    # kaiming = kaiming_uniform_(a=sqrt(5)), zero
    lora_A_init_method: Literal["xavier", "normal", "kaiming", "zero"] = "xavier"
    lora_B_init_method: Literal["xavier", "normal", "kaiming", "zero"] = "zero"
    a2a_experimental: bool = False  # refused when true (rules): expert-parallel adapters
    # NeMo RL's example writes the string "None" (the model's dtype); anything else is refused
    lora_dtype: str | None = None


@attrs.frozen(kw_only=True)
class MegatronCfg(SharedMethods):
    """Megatron backend: megatron-core through megatron-bridge (``policy.megatron_cfg``)."""

    enabled: bool = False
    tensor_model_parallel_size: int = bounded(1, PARALLEL_SIZE, when="enabled")
    pipeline_model_parallel_size: int = bounded(1, PARALLEL_SIZE, when="enabled")
    context_parallel_size: int = bounded(1, PARALLEL_SIZE, when="enabled")
    expert_model_parallel_size: int = bounded(1, PARALLEL_SIZE, when="enabled")
    expert_tensor_parallel_size: int = bounded(1, PARALLEL_SIZE, when="enabled")
    num_layers_in_first_pipeline_stage: int | None = None
    num_layers_in_last_pipeline_stage: int | None = None
    pipeline_dtype: Literal["float32", "bfloat16", "float16"] | None = None
    sequence_parallel: bool = False
    activation_checkpointing: bool = False
    recompute_granularity: Literal["full", "selective"] | None = None
    recompute_method: Literal["uniform", "block"] | None = None
    recompute_num_layers: int | None = bounded(
        None,
        FieldBound(low=1, message="must be a positive layer count (layers per recompute group)",
                   fix="set {path}=1, or remove it (1 is the default)"),
        when=("enabled", "activation_checkpointing"),
    )  # fmt: skip
    recompute_modules: tuple[str, ...] = ()
    cpu_offloading: bool = False
    cpu_offloading_num_layers: int = 0
    fine_grained_activation_offloading: bool = False
    offload_modules: tuple[str, ...] = ()  # names checked by rules (see OffloadModule)
    cuda_graph_impl: Literal["none", "local", "transformer_engine", "full_iteration"] = "none"
    # megatron-core's AttnBackend, as NeMo RL sets it on the model config (None: the
    # provider's own, auto); flash/fused/unfused pick Transformer Engine's kernels
    attention_backend: Literal["flash", "fused", "unfused", "local", "auto"] | None = None
    empty_unused_memory_level: int = 0
    freeze_moe_router: bool = False
    # NeMo RL's memory saving (log-probs from hidden states in chunks): the same values as
    # the unfused path, which hpcrl computes (hpcrl.config.fused_logprobs_rules)
    use_fused_linear_logprobs: bool = False
    # MoE provider settings, NeMo RL's names; None/False: the provider's own value
    moe_router_dtype: Literal["fp32", "fp64"] | None = None
    moe_router_load_balancing_type: str | None = None
    moe_router_bias_update_rate: float | None = None
    moe_token_dispatcher_type: str | None = None
    moe_permute_fusion: bool = False  # Transformer Engine only (switched off without it)
    moe_shared_expert_overlap: bool = False
    moe_per_layer_logging: bool = False
    moe_grouped_gemm: bool = False  # Transformer Engine only (switched off without it)
    moe_router_enable_expert_bias: bool = False
    # The flex dispatcher's kernels (megatron-core; DeepEP/HybridEP, CUDA only): which backend,
    # and HybridEP's SMs and NVLink-domain variables (hpcrl.config.moe_dispatch)
    moe_enable_deepep: bool = False
    moe_flex_dispatcher_backend: Literal["deepep", "hybridep"] | None = None
    moe_hybridep_num_sms: int | None = None
    hybridep_num_ranks_per_nvlink_domain: int | None = None
    hybridep_use_mnnvl: bool | None = None
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
    peft: MegatronPeftCfg = attrs.field(factory=MegatronPeftCfg)
