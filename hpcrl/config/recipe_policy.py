"""The recipe schema's ``policy`` section: the model being trained, its tokenizer, optimizer,
scheduler, generation and micro-batching, and the Automodel backend. Part of
``hpcrl.config.recipe`` (which re-exports every name; the Megatron backend's section is
``hpcrl.config.recipe_megatron``); frozen and keyword-only like the rest, each range beside
its field (``bounded``), cross-field rules in ``hpcrl.config.rules``.
"""

from __future__ import annotations

from typing import Any, ClassVar, Literal

import attrs

from hpcrl.config.field_bounds import (
    MAX_NODES,
    MAX_SEQUENCE_TOKENS,
    MAX_WORKER_SLOTS_PER_NODE,
    PARALLEL_SIZE,
    POSITIVE_COUNT,
    FieldBound,
    allocation_bound,
    at_least,
    batch_bound,
    bounded,
)
from hpcrl.config.recipe_lora import LoraCfg
from hpcrl.config.recipe_megatron import MegatronCfg
from hpcrl.config.shared_methods import SharedMethods

_ROUND = at_least(1, "set {path}=64 (or 1 for no rounding)")


# --------------------------------------------------------------------------- policy.* (shared)
@attrs.frozen(kw_only=True)
class TokenizerCfg(SharedMethods):
    """Tokenizer to load; a local path or hub name (defaults to the model's)."""

    name: str | None = None
    chat_template: str | None = None
    # more arguments of every apply_chat_template call (NeMo RL's; e.g. enable_thinking)
    chat_template_kwargs: dict[str, Any] = attrs.field(factory=dict)


@attrs.frozen(kw_only=True)
class OptimizerCfg(SharedMethods):
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
class LrSchedulerCfg(SharedMethods):
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
class VllmCfg(SharedMethods):
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
class GenerationResourcesCfg(SharedMethods):
    """Where non-colocated generation workers run."""

    num_nodes: int | None = bounded(None, allocation_bound(MAX_NODES))
    gpus_per_node: int | None = bounded(None, allocation_bound(MAX_WORKER_SLOTS_PER_NODE))


@attrs.frozen(kw_only=True)
class ColocatedCfg(SharedMethods):
    """Colocated: generation shares the training workers; otherwise it gets its own."""

    enabled: bool = True
    resources: GenerationResourcesCfg = attrs.field(factory=GenerationResourcesCfg)


@attrs.frozen(kw_only=True)
class GenerationCfg(SharedMethods):
    """How rollouts are sampled (``policy.generation``)."""

    # torch: hpcrl's in-process sampler; megatron: NeMo RL's name for sampling in process from
    # the Megatron policy's own weights, which hpcrl does with the same sampler fed by the
    # Megatron refit (hpcrl.config.generation_rules says what it accepts); vllm: vLLM engines
    backend: Literal["torch", "vllm", "megatron"] = "torch"
    max_new_tokens: int = bounded(64, POSITIVE_COUNT)
    temperature: float = bounded(
        1.0, FieldBound(low=0.0, message="must not be negative", fix="set {path}=1.0")
    )
    top_p: float = bounded(
        1.0, FieldBound(low=0.0, low_open=True, high=1.0, fix="set {path}=1.0 to turn it off")
    )
    top_k: int | None = bounded(
        None,
        FieldBound(
            low=-1, fix="set {path} to null to sample from every token, or a count such as 50",
            allowed="null, 0 or -1 (off), or a count of tokens of at least 1",
            why="sampling keeps the top_k most likely tokens; vLLM refuses anything below -1",
        ),
    )  # fmt: skip
    # Validation samples (as in NeMo RL, never greedily) at these; None: temperature, top_p
    # (NeMo RL writes ${.temperature} and ${.top_p}; its val_top_k is left to its key registry,
    # which accepts only ${.top_k}, as NeMo RL honours no other value).
    val_temperature: float | None = bounded(
        None,
        FieldBound(
            low=0.0, message="must not be negative",
            fix="leave it out (validation then samples at policy.generation.temperature)",
        ),
    )  # fmt: skip
    val_top_p: float | None = bounded(
        None,
        FieldBound(
            low=0.0, low_open=True, high=1.0,
            fix="leave it out (validation then samples at policy.generation.top_p)",
        ),
    )  # fmt: skip
    stop_token_ids: tuple[int, ...] = ()
    stop_strings: tuple[str, ...] = ()
    colocated: ColocatedCfg = attrs.field(factory=ColocatedCfg)
    vllm_cfg: VllmCfg = attrs.field(factory=VllmCfg)
    # more vllm.LLM keyword arguments, as NeMo RL passes them (rules refuse hpcrl's own)
    vllm_kwargs: dict[str, Any] = attrs.field(factory=dict)
    # how NeMo RL moves the trainer's weights into vLLM (null: its IPC/NCCL default); every
    # built-in transport delivers the same weights (the sparse ones lossless deltas), and
    # hpcrl refits through its own path: vLLM only, as NeMo RL requires
    # (hpcrl.config.generation_rules); a custom "module:Class" engine is refused
    refit_transport: Literal["nccl_reshard", "vllm_s3_sparse", "vllm_zmq_sparse", "nixl"] | None = (
        None
    )


