"""One rank's model: the Hugging Face checkpoint loaded, then parallelized in torchtitan's
order (TP → activation checkpointing → compile → FSDP) as ``parallelize.parallelize_steps``
plans it for the recipe. The worker builds its policy here, and its reference model."""

from __future__ import annotations

from typing import TYPE_CHECKING, Any

import attrs

from hpcrl.core.backends.automodel.causal_attention import apply_causal_attention
from hpcrl.core.backends.automodel.context_parallel import apply_context_parallel
from hpcrl.core.backends.automodel.expert_parallel import (
    apply_expert_parallel,
    pin_backward_prefetch,
    router_saving_context,
)
from hpcrl.core.backends.automodel.logprobs import unloaded_hf_model
from hpcrl.core.backends.automodel.lora import apply_lora, lora_summary
from hpcrl.core.backends.automodel.master_weights import apply_compute_copies
from hpcrl.core.backends.automodel.model import TokenLogprobModel, load_hf_model
from hpcrl.core.backends.automodel.parallelize import (
    BlockCompilations,
    MeshShape,
    ParallelizeSteps,
    apply_activation_checkpointing,
    apply_autocast,
    apply_fsdp,
    apply_storage_dtype,
    apply_tp,
    compile_blocks,
    data_parallel_mesh,
    fsdp_policies,
    parallelize_steps,
)

if TYPE_CHECKING:
    from hpcrl.config.recipe import Recipe


@attrs.frozen
class RankPlacement:
    """Where one rank's model lives: its rank and device kind, the mesh and its shape, the
    expert-parallel mesh (None without expert parallelism)."""

    rank: int
    device: str  # "cuda" or "cpu"
    shape: MeshShape
    mesh: Any
    ep_mesh: Any


def build_sharded_model(
    recipe: Recipe,
    placement: RankPlacement,
    model_path: str,
    block_compilations: BlockCompilations,
    *,
    compiles: bool,
    training: bool,
    unloaded: bool = False,
    master_weights: bool = False,
) -> TokenLogprobModel:
    """Load, then parallelize. ``unloaded``: no weight read (``logprobs.unloaded_hf_model``),
    the caller fills them. ``master_weights``: the trained linear weights compute through bf16
    copies (``master_weights``) where nothing shards or wraps them (no FSDP, TP, LoRA,
    expert or context parallelism); ``root.compute_copies`` says whether they do."""
    import torch

    dtypes = {"float32": torch.float32, "bfloat16": torch.bfloat16, "float16": torch.float16}
    policy = recipe.policy
    steps = parallelize_steps(
        policy.automodel_cfg,
        policy.precision,
        placement.shape,
        on_gpu=placement.device == "cuda",
        compiles=compiles,
        training=training,
    )
    # A reference bound for host memory is built there: FSDP moves it block by block
    # through the GPU to its host shards, never the whole model at once.
    built_on = "cpu" if steps.reshard_every_block else placement.device
    if unloaded:
        hf_model = unloaded_hf_model(model_path, built_on, policy.hf_config_overrides)
    else:
        hf_model = load_hf_model(
            model_path, built_on, policy.hf_config_overrides,
            dequantize=policy.dequantize_base_checkpoint,
        )  # fmt: skip
    if steps.lora:
        adapted = apply_lora(hf_model, policy.automodel_cfg.lora_cfg)
        if placement.rank == 0:
            print(lora_summary(adapted, hf_model), flush=True)
    param_dtype: torch.dtype | None = (
        dtypes[steps.param_dtype] if steps.param_dtype is not None else None
    )
    if steps.context_parallel:
        apply_context_parallel(hf_model)
    else:
        apply_causal_attention(hf_model)
    if steps.tp:
        apply_tp(hf_model, placement.mesh["tp"], sequence_parallel=steps.sequence_parallel)
    if steps.expert_parallel > 1:
        assert placement.ep_mesh is not None
        policies = fsdp_policies(param_dtype, steps.cpu_offload, pin_memory=steps.pin_memory)
        apply_expert_parallel(hf_model, placement.ep_mesh, policies)
    if steps.activation_checkpointing:
        saving = router_saving_context(hf_model) if steps.save_router_outputs else None
        apply_activation_checkpointing(hf_model, saving)
    if steps.reshard_every_block and param_dtype is not None:
        apply_storage_dtype(hf_model, param_dtype)
    copies = None
    if master_weights and _plain_bf16_training(steps, training):
        copies = apply_compute_copies(hf_model, torch.bfloat16)
        if placement.rank == 0:
            print(f"mixed precision: {len(copies)} linear weights compute through bf16 copies "
                  "that the optimizer steps with their fp32 weights", flush=True)  # fmt: skip
    compile_blocks(hf_model, steps, block_compilations)
    root = TokenLogprobModel(hf_model, compute_copies=copies)
    if steps.fsdp:
        apply_fsdp(
            root,
            hf_model,
            data_parallel_mesh(placement.mesh, placement.shape),
            param_dtype=param_dtype if steps.fsdp_mixed_precision else None,
            cpu_offload=steps.cpu_offload,
            reshard_every_block=steps.reshard_every_block,
            pin_memory=steps.pin_memory,
        )
        if steps.expert_parallel > 1:
            pin_backward_prefetch(hf_model)
    if not steps.fsdp_mixed_precision:
        apply_autocast(root, param_dtype)
    # A compiled reference keeps requires_grad as loaded (its passes run under no_grad
    # only): frozen, it failed the guards of the policy's log-prob graph and compiled a
    # graph of its own in every run's first step (docs/performance.md, item 3).
    if not training and not steps.compile:
        root.requires_grad_(False)
    return root


def _plain_bf16_training(steps: ParallelizeSteps, training: bool) -> bool:
    plain = not (steps.fsdp or steps.tp or steps.lora or steps.context_parallel)
    return training and plain and steps.expert_parallel == 1 and steps.param_dtype == "bfloat16"
