"""Forward/backward of the Megatron backend: token log-probs on the TP-sharded vocab, the
training step through ``get_forward_backward_func`` (any PP schedule), and log-probs only.

Loss scaling: megatron's schedule divides each micro-batch loss by the number of
micro-batches and DDP scales gradients by 1/DP before summing. ``LossFn`` losses are already
normalised by the global token count, so the step multiplies them by micro-batches × DP:
the gradients are then those of the sum over all shards, i.e. of the whole global batch.
"""

from __future__ import annotations

from collections.abc import Sequence
from typing import Any

import torch
import torch.nn.functional as F

from hpcrl.core.metric_reduction import accumulate, all_reduce_metrics
from hpcrl.core.policy import UNFILTERED_LOGPROBS_KEY, Batch, LossFn
from hpcrl.core.token_distribution import (
    TokenDistribution,
    scale_logits,
    token_logprobs_from_logits,
)
from hpcrl.core.workers.micro_batches import unpack_logprobs


def token_logprobs(
    logits: torch.Tensor, input_ids: torch.Tensor, distribution: TokenDistribution
) -> tuple[torch.Tensor, torch.Tensor]:
    """(processed, unfiltered) log p(input_ids[:, t] | <t) from vocab-parallel logits
    [b, T, V/TP] under ``distribution`` (``hpcrl.core.token_distribution``); column 0 is 0.

    Without top-k/top-p: the logits are divided by the temperature and megatron's
    ``vocab_parallel_cross_entropy`` computes the log-softmax across the TP group (max and
    sum-exp all-reduced, the target logit taken from the rank owning it) with its own
    backward, so no rank ever holds full-vocab logits. With top-k/top-p the filter needs
    the whole vocabulary: the TP shards are gathered (autograd-aware) first.
    """
    from megatron.core.tensor_parallel import (
        gather_from_tensor_model_parallel_region,
        vocab_parallel_cross_entropy,
    )

    targets = input_ids[:, 1:].contiguous()
    if distribution.filters:
        full = gather_from_tensor_model_parallel_region(logits[:, :-1].float())
        processed, unfiltered = token_logprobs_from_logits(full, targets, distribution)
        return F.pad(processed, (1, 0)), F.pad(unfiltered, (1, 0))
    # A copy: the megatron function normalises its input in place.
    shifted = logits[:, :-1].to(torch.float32, copy=True)
    shifted = scale_logits(shifted, distribution.temperature).contiguous()
    tail = F.pad(-vocab_parallel_cross_entropy(shifted, targets), (1, 0))
    return tail, tail


def _device() -> torch.device:
    if torch.cuda.is_available():
        return torch.device("cuda", torch.cuda.current_device())
    return torch.device("cpu")


def _to_device(micro_batch: Batch) -> dict[str, torch.Tensor]:
    device = _device()
    return {key: value.to(device, non_blocking=True) for key, value in micro_batch.items()}


def _forward(model: Any, micro_batch: Batch) -> torch.Tensor:
    """Logits of one micro-batch. A pack (``hpcrl.core.workers.micro_batches``) runs as one
    [1, L] row in megatron's THD layout: ``PackedSeqParams`` restarts RoPE and confines
    attention at every ``cu_seqlens`` boundary."""
    if "packed_input_ids" in micro_batch:
        return model(
            micro_batch["packed_input_ids"],
            micro_batch["packed_position_ids"],
            None,
            packed_seq_params=packed_seq_params(micro_batch["cu_seqlens"]),
        )
    input_ids = micro_batch["input_ids"]
    # Right-padded sequences under a causal mask: padding never influences earlier tokens,
    # so no attention mask is needed (local spec builds the causal one).
    positions = torch.arange(input_ids.shape[1], device=input_ids.device).unsqueeze(0)
    return model(input_ids, positions.expand_as(input_ids), None)


def packed_seq_params(cu_seqlens: torch.Tensor) -> Any:
    from megatron.core.packed_seq_params import PackedSeqParams

    longest = int((cu_seqlens[1:] - cu_seqlens[:-1]).max())
    return PackedSeqParams(
        qkv_format="thd",
        cu_seqlens_q=cu_seqlens,
        cu_seqlens_kv=cu_seqlens,
        max_seqlen_q=longest,
        max_seqlen_kv=longest,
    )


def micro_batch_logprobs(
    output: torch.Tensor, micro_batch: Batch, distribution: TokenDistribution
) -> tuple[torch.Tensor, torch.Tensor]:
    """(processed, unfiltered) [rows, width] token log-probs from a micro-batch's logits,
    unpacked to its rows if it is a pack."""
    if "packed_input_ids" not in micro_batch:
        return token_logprobs(output, micro_batch["input_ids"], distribution)
    processed, unfiltered = token_logprobs(output, micro_batch["packed_input_ids"], distribution)
    return unpack_logprobs(processed, micro_batch), unpack_logprobs(unfiltered, micro_batch)


