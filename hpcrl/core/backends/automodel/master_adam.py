"""``MasterWeightAdam``: torch's Adam/AdamW over fp32 weights that compute through bf16
copies (``master_weights``), stepped by one Triton kernel per parameter that applies the clip
factor, updates the weight and its moments and writes the new copy.

Imports Triton (and jits its kernels at import: under ``TRITON_INTERPRET=1`` they run in
Triton's CPU interpreter, as the tests do): the worker imports this module only where it is
used (a GPU, no FSDP).
"""

from __future__ import annotations

from collections.abc import Callable, Iterable, Iterator
from typing import Any

import torch
import triton
import triton.language as tl
from torch import nn

from hpcrl.core.backends.automodel.grad_norm import GlobalNorm
from hpcrl.core.backends.automodel.master_weights import ComputeCopies

#: Elements per program of the optimizer kernel.
BLOCK_NUMEL = 2048


class MasterWeightAdam(torch.optim.Adam):
    """torch's Adam/AdamW (same state, same ``state_dict``: checkpoints load either way) over
    fp32 weights whose gradients may be their bf16 copies' (``ComputeCopies``). One Triton
    kernel per parameter: clip factor, (decoupled) weight decay, moments, update, new copy.
    ``clip_before_step`` sets the clip factor on the device (no host wait); no amsgrad,
    maximize, capturable or differentiable (``master_weights.takes_master_weights``)."""

    def __init__(self, params: Iterable[nn.Parameter], copies: ComputeCopies, **kwargs: Any):
        # foreach/fused None, torch's defaults: what a checkpoint of this optimizer hands
        # torch's own class when a run resumes without copies (False would pin its slowest path)
        super().__init__(params, foreach=None, fused=None, **kwargs)
        self.copies = copies
        self._clip_factor: torch.Tensor | None = None
        # one launch per dtype (``grad_norm``); None: torch's per-tensor norms (a benchmark row)
        self.global_norm: GlobalNorm | None = GlobalNorm()

    def load_state_dict(self, state_dict: dict[str, Any]) -> None:
        """torch's, then this class's own flags and every ``step`` on the host: a checkpoint
        of torch's fused Adam keeps its steps on the GPU, where reading one per parameter
        and step would be a host wait each."""
        super().load_state_dict(state_dict)
        for group in self.param_groups:
            group["foreach"] = group["fused"] = None
        for state in self.state.values():
            if "step" in state:
                state["step"] = state["step"].to("cpu", torch.float32)

    def _trained(self) -> Iterator[tuple[dict[str, Any], nn.Parameter, torch.Tensor]]:
        for group in self.param_groups:
            for param in group["params"]:
                grad = self.copies.gradient_of(param)
                if grad is not None:
                    yield group, param, grad

    @torch.no_grad()
    def clip_before_step(self, max_norm: float | None) -> torch.Tensor:
        """The gradients' global L2 norm (a device tensor); with ``max_norm``, the next step
        scales them by ``clip_grads_with_norm_``'s factor (none for a non-finite norm)."""
        grads = [grad for _, _, grad in self._trained()]
        if not grads:
            return torch.zeros(())
        if self.global_norm is not None and GlobalNorm.takes(grads):
            norm = self.global_norm(grads)
        else:
            norms = torch._foreach_norm(grads, 2.0, dtype=torch.float32)
            norm = torch.linalg.vector_norm(torch.stack(norms))
        if max_norm is not None and max_norm > 0:
            factor = torch.clamp(max_norm / (norm + 1e-6), max=1.0)
            self._clip_factor = torch.where(torch.isfinite(norm), factor, torch.ones_like(norm))
        return norm

    @torch.no_grad()
    def step(self, closure: Any = None) -> None:
        assert closure is None, "no closure: the worker computes the loss before the step"
        self.step_in_stages([[param for group in self.param_groups for param in group["params"]]])

    @torch.no_grad()
    def step_in_stages(
        self, stages: list[list[nn.Parameter]], stage_done: Callable[[int], None] | None = None
    ) -> list[torch.Tensor]:
        """``step`` over ``stages`` (every parameter in one of them), calling ``stage_done(i)``
        after stage i's launches; returns the device tensors the launches read and that
        nothing else holds after ``zero_grad`` (the gradients, the clip factor): on another
        stream they must live until it is done (``side_stream_adam``)."""
        factor = self._clip_factor
        trained = {id(param): (group, param, grad) for group, param, grad in self._trained()}
        for _, param, _ in trained.values():
            if not self.state[param]:  # on the current stream: whatever stream steps it
                self.state[param].update(
                    step=torch.zeros((), dtype=torch.float32),
                    exp_avg=torch.zeros_like(param, memory_format=torch.preserve_format),
                    exp_avg_sq=torch.zeros_like(param, memory_format=torch.preserve_format),
                )
        if factor is None and trained:
            factor = torch.ones((), device=next(iter(trained.values()))[1].device)
        read = [factor] if factor is not None else []
        for index, stage in enumerate(stages):
            for param in stage:
                if id(param) not in trained:
                    continue
                group, _, grad = trained[id(param)]
                assert not group["amsgrad"] and not group["maximize"], "takes_master_weights"
                state = self.state[param]
                state["step"] += 1
                _launch(group, param, grad, state, self.copies.copy_of.get(id(param)), factor)
                read.append(grad)
            if stage_done is not None:
                stage_done(index)
        self._clip_factor = None
        return read

    def zero_grad(self, set_to_none: bool = True) -> None:
        super().zero_grad(set_to_none=set_to_none)
        self.copies.drop_gradients()


