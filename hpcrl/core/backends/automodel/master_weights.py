"""Compute copies of the linear weights, kept by the optimizer: mixed precision without a
cast per forward, for the Automodel backend on one GPU without FSDP.

Why: with fp32 weights under ``torch.autocast`` every train forward casts each linear weight
to bf16 (read 4 bytes, write 2), its backward casts the bf16 weight gradient back to fp32
(read 2, write 4), clipping reads the fp32 gradients and writes them scaled (12 bytes), and
AdamW reads and writes the rest (28 bytes): ~52 bytes of memory traffic per parameter and step
besides the matmuls, which a plain loop pays too (docs/performance.md, issue 25 item 1). Here
each trained ``nn.Linear`` computes with a persistent bf16 copy of its weight
(``ComputeCopyLinear``; the copy is a non-persistent buffer, so state dicts, checkpoints, refit
and the reference model still see only the fp32 weights), the gradient lands on the copy in
bf16, and ``master_adam.MasterWeightAdam`` steps the fp32 weight from it in one Triton kernel per
parameter that also applies the clip factor and writes the new bf16 copy: ~30 bytes.

The numbers are autocast's: the copy holds the weight rounded to bf16 as autocast's cast
does, the bf16 weight gradient is the one autocast's backward would widen to fp32 unchanged,
and the clip factor multiplies it in fp32 as ``clip_grads_with_norm_`` does. With several
micro-batches a step's gradients are summed in fp32 on the fp32 weight (a hook per copy), as
autocast's fp32 gradients sum. A copy whose fp32 weight was written by anything but this
optimizer (a checkpoint load: any in-place write moves the tensor's version counter) is
copied again before the next forward.

Embeddings, norms, biases and tied weights stay as they were: fp32 parameters under autocast
(which casts a bias, or a tied lm_head, where a matmul uses it, as before); their fp32
gradients go through the same kernel without a copy. (The embedding's output is cast to bf16
by ``parallelize.apply_autocast``: the residual stream is bf16 either way.)
"""

from __future__ import annotations

from typing import Any

import torch
import torch.nn.functional as F
from torch import nn


class ComputeCopyLinear(nn.Linear):
    """``nn.Linear`` that multiplies by ``compute_weight`` (a bf16 copy of ``weight``)."""

    compute_weight: torch.Tensor

    def forward(self, input: torch.Tensor) -> torch.Tensor:  # noqa: A002 - nn.Linear's name
        return F.linear(input, self.compute_weight, self.bias)


class ComputeCopies:
    """The fp32 weights that compute through a bf16 copy, and those copies."""

    def __init__(self, pairs: list[tuple[nn.Parameter, torch.Tensor]]) -> None:
        self.copy_of = {id(weight): copy for weight, copy in pairs}
        self.weight_of = {id(copy): weight for weight, copy in pairs}
        self.pairs = pairs
        self._versions = {id(weight): weight._version for weight, _ in pairs}
        self.sum_in_fp32 = False
        for _, copy in pairs:
            copy.register_post_accumulate_grad_hook(self._summed_in_fp32)

    def __len__(self) -> int:
        return len(self.pairs)

    def refresh(self) -> int:
        """Copy again every weight written since its copy was made; returns how many."""
        stale = [(w, c) for w, c in self.pairs if w._version != self._versions[id(w)]]
        with torch.no_grad():
            for weight, copy in stale:
                copy.copy_(weight)
                self._versions[id(weight)] = weight._version
        return len(stale)

    def gradient_of(self, weight: torch.Tensor) -> torch.Tensor | None:
        """The step's gradient of ``weight``: its own (fp32: no copy, or summed over
        micro-batches), else its copy's (bf16)."""
        if weight.grad is not None:
            return weight.grad
        copy = self.copy_of.get(id(weight))
        return None if copy is None else copy.grad

    def drop_gradients(self) -> None:
        for _, copy in self.pairs:
            copy.grad = None

    def _summed_in_fp32(self, copy: torch.Tensor) -> None:
        if not self.sum_in_fp32 or copy.grad is None:
            return
        weight = self.weight_of[id(copy)]
        if weight.grad is None:
            weight.grad = copy.grad.float()
        else:
            weight.grad.add_(copy.grad)
        copy.grad = None


def apply_compute_copies(hf_model: nn.Module, dtype: torch.dtype) -> ComputeCopies:
    """Every trained fp32 ``nn.Linear`` of ``hf_model`` whose weight no other module uses
    becomes a ``ComputeCopyLinear`` with a ``dtype`` copy of its weight."""
    uses: dict[int, int] = {}
    for module in hf_model.modules():
        for param in module.parameters(recurse=False):
            uses[id(param)] = uses.get(id(param), 0) + 1
    pairs = []
    for module in hf_model.modules():
        weight = getattr(module, "weight", None)
        if type(module) is not nn.Linear or not isinstance(weight, nn.Parameter):
            continue
        if not weight.requires_grad or weight.dtype != torch.float32 or uses[id(weight)] > 1:
            continue
        copy = weight.detach().to(dtype).requires_grad_(True)
        module.__class__ = ComputeCopyLinear
        module.register_buffer("compute_weight", copy, persistent=False)
        pairs.append((weight, copy))
    return ComputeCopies(pairs)


def takes_master_weights(recipe: Any, on_gpu: bool) -> bool:
    """Whether the recipe trains through compute copies (the module docstring): a GPU, bf16,
    torch's Adam/AdamW with plain arguments, no optimizer offload of either kind. What
    ``build_sharded_model`` adds (no FSDP, TP, LoRA, ...) it checks itself."""
    from hpcrl.config.optimizers import class_name

    policy = recipe.policy
    cfg = policy.automodel_cfg
    optimizer = policy.optimizer
    return (
        on_gpu
        and policy.precision == "bfloat16"
        and optimizer is not None
        and class_name(optimizer.name) in ("Adam", "AdamW")
        and set(optimizer.kwargs) <= ADAM_KWARGS
        and not cfg.cpu_offload
        and cfg.optimizer_offload_fraction <= 0
    )


#: Adam/AdamW arguments ``master_adam.MasterWeightAdam`` steps exactly as torch does.
ADAM_KWARGS = frozenset({"lr", "betas", "eps", "weight_decay", "fused", "foreach"})


def head_weight(head: nn.Module) -> torch.Tensor:
    """What the log-prob head multiplies by: the copy where the lm_head has one."""
    return head.compute_weight if isinstance(head, ComputeCopyLinear) else head.weight
