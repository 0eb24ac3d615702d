"""Parallelism for Hugging Face causal LMs, applied in torchtitan's order:
``apply_tp`` → ``apply_expert_parallel`` (``expert_parallel``) →
``apply_activation_checkpointing`` → ``apply_compile`` → ``apply_fsdp``
(or ``apply_autocast`` when a single rank holds the whole model: nothing to shard). LoRA
adapters (``hpcrl.core.backends.automodel.lora.apply_lora``) go on before all of them, so
that FSDP shards each block's adapters with the block.

Each function changes the model in place and knows nothing about training. Decoder blocks
are found through ``decoder_layers`` (``model.model.layers`` for Llama/Qwen2-style models).
"""

from __future__ import annotations

from typing import TYPE_CHECKING, Any

import attrs

if TYPE_CHECKING:
    import torch
    from torch.distributed.device_mesh import DeviceMesh

    from hpcrl.core.generation.aot_precompiled import PrecompiledPieces

MESH_DIM_NAMES = ("dp_replicate", "dp_shard", "cp", "tp")


@attrs.frozen(kw_only=True)
class MeshShape:
    """Sizes of the device mesh dims; dp_shard is what is left of the world. cp: context
    parallel ranks, which hold parts of the same sequences (``context_parallel``)."""

    dp_replicate: int
    dp_shard: int
    tp: int
    cp: int = 1

    @classmethod
    def for_world(cls, world_size: int, dp_replicate: int, tp: int, cp: int = 1) -> MeshShape:
        if world_size % (dp_replicate * tp * cp) != 0:
            raise ValueError(
                f"policy.automodel_cfg: {world_size} workers do not split into "
                f"dp_replicate_size={dp_replicate} x tensor_parallel_size={tp} x "
                f"context_parallel_size={cp} x dp_shard; make their product divide {world_size}"
            )
        dp_shard = world_size // (dp_replicate * tp * cp)
        return cls(dp_replicate=dp_replicate, dp_shard=dp_shard, tp=tp, cp=cp)

    @property
    def dp_size(self) -> int:
        """Data-parallel ranks: those that see different sequences (CP peers do not)."""
        return self.dp_replicate * self.dp_shard


def build_mesh(device_type: str, shape: MeshShape) -> DeviceMesh:
    """A 4-D mesh (dp_replicate, dp_shard, cp, tp); size-1 dims are kept (they cost nothing)."""
    from torch.distributed.device_mesh import init_device_mesh

    return init_device_mesh(
        device_type,
        (shape.dp_replicate, shape.dp_shard, shape.cp, shape.tp),
        mesh_dim_names=MESH_DIM_NAMES,
    )


def data_parallel_mesh(mesh: DeviceMesh, shape: MeshShape) -> DeviceMesh:
    """The mesh FSDP shards over: 2-D (replicate, shard) = HSDP when dp_replicate > 1. Under
    context parallelism FSDP shards over dp_shard × cp flattened: CP peers hold different
    tokens of the same sequences, so their gradients are partial sums FSDP's reduction adds
    up (``context_parallel`` explains the scale)."""
    shard_dim = "dp_shard"
    if shape.cp > 1:
        shard_dim = "dp_shard_cp"
        flat = mesh["dp_shard", "cp"]._flatten(shard_dim)
        if shape.dp_replicate == 1:
            return flat
    if shape.dp_replicate > 1:
        return mesh["dp_replicate", shard_dim]
    return mesh[shard_dim]


def decoder_layers(hf_model: Any) -> Any:
    """The ``nn.ModuleList`` of decoder blocks of a HF causal LM."""
    decoder = hf_model.get_decoder()
    layers = getattr(decoder, "layers", None)
    if layers is None:
        raise ValueError(
            f"{type(hf_model).__name__}: no decoder .layers found; the automodel backend "
            "supports Llama/Qwen2/Mistral-style models"
        )
    return layers