def _shape_of(micro_batches: Sequence[Batch]) -> tuple[int, int]:
    """(seq_length, micro_batch_size) megatron's schedules size pipeline buffers with."""
    first = micro_batches[0]
    if "packed_input_ids" in first:
        return first["packed_input_ids"].shape[1], 1
    return first["input_ids"].shape[1], first["input_ids"].shape[0]


def _result_rank_flags() -> tuple[bool, bool]:
    """(this rank computes the loss, this rank is the one that reports it for its DP rank)."""
    from megatron.core import parallel_state as ps

    last = ps.is_pipeline_last_stage(ignore_virtual=True)
    reporter = (
        last and ps.get_tensor_model_parallel_rank() == 0 and ps.get_context_parallel_rank() == 0
    )
    return last, reporter


def run_train_microbatches(
    model_chunks: list,
    micro_batches: Sequence[Batch],
    loss_fn: LossFn,
    num_global_tokens: float,
    distribution: TokenDistribution | None = None,
) -> dict[str, float]:
    """Forward/backward every micro-batch; returns loss and loss_fn metrics summed over the
    global batch (same dict on every rank). Gradients are left in the DDP buffers.
    ``distribution``: what the log-probs are measured in (default: the model's own)."""
    distribution = distribution or TokenDistribution()
    from megatron.core import parallel_state as ps
    from megatron.core.pipeline_parallel import get_forward_backward_func

    scale = len(micro_batches) * ps.get_data_parallel_world_size()
    # Device tensors (or floats) summed over micro-batches: one read-back per step, in
    # ``_sum_over_reporters``, not one host wait per micro-batch.
    totals: dict[str, Any] = {}

    def loss_func(micro_batch, output_tensor):
        logprobs, unfiltered = micro_batch_logprobs(output_tensor, micro_batch, distribution)
        if distribution.filters:
            micro_batch[UNFILTERED_LOGPROBS_KEY] = unfiltered
        loss, metrics = loss_fn(logprobs, micro_batch, num_global_tokens)
        accumulate(totals, "loss", loss.detach())
        for name, value in metrics.items():
            accumulate(totals, name, value.detach() if isinstance(value, torch.Tensor) else value)
        return loss * scale, {}

    def forward_step(data_iterator, model):
        micro_batch = _to_device(next(data_iterator))
        output = _forward(model, micro_batch)
        return output, lambda output_tensor: loss_func(micro_batch, output_tensor)

    for chunk in model_chunks:
        chunk.zero_grad_buffer()
    seq_length, micro_batch_size = _shape_of(micro_batches)
    get_forward_backward_func()(
        forward_step_func=forward_step,
        data_iterator=iter(micro_batches),
        model=model_chunks,
        num_microbatches=len(micro_batches),
        seq_length=seq_length,
        micro_batch_size=micro_batch_size,
        forward_only=False,
    )
    return _sum_over_reporters(totals)


def _sum_over_reporters(totals: dict[str, Any]) -> dict[str, float]:
    """Sum each value (float or 0-dim device tensor; extrema: min/max,
    hpcrl.core.metric_reduction) over the DP reporters; every rank gets the result."""
    import torch.distributed as dist

    _, reporter = _result_rank_flags()
    names = sorted(totals) if reporter else []
    # Every rank must agree on the names: take them from global rank of a reporter.
    name_lists: list[list[str] | None] = [None] * dist.get_world_size()
    dist.all_gather_object(name_lists, names)
    all_names = sorted({n for lst in name_lists if lst for n in lst})
    # On the backend's device: NCCL reduces only CUDA tensors.
    return all_reduce_metrics(totals, all_names, _device(), contributes=reporter)


def compute_logprobs(
    model_chunks: list,
    micro_batches: Sequence[Batch],
    distribution: TokenDistribution | None = None,
) -> list[torch.Tensor] | None:
    """Token log-probs of each micro-batch ([rows, width], float32, on the device: the caller
    reads them back once) on the reporting rank, else None."""
    from megatron.core.pipeline_parallel import get_forward_backward_func

    distribution = distribution or TokenDistribution()
    collected: list[torch.Tensor] = []

    def forward_step(data_iterator, model):
        micro_batch = _to_device(next(data_iterator))
        output = _forward(model, micro_batch)

        def loss_func(output_tensor):
            logprobs, _ = micro_batch_logprobs(output_tensor, micro_batch, distribution)
            collected.append(logprobs.detach().float())
            return torch.zeros((), device=output_tensor.device), {}

        return output, loss_func

    seq_length, micro_batch_size = _shape_of(micro_batches)
    with torch.no_grad():
        get_forward_backward_func()(
            forward_step_func=forward_step,
            data_iterator=iter(micro_batches),
            model=model_chunks,
            num_microbatches=len(micro_batches),
            seq_length=seq_length,
            micro_batch_size=micro_batch_size,
            forward_only=True,
        )
    _, reporter = _result_rank_flags()
    return collected if reporter else None