# --------------------------------------------------------------------------- micro-batching
@attrs.frozen(kw_only=True)
class DynamicBatchingCfg(SharedMethods):
    """NeMo RL's ``policy.dynamic_batching``: micro-batches of similar-length rows within a
    token budget, each cut to its longest row (``hpcrl.core.workers.micro_batches``)."""

    enabled: bool = False
    train_mb_tokens: int | None = None  # None: policy.max_total_sequence_length
    logprob_mb_tokens: int | None = None
    sequence_length_round: int = bounded(64, _ROUND, when="enabled")


@attrs.frozen(kw_only=True)
class SequencePackingCfg(SharedMethods):
    """NeMo RL's ``policy.sequence_packing``: rows bin-packed into one long row per
    micro-batch, attention and positions restarting at each sequence."""

    enabled: bool = False
    train_mb_tokens: int | None = None  # None: policy.max_total_sequence_length
    logprob_mb_tokens: int | None = None
    # a str: read only while enabled (NeMo RL's configs carry a value it never reads when
    # packing is off); hpcrl.config.batching_rules checks it against PACKING_ALGORITHMS
    algorithm: str = "modified_first_fit_decreasing"
    sequence_length_round: int = bounded(64, _ROUND, when="enabled")


# --------------------------------------------------------------------------- automodel_cfg
@attrs.frozen(kw_only=True)
class MoeParallelizerCfg(SharedMethods):
    """NeMo Automodel's MoE parallelizer options (``policy.automodel_cfg.moe_parallelizer``);
    NeMo RL hands them to it only under expert parallelism (``expert_parallel_size`` > 1).
    The other keys of NeMo RL's section: ``hpcrl.config.foreign_key_table``."""

    # with activation checkpointing and EP: keep each MoE router's projection from the
    # forward pass instead of recomputing it in backward (routing cannot change on
    # recompute); null/false: the whole block is recomputed
    ignore_router_for_ac: bool | None = None