def apply_tp(hf_model: Any, tp_mesh: DeviceMesh, *, sequence_parallel: bool = False) -> None:
    """Column-parallel q/k/v and gate/up, row-parallel o and down, per decoder block.

    HF attention reshapes with ``-1`` heads, so each rank simply runs its share of heads;
    embeddings and lm_head stay replicated across the TP group, and so do the norms unless
    ``sequence_parallel`` (``_sequence_parallel_block_plan``) splits them along the sequence.

    Gemma 3's text decoder, alone (``gemma3_text``) or inside its multimodal wrapper
    (``gemma3``, whose vision tower stays whole on every rank), has Llama's projections and
    takes the same plan: its q_norm/k_norm act on one head at a time (each rank holds whole
    heads); its scaled embeddings, tied head and sliding-window masks do not depend on how
    many heads a rank runs. Only sequence parallelism differs (its two extra norms).
    """
    from torch.distributed.tensor.parallel import parallelize_module

    plan = _tensor_parallel_block_plan(hf_model, tp_mesh.size())
    if sequence_parallel:
        plan.update(_sequence_parallel_block_plan(hf_model))
    for layer in decoder_layers(hf_model):
        parallelize_module(layer, tp_mesh, plan)
    if sequence_parallel:
        _split_and_gather_sequence(hf_model, tp_mesh)


def _tensor_parallel_block_plan(hf_model: Any, tp: int) -> dict[str, Any]:
    """The per-block plan; a multimodal wrapper's sizes are those of its text config."""
    from torch.distributed.tensor.parallel import ColwiseParallel, RowwiseParallel

    config = hf_model.config.get_text_config()
    for name in ("num_attention_heads", "num_key_value_heads", "intermediate_size"):
        value = getattr(config, name, None) or config.num_attention_heads
        if value % tp != 0:
            raise ValueError(
                f"policy.automodel_cfg.tensor_parallel_size={tp} does not divide the model's "
                f"{name}={value}; pick a tensor_parallel_size that divides it"
            )
    plan = {
        "self_attn.q_proj": ColwiseParallel(),
        "self_attn.k_proj": ColwiseParallel(),
        "self_attn.v_proj": ColwiseParallel(),
        "self_attn.o_proj": RowwiseParallel(),
        "mlp.gate_proj": ColwiseParallel(),
        "mlp.up_proj": ColwiseParallel(),
        "mlp.down_proj": RowwiseParallel(),
    }
    attention = getattr(decoder_layers(hf_model)[0], "self_attn", None)
    for norm in ("q_norm", "k_norm"):
        if hasattr(attention, norm):
            plan[f"self_attn.{norm}"] = _per_head_norm_style()
    return plan


def _per_head_norm_style() -> Any:
    """Qwen 3's and Gemma 3's q_norm/k_norm: one weight of head_dim shared by every head,
    run by each rank on its own heads. Left a plain tensor, its gradient on each rank would
    come from that rank's heads alone and the TP peers' copies would drift apart. Held as a
    TP-replicated DTensor whose input is split over the ranks, its gradient (a sum over all
    rows) is all-reduced over them. Each row is normalised on its own, so the leading dim
    the input is declared split on does not change a value: dim 0 fits every layout (heads
    come before or after the sequence, depending on the model)."""
    from torch.distributed.tensor.parallel import SequenceParallel

    return SequenceParallel(sequence_dim=0, use_local_output=True)


# The block layouts sequence parallelism knows. Llama's: x + attn(norm(x)), then
# x + mlp(norm(x)). Gemma 3's norms the attention and MLP outputs again before each residual
# add. A block with other modules (MoE routers) would mix split and whole activations, so it
# is refused rather than run with a layout that does not fit it.
SEQUENCE_PARALLEL_BLOCK = frozenset(
    {"input_layernorm", "self_attn", "post_attention_layernorm", "mlp"}
)
GEMMA3_BLOCK = SEQUENCE_PARALLEL_BLOCK | {"pre_feedforward_layernorm", "post_feedforward_layernorm"}


