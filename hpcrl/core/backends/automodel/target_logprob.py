"""``target_logprobs``: ``log_softmax(logits / T)`` at each row's target, straight from bf16
logits in one Triton pass each way.

The unfused head casts a chunk's bf16 logits to float32, runs a log-softmax kernel that writes
the float32 log-probs of the whole vocabulary (kept for backward), and in backward writes a
float32 one-hot, a float32 gradient and casts it back to bf16: ~8 bytes moved per logit each
way, ~3.5 ms of a 1.1B train step of 4 x 2048 tokens on an H100 (docs/performance.md, issue 25
item 1). Here forward reads the bf16 logits once (an online max/sum in float32) and keeps only
each row's logsumexp; backward reads them again and writes the bf16 gradient, rounded to
nearest even as the cast it replaces rounds.

Imports Triton and jits its kernels at import (``TRITON_INTERPRET=1``: Triton's CPU
interpreter, as the tests run them): ``model`` imports this module only for CUDA bf16 logits.
"""

from __future__ import annotations

import torch
import triton
import triton.language as tl

from hpcrl.core.backends.automodel.master_adam import _bf16_nearest_even

#: Vocabulary entries a program reads at a time (its online softmax loops over the rest).
BLOCK_VOCAB = 4096


def target_logprobs(
    logits: torch.Tensor, targets: torch.Tensor, temperature: float
) -> torch.Tensor:
    """float32 ``[...]``: ``log_softmax(logits.float() / temperature)[..., target]`` of bf16
    ``logits [..., V]``; differentiable in ``logits`` (bf16 gradient)."""
    return _TargetLogprob.apply(logits, targets, float(temperature))


class _TargetLogprob(torch.autograd.Function):
    @staticmethod
    def forward(ctx, logits: torch.Tensor, targets: torch.Tensor, temperature: float):
        assert logits.dtype == torch.bfloat16, logits.dtype
        rows = logits.reshape(-1, logits.shape[-1])
        if rows.stride(-1) != 1:
            rows = rows.contiguous()
        flat_targets = targets.reshape(-1).contiguous()
        out = torch.empty(rows.shape[0], dtype=torch.float32, device=rows.device)
        logsumexp = torch.empty_like(out)
        if rows.shape[0]:
            _forward_kernel[(rows.shape[0],)](
                rows, flat_targets, out, logsumexp, rows.shape[1], rows.stride(0),
                temperature, BLOCK=min(BLOCK_VOCAB, triton.next_power_of_2(rows.shape[1])),
            )  # fmt: skip
        ctx.save_for_backward(rows, flat_targets, logsumexp)
        ctx.temperature = temperature
        ctx.logits_shape = logits.shape
        return out.view(targets.shape)

    @staticmethod
    def backward(ctx, grad_out: torch.Tensor):
        rows, flat_targets, logsumexp = ctx.saved_tensors
        grad_rows = torch.empty(rows.shape, dtype=rows.dtype, device=rows.device)
        if rows.shape[0]:
            _backward_kernel[(rows.shape[0],)](
                rows, flat_targets, logsumexp, grad_out.reshape(-1).contiguous(), grad_rows,
                rows.shape[1], rows.stride(0), ctx.temperature,
                BLOCK=min(BLOCK_VOCAB, triton.next_power_of_2(rows.shape[1])),
            )  # fmt: skip
        return grad_rows.view(ctx.logits_shape), None, None


@triton.jit
def _forward_kernel(
    logits_ptr, targets_ptr, out_ptr, logsumexp_ptr, vocab, row_stride, temperature,
    BLOCK: tl.constexpr,
):  # fmt: skip
    """One row: logsumexp of the scaled logits (online max and sum), then the target's."""
    row = tl.program_id(0).to(tl.int64)
    base = logits_ptr + row * row_stride
    running_max = tl.full((), float("-inf"), tl.float32)
    running_sum = tl.zeros((), tl.float32)
    for start in range(0, vocab, BLOCK):
        offsets = start + tl.arange(0, BLOCK)
        scaled = _scaled(base, offsets, vocab, temperature)
        new_max = tl.maximum(running_max, tl.max(scaled, axis=0))
        running_sum = running_sum * tl.exp(running_max - new_max) + tl.sum(
            tl.exp(scaled - new_max), axis=0
        )
        running_max = new_max
    logsumexp = running_max + tl.log(running_sum)
    target = tl.load(targets_ptr + row)
    # a target outside the vocabulary reads nothing and scores NaN
    target_logit = (
        tl.load(base + target, mask=(target >= 0) & (target < vocab), other=float("nan")).to(
            tl.float32
        )
        / temperature
    )
    tl.store(logsumexp_ptr + row, logsumexp)
    tl.store(out_ptr + row, target_logit - logsumexp)


@triton.jit
def _backward_kernel(
    logits_ptr, targets_ptr, logsumexp_ptr, grad_out_ptr, grad_ptr, vocab, row_stride,
    temperature, BLOCK: tl.constexpr,
):  # fmt: skip
    """One row: d out / d logit_j = (1[j = target] - softmax_j) / T, times the row's grad."""
    row = tl.program_id(0).to(tl.int64)
    base = logits_ptr + row * row_stride
    logsumexp = tl.load(logsumexp_ptr + row)
    grad_out = tl.load(grad_out_ptr + row)
    target = tl.load(targets_ptr + row)
    for start in range(0, vocab, BLOCK):
        offsets = start + tl.arange(0, BLOCK)
        probs = tl.exp(_scaled(base, offsets, vocab, temperature) - logsumexp)
        grad = (tl.where(offsets == target, 1.0, 0.0) - probs) * grad_out / temperature
        tl.store(grad_ptr + row * vocab + offsets, _bf16_nearest_even(grad), mask=offsets < vocab)


@triton.jit
def _scaled(base, offsets, vocab, temperature):
    """float32 logits of one block divided by the temperature; -inf past the vocabulary."""
    logits = tl.load(base + offsets, mask=offsets < vocab, other=float("-inf"))
    return logits.to(tl.float32) / temperature  # a division, as ``scale_logits`` divides