def _launch(
    group: dict[str, Any],
    param: torch.Tensor,
    grad: torch.Tensor,
    state: dict[str, torch.Tensor],
    copy: torch.Tensor | None,
    factor: torch.Tensor,
) -> None:
    numel = param.numel()
    assert param.is_contiguous() and grad.is_contiguous() and numel < 2**31, param.shape
    beta1, beta2 = group["betas"]
    step = float(state["step"])  # a host tensor: no wait
    decoupled = bool(group.get("decoupled_weight_decay", False))
    _adam_kernel[(triton.cdiv(numel, BLOCK_NUMEL),)](
        param, grad, state["exp_avg"], state["exp_avg_sq"],
        copy if copy is not None else param, factor, numel,
        float(group["lr"]), beta1, beta2, group["eps"], group["weight_decay"],
        1 - beta1**step, (1 - beta2**step) ** 0.5,
        DECOUPLED=decoupled, HAS_COPY=copy is not None, BLOCK=BLOCK_NUMEL,
    )  # fmt: skip


@triton.jit
def _adam_kernel(
    param_ptr, grad_ptr, exp_avg_ptr, exp_avg_sq_ptr, copy_ptr, factor_ptr, numel,
    lr, beta1, beta2, eps, weight_decay, bias_correction1, bias_correction2_sqrt,
    DECOUPLED: tl.constexpr, HAS_COPY: tl.constexpr, BLOCK: tl.constexpr,
):  # fmt: skip
    """torch's single-tensor Adam step on one parameter, its gradient scaled by the clip
    factor first; DECOUPLED: AdamW's weight decay."""
    offsets = tl.program_id(0) * BLOCK + tl.arange(0, BLOCK)
    inside = offsets < numel
    param = tl.load(param_ptr + offsets, mask=inside)
    grad = tl.load(grad_ptr + offsets, mask=inside).to(tl.float32) * tl.load(factor_ptr)
    if DECOUPLED:
        param = param * (1 - lr * weight_decay)
    else:
        grad = grad + weight_decay * param
    exp_avg = tl.load(exp_avg_ptr + offsets, mask=inside)
    exp_avg = exp_avg + (1 - beta1) * (grad - exp_avg)  # lerp, as torch's Adam
    exp_avg_sq = tl.load(exp_avg_sq_ptr + offsets, mask=inside)
    exp_avg_sq = exp_avg_sq * beta2 + (1 - beta2) * grad * grad
    denom = tl.sqrt(exp_avg_sq) / bias_correction2_sqrt + eps
    param = param - (lr / bias_correction1) * exp_avg / denom  # addcdiv_'s order
    tl.store(param_ptr + offsets, param, mask=inside)
    tl.store(exp_avg_ptr + offsets, exp_avg, mask=inside)
    tl.store(exp_avg_sq_ptr + offsets, exp_avg_sq, mask=inside)
    if HAS_COPY:
        tl.store(copy_ptr + offsets, _bf16_nearest_even(param), mask=inside)


@triton.jit
def _bf16_nearest_even(value):
    """fp32 to bf16 rounded to nearest, ties to even, as torch's ``.to(torch.bfloat16)``
    and autocast round: spelled out because Triton's interpreter (the CPU tests) truncates
    whatever rounding ``.to`` is asked for. NaN stays NaN."""
    bits = value.to(tl.uint32, bitcast=True)
    rounded = (bits + 0x7FFF + ((bits >> 16) & 1)) >> 16
    nearest = rounded.to(tl.uint16).to(tl.bfloat16, bitcast=True)
    return tl.where(value != value, value.to(tl.bfloat16), nearest)