def _sequence_parallel_block_plan(hf_model: Any) -> dict[str, Any]:
    """Megatron-style sequence parallelism inside each block (as torchtitan plans it): the
    residual stream and the norms hold a 1/TP slice of the sequence (``Shard(1)``); the
    input of attention and of the MLP is all-gathered to the whole sequence, and the
    row-parallel outputs are reduce-scattered back to slices instead of all-reduced."""
    from torch.distributed.tensor import Replicate, Shard
    from torch.distributed.tensor.parallel import (
        PrepareModuleInput,
        RowwiseParallel,
        SequenceParallel,
    )

    layers = decoder_layers(hf_model)
    children = {name for name, _ in layers[0].named_children()}
    if children not in (SEQUENCE_PARALLEL_BLOCK, GEMMA3_BLOCK):
        raise ValueError(
            f"policy.automodel_cfg.sequence_parallel: {type(layers[0]).__name__} has the "
            f"modules {sorted(children)}, not the Llama/Qwen2/Mistral block "
            f"{sorted(SEQUENCE_PARALLEL_BLOCK)} or Gemma 3's (two norms more) the "
            "sequence-parallel plan is made for; set sequence_parallel=false"
        )
    plan = {
        "input_layernorm": SequenceParallel(),
        # HF passes attention its hidden states by keyword, the MLP by position.
        "self_attn": PrepareModuleInput(
            input_kwarg_layouts={"hidden_states": Shard(1)},
            desired_input_kwarg_layouts={"hidden_states": Replicate()},
            use_local_output=True,
        ),
        "self_attn.o_proj": RowwiseParallel(output_layouts=Shard(1)),
        "post_attention_layernorm": SequenceParallel(),
        "mlp": PrepareModuleInput(
            input_layouts=(Shard(1),), desired_input_layouts=(Replicate(),), use_local_output=True
        ),
        "mlp.down_proj": RowwiseParallel(output_layouts=Shard(1)),
    }
    if children == GEMMA3_BLOCK:
        # Gemma's post-attention and post-MLP norms feed the residual add, which holds plain
        # (local) slices: their outputs are handed on as such.
        plan["post_attention_layernorm"] = SequenceParallel(use_local_output=True)
        plan["pre_feedforward_layernorm"] = SequenceParallel()
        plan["post_feedforward_layernorm"] = SequenceParallel(use_local_output=True)
    return plan


def _split_and_gather_sequence(hf_model: Any, tp_mesh: DeviceMesh) -> None:
    """The first block takes its slice of the whole sequence; the final norm runs on slices
    and hands the whole sequence on. The embeddings stay whole on purpose: HF builds the
    attention mask and rotary positions from their length, before any block runs. Sequence
    lengths must be multiples of TP (``AutomodelWorker`` pads them)."""
    from torch.distributed.tensor import Replicate, Shard
    from torch.distributed.tensor.parallel import (
        PrepareModuleInput,
        PrepareModuleOutput,
        SequenceParallel,
        parallelize_module,
    )

    first_block = decoder_layers(hf_model)[0]
    parallelize_module(
        first_block,
        tp_mesh,
        PrepareModuleInput(
            input_layouts=(Replicate(),), desired_input_layouts=(Shard(1),), use_local_output=True
        ),
    )
    norm = hf_model.get_decoder().norm
    parallelize_module(norm, tp_mesh, SequenceParallel())
    parallelize_module(
        norm,
        tp_mesh,
        PrepareModuleOutput(
            output_layouts=Shard(1), desired_output_layouts=Replicate(), use_local_output=True
        ),
    )