@attrs.frozen(kw_only=True)
class AutomodelCfg(SharedMethods):
    """Automodel backend: HF model + FSDP2 / HSDP / TP (``policy.automodel_cfg``).

    dp_shard is derived: world_size / (dp_replicate_size * tensor_parallel_size * context_parallel_size).
    """

    enabled: bool = False
    # > 1: HSDP, shard inside a node, replicate across nodes
    dp_replicate_size: int = bounded(
        1,
        FieldBound(
            low=1, message="a parallel size must be at least 1 (1: plain FSDP, >1: HSDP replicas)",
            fix="set {path}=1 (or larger)",
        ),
        when="enabled",
    )  # fmt: skip
    tensor_parallel_size: int = bounded(1, PARALLEL_SIZE, when="enabled")
    context_parallel_size: int = bounded(1, PARALLEL_SIZE, when="enabled")
    # > 1: each MoE layer's experts split over groups of this many data-parallel ranks
    # (hpcrl.core.backends.automodel.expert_parallel); must divide the dp_shard size
    expert_parallel_size: int = bounded(1, PARALLEL_SIZE, when="enabled")
    sequence_parallel: bool = False
    activation_checkpointing: bool = False
    cpu_offload: bool = False
    # hpcrl's own (NeMo RL's dtensor_cfg has none; megatron_cfg.optimizer's key of the same
    # name is its model): the share of the parameters whose AdamW state lives in host memory
    # and steps there, parameters and gradients staying on the GPU. 0: none, 1.0: all.
    optimizer_offload_fraction: float = bounded(
        0.0,
        FieldBound(
            low=0.0, high=1.0,
            message="must be in [0, 1] (the share of the parameters whose optimizer state lives in host memory)",
            fix="set {path} to 0 (all on the GPU), 0.5 or 1.0 (all on the host)",
        ),
        when="enabled",
    )  # fmt: skip
    # hpcrl's own: the KL term's reference model keeps its weights in host memory (FSDP2's
    # CPU offload, pinned) and copies each block to the GPU only for its forward, as NeMo
    # RL keeps its reference weights on the host. Frees the reference's fp32 weights on
    # the GPU (4 bytes per parameter) for a host-to-device copy of them in the compute dtype
    # (bf16: 2 bytes per parameter) per log-prob micro-batch.
    reference_on_host: bool = False
    torch_compile: bool = True  # GPU only: torch.compile each decoder block
    moe_parallelizer: MoeParallelizerCfg = attrs.field(factory=MoeParallelizerCfg)
    lora_cfg: LoraCfg = attrs.field(factory=LoraCfg)
    # exported in job.sbatch for an Automodel job (NeMo RL: dtensor_cfg.env_vars, on its
    # policy workers), as megatron_cfg.env_vars is for a Megatron one
    env_vars: dict[str, str] = attrs.field(factory=dict)


@attrs.frozen(kw_only=True)
class PolicyCfg(SharedMethods):
    """The model being trained (``policy``)."""

    model_name: str
    tokenizer: TokenizerCfg = attrs.field(factory=TokenizerCfg)
    train_global_batch_size: int = bounded(8, POSITIVE_COUNT, batch_bound())
    train_micro_batch_size: int = bounded(1, POSITIVE_COUNT, batch_bound())
    logprob_batch_size: int | None = bounded(None, POSITIVE_COUNT)  # None: train_micro_batch_size
    max_total_sequence_length: int = bounded(
        512,
        POSITIVE_COUNT,
        FieldBound(
            high=MAX_SEQUENCE_TOKENS, fix="set {path} to the model's context length or less, e.g. 4096",
            why="longer than any model's context window (the longest hold about 10 million "
            "tokens), and the job sizes its buffers by it",
        ),
    )  # fmt: skip
    precision: Literal["float32", "bfloat16", "float16"] = "bfloat16"
    max_grad_norm: float | None = bounded(
        1.0,
        FieldBound(
            low=0.0, low_open=True, message="must be positive (gradients are clipped to this norm)",
            fix="set {path}=1.0, or null to turn clipping off",
        ),
    )  # fmt: skip
    # None: NeMo RL's Megatron configs write `optimizer: null` (megatron_cfg.optimizer applies)
    optimizer: OptimizerCfg | None = attrs.field(factory=OptimizerCfg)
    # None or empty: a constant learning rate. Stepped once per optimizer step.
    scheduler: tuple[LrSchedulerCfg, ...] | None = None
    generation: GenerationCfg = attrs.field(factory=GenerationCfg)
    dynamic_batching: DynamicBatchingCfg = attrs.field(factory=DynamicBatchingCfg)
    sequence_packing: SequencePackingCfg = attrs.field(factory=SequencePackingCfg)
    make_sequence_length_divisible_by: int | None = bounded(  # None: 1
        1, at_least(1, "set it to the tensor-parallel size (NeMo RL's default), or 1")
    )
    automodel_cfg: AutomodelCfg = attrs.field(factory=AutomodelCfg)
    megatron_cfg: MegatronCfg = attrs.field(factory=MegatronCfg)
    # changes to the model's Hugging Face config (hpcrl.core.models.hf_config), for training
    # and sampling alike; a nested mapping changes the sub-config it names
    hf_config_overrides: dict[str, Any] = attrs.field(factory=dict)
    # NeMo RL's: load a quantized checkpoint's weights dequantized (gpt-oss's MXFP4 experts
    # to bf16) for the Automodel backend to train; no effect on an unquantized checkpoint.
    # An MXFP4 checkpoint without it is refused (hpcrl.config.architectures).
    dequantize_base_checkpoint: bool = False