def apply_activation_checkpointing(hf_model: Any, context_fn: Any = None) -> None:
    """Recompute each decoder block in backward (non-reentrant). ``context_fn``: a
    selective-checkpoint context (``expert_parallel.router_saving_context``: what the
    recompute takes from the forward pass instead); None: the whole block is recomputed."""
    from torch.distributed.algorithms._checkpoint.checkpoint_wrapper import checkpoint_wrapper

    extra = {} if context_fn is None else {"context_fn": context_fn}
    layers = decoder_layers(hf_model)
    for index, layer in enumerate(layers):
        layers[index] = checkpoint_wrapper(layer, preserve_rng_state=False, **extra)


def apply_compile(
    hf_model: Any, backend: Any = "inductor", *, precompiled: PrecompiledPieces | None = None
) -> None:
    """``torch.compile`` each decoder block, batch and sequence sizes dynamic from the start.

    Static sizes would recompile on the first new length (automatic dynamic shapes then make
    them dynamic: a multi-second stall in a later GRPO step). Duck shaping is switched off
    for this process: it gives equal sizes one symbol, so a sequence length that happens to
    equal the head dim (128) or hidden size would be specialised to that constant and the
    next length would recompile. Blocks share their code, but dynamo may specialise on
    per-block attributes (HF's ``layer_idx``): allow one compile per block so none silently
    falls back to eager. Float attributes (the norms' ``variance_epsilon``) are constants:
    traced as symbols (dynamo's default), they made every first compilation trace the block
    twice (a restart of the analysis when Inductor specialised them back), a cache miss in
    every run included (docs/performance.md, "Figures behind the code").

    ``precompiled`` (``aot_block.precompiled_blocks``: plain blocks only, no FSDP, checkpoint
    wrapper or TP, and a planned compile cache): the blocks' calls load a saved compilation
    instead of being traced; any call it does not take goes through the compilation above.
    """
    import torch._dynamo
    import torch.fx.experimental._config as fx_config

    from hpcrl.core.backends.automodel.aot_block import AheadOfTimeBlockCall

    fx_config.use_duck_shape = False
    torch._dynamo.config.specialize_float = True

    layers = decoder_layers(hf_model)
    needed = len(layers) + 8
    if torch._dynamo.config.recompile_limit < needed:
        torch._dynamo.config.recompile_limit = needed
    for layer in layers:
        layer.compile(fullgraph=False, dynamic=True, backend=backend)
        if precompiled is not None:
            fallback = layer._compiled_call_impl
            layer._compiled_call_impl = AheadOfTimeBlockCall(layer, precompiled, fallback)


@attrs.frozen(kw_only=True)
class ParallelizeSteps:
    """Which ``apply_*`` steps a model gets, in the order they run; param_dtype: the
    compute dtype's name (FSDP's mixed precision, or autocast without FSDP), None: fp32."""

    lora: bool
    tp: bool
    context_parallel: bool
    sequence_parallel: bool
    expert_parallel: int  # EP size; 1: off
    activation_checkpointing: bool
    save_router_outputs: bool  # with activation checkpointing under EP (ignore_router_for_ac)
    compile: bool
    fsdp: bool
    cpu_offload: bool
    # FSDP's mixed precision (param_dtype) where the policy trains under FSDP; else autocast
    # (``apply_autocast``), also for a reference FSDP wraps only to keep it on the host
    fsdp_mixed_precision: bool
    # every block back to its (host) shard after its forward: the host-resident reference
    reshard_every_block: bool
    pin_memory: bool  # host shards in page-locked memory (GPU only)
    param_dtype: str | None


def parallelize_steps(
    cfg: Any, precision: str, shape: MeshShape, *, on_gpu: bool, compiles: bool, training: bool
) -> ParallelizeSteps:
    """The steps for ``policy.automodel_cfg`` (``cfg``) and ``policy.precision`` on a mesh.
    LoRA adapters go on the trained model only: the reference model is the base model.
    Under expert parallelism the decoder blocks stay eager: their MoE blocks run collectives
    and data-dependent expert loops (``expert_parallel``) that torch.compile would break on.
    ``reference_on_host``: the reference (``training`` False) keeps its weights in host memory
    through FSDP2's CPU offload, each block copied to the GPU for its forward and freed after
    it; eager, as its passes are bound by that copy."""
    ep = cfg.expert_parallel_size
    host_reference = not training and cfg.reference_on_host
    policy_fsdp = needs_fsdp(shape, cfg.cpu_offload)
    return ParallelizeSteps(
        lora=training and cfg.lora_cfg.enabled,
        tp=shape.tp > 1,
        context_parallel=shape.cp > 1,
        # With TP 1 there is nothing to split: ignored, as NeMo RL does (a config warning).
        sequence_parallel=shape.tp > 1 and cfg.sequence_parallel,
        expert_parallel=ep,
        activation_checkpointing=training and cfg.activation_checkpointing,
        # NeMo RL hands moe_parallelizer to Automodel only under EP
        save_router_outputs=training
        and cfg.activation_checkpointing
        and ep > 1
        and cfg.moe_parallelizer.ignore_router_for_ac is True,
        # Context parallel attention gathers K/V inside every block: kept eager as well.
        compile=compiles and ep == 1 and shape.cp == 1 and not host_reference,
        fsdp=policy_fsdp or host_reference,
        cpu_offload=cfg.cpu_offload or host_reference,
        fsdp_mixed_precision=policy_fsdp,
        reshard_every_block=host_reference,
        pin_memory=on_gpu,
        param_dtype=precision if on_gpu else None,
    )


@attrs.define
class BlockCompilations:
    """A worker's ahead-of-time block compilations (``aot_block.precompiled_blocks``), looked
    up by its first plain compiled model and shared by the models it builds after it: the
    reference model's blocks run the policy's loaded compilations (a second load of the same
    file otherwise)."""

    backend: Any  # the decoder blocks' torch.compile backend
    looked_up: bool = False
    pieces: PrecompiledPieces | None = None

    def preload(self) -> int:
        """An earlier run's kept compilations of the blocks, loaded now (the worker's setup
        calls it last, once the models, dynamo's settings and the parameters are final)
        rather than in the first step's first log-prob and train calls (0.3 s each on an
        H100). Each loads under the autocast its calls ran under (``preload``). Returns how
        many were loaded."""
        return self.pieces.preload() if self.pieces is not None else 0

    def kept_call_shapes(self) -> dict[bool, tuple[int, int]]:
        """Grad mode → (rows, columns) of the block call that built the preloaded
        compilation of that mode, as its index line recorded it: a call of that shape passes
        its guards, a smaller one may not (Inductor guards its fusion choices on the token
        count: docs/performance.md, item 3)."""
        calls = self.pieces.kept_calls.values() if self.pieces is not None else ()
        return {
            grad: (shape[0], shape[1]) for grad, shape in filter(None, calls) if len(shape) >= 2
        }


def compile_blocks(hf_model: Any, steps: ParallelizeSteps, kept: BlockCompilations) -> None:
    """The compile step (``steps.compile``): ``apply_compile``, ahead of time for plain blocks
    only (FSDP's hooks, the checkpoint wrapper and TP are not traced into one graph there)."""
    if not steps.compile:
        return
    plain = not (steps.fsdp or steps.activation_checkpointing or steps.tp)
    if plain and not kept.looked_up:
        from hpcrl.core.backends.automodel.aot_block import precompiled_blocks

        kept.pieces = precompiled_blocks(kept.backend)
        kept.looked_up = True
    apply_compile(hf_model, backend=kept.backend, precompiled=kept.pieces if plain else None)


def needs_fsdp(shape: MeshShape, cpu_offload: bool) -> bool:
    """FSDP only pays when there is something to shard or offload (as in torchtitan).

    With one data-parallel rank and no TP its per-block hooks, casts and reduce-scatters are
    pure overhead: they made the step CPU-bound (docs/performance.md, "Figures behind the code").
    """
    return shape.dp_size > 1 or shape.tp > 1 or shape.cp > 1 or cpu_offload


def apply_storage_dtype(hf_model: torch.nn.Module, dtype: torch.dtype) -> None:
    """Parameters stored in ``dtype``, buffers as they are (rotary ``inv_freq`` stays fp32).
    For the host-resident reference in the dtype its blocks compute in: half the host memory
    and half the bytes copied in per pass of fp32, and the same matmuls (autocast or FSDP's
    ``param_dtype`` rounds the weights to it anyway; a bf16 checkpoint loses nothing)."""
    for param in hf_model.parameters():
        param.data = param.data.to(dtype)


def apply_autocast(root: torch.nn.Module, compute_dtype: torch.dtype | None) -> None:
    """Mixed precision without FSDP, with FSDP's activations: fp32 weights, matmuls in
    ``compute_dtype``, and the residual stream in ``compute_dtype`` from the embedding's
    output on, as FSDP's ``param_dtype`` makes it (a lookup of weights rounded to bf16 is the
    lookup rounded). Autocast alone leaves it fp32, from the fp32 embedding: one GPU then
    trained with other numbers than two, and every add, norm and their gradients moved twice
    the bytes (docs/performance.md, item 1). ``root.residual_cast``: the hook's handle."""
    import functools

    root.autocast_dtype = compute_dtype
    if compute_dtype is not None:
        embeddings = root.hf.get_input_embeddings()
        cast = functools.partial(_output_in, compute_dtype)
        root.residual_cast = embeddings.register_forward_hook(cast)


def _output_in(dtype: torch.dtype, module: Any, args: Any, output: torch.Tensor) -> torch.Tensor:
    return output.to(dtype) if output.is_floating_point() else output


def fsdp_policies(
    param_dtype: torch.dtype | None, cpu_offload: bool, *, pin_memory: bool = True
) -> dict[str, Any]:
    """``fully_shard``'s mixed-precision and offload arguments (all but the mesh).
    ``pin_memory`` False on a CPU-only machine, which cannot page-lock."""
    import torch
    from torch.distributed.fsdp import CPUOffloadPolicy, MixedPrecisionPolicy

    kwargs: dict[str, Any] = {}
    if param_dtype is not None:
        kwargs["mp_policy"] = MixedPrecisionPolicy(
            param_dtype=param_dtype, reduce_dtype=torch.float32
        )
    if cpu_offload:
        kwargs["offload_policy"] = CPUOffloadPolicy(pin_memory=pin_memory)
    return kwargs


def apply_fsdp(
    root: torch.nn.Module,
    hf_model: Any,
    dp_mesh: DeviceMesh,
    *,
    param_dtype: torch.dtype | None,
    cpu_offload: bool,
    reshard_every_block: bool = False,
    pin_memory: bool = True,
) -> None:
    """``fully_shard`` every decoder block, then ``root`` (embeddings, norm, lm_head).

    ``param_dtype`` set: compute in it with fp32 gradient reduction. Build the optimizer
    right after this call (see training-stack-facts, trap 1). ``reshard_every_block``: each
    block frees its gathered weights after its forward even on one rank.
    """
    from torch.distributed.fsdp import fully_shard

    policies = fsdp_policies(param_dtype, cpu_offload, pin_memory=pin_memory)
    kwargs: dict[str, Any] = {"mesh": dp_mesh, **policies}
    layers = decoder_layers(hf_model)
    # With one data-parallel rank there is nothing to free by resharding, only copies to redo
    # (unless the shard lives on the host: then the gathered copy is all the GPU holds).
    sharded = dp_mesh.size() > 1 or reshard_every_block
    for index, layer in enumerate(layers):
        # The last block is resharded right away anyway: backward starts with it.
        fully_shard(layer, reshard_after_forward=sharded and index < len(layers) - 1, **kwargs)
    fully_shard(root, **kwargs)
