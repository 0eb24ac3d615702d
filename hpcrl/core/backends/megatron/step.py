"""Forward/backward of the Megatron backend: token log-probs on the TP-sharded vocab, the
training step through ``get_forward_backward_func`` (any PP schedule), and log-probs only.

Loss scaling: megatron's schedule multiplies each micro-batch loss by the CP size and divides
it by the number of micro-batches; DDP averages gradients over the data-parallel-with-CP group
(scales by 1/(DP·CP), then sums). ``LossFn`` losses are already normalised by the global token
count, so the step multiplies them by micro-batches × DP: the gradients are then the sum over
DP shards and over CP ranks' partial gradients, i.e. those of the whole global batch.

Context parallelism (``context_parallel.py``): every CP rank gets the whole micro-batch, feeds
the model its load-balanced chunks of each sequence (an unpacked row is right-padded to a
multiple of 2·CP, ×TP under sequence parallelism; packs come planned that way), scores its
tokens' next-token log-probs and all-gathers them to whole rows in the original order. The
loss then runs on every CP rank on the numbers it would see without CP; the gather's backward
keeps each rank's own slice, so each rank back-propagates only through its own tokens.
"""

from __future__ import annotations

from collections.abc import Sequence
from typing import TYPE_CHECKING, Any

import torch
import torch.nn.functional as F

from hpcrl.core.metric_reduction import accumulate, all_reduce_metrics
from hpcrl.core.policy import UNFILTERED_LOGPROBS_KEY, Batch, LossFn
from hpcrl.core.token_distribution import (
    TokenDistribution,
    scale_logits,
    token_logprobs_from_logits,
)
from hpcrl.core.workers.micro_batches import round_up, unpack_logprobs

if TYPE_CHECKING:
    from hpcrl.core.backends.megatron.context_parallel import CpShard


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
    processed, unfiltered = aligned_logprobs(
        logits[:, :-1], input_ids[:, 1:].contiguous(), distribution
    )
    return F.pad(processed, (1, 0)), F.pad(unfiltered, (1, 0))


def aligned_logprobs(
    logits: torch.Tensor, targets: torch.Tensor, distribution: TokenDistribution
) -> tuple[torch.Tensor, torch.Tensor]:
    """(processed, unfiltered) log p(targets[:, t]) under logits[:, t] (no shift)."""
    from megatron.core.tensor_parallel import (
        gather_from_tensor_model_parallel_region,
        vocab_parallel_cross_entropy,
    )

    if distribution.filters:
        full = gather_from_tensor_model_parallel_region(logits.float())
        return token_logprobs_from_logits(full, targets, distribution)
    # A copy: the megatron function normalises its input in place.
    scaled = logits.to(torch.float32, copy=True)
    scaled = scale_logits(scaled, distribution.temperature).contiguous()
    logprobs = -vocab_parallel_cross_entropy(scaled, targets)
    return logprobs, logprobs


def cp_token_logprobs(
    logits: torch.Tensor, input_ids: torch.Tensor, shard: CpShard, distribution: TokenDistribution
) -> tuple[torch.Tensor, torch.Tensor]:
    """``token_logprobs`` of whole [b, W] rows (``W = shard.width``) from this CP rank's logits
    [b, W/CP, V/TP] of its chunks: each local token scores the token after it in the whole row,
    then the ranks' scores are all-gathered and put back in row order."""
    from hpcrl.core.backends.megatron.context_parallel import cp_group_and_size
    from hpcrl.core.cp_gather import gather_replicated

    group, _, _ = cp_group_and_size()
    index = shard.local_index.to(input_ids.device)
    targets = torch.roll(input_ids, -1, dims=1).index_select(1, index).contiguous()
    processed, unfiltered = aligned_logprobs(logits, targets, distribution)
    wholes = []
    for local in (processed,) if unfiltered is processed else (processed, unfiltered):
        whole = shard.restore_order(gather_replicated(local, 1, group))
        # whole[:, p] scores token p+1; token_logprobs' convention is column t = token t.
        wholes.append(F.pad(whole[:, :-1], (1, 0)))
    return wholes[0], wholes[-1]


def _device() -> torch.device:
    if torch.cuda.is_available():
        return torch.device("cuda", torch.cuda.current_device())
    return torch.device("cpu")


def _forward(model: Any, micro_batch: Batch, shard: CpShard | None = None) -> torch.Tensor:
    """Logits of one micro-batch (of this CP rank's tokens under ``shard``). A pack
    (``hpcrl.core.workers.micro_batches``) runs as one [1, L] row in megatron's THD layout:
    ``PackedSeqParams`` restarts RoPE and confines attention at every ``cu_seqlens``
    boundary (whole-pack boundaries also under CP: megatron-core and hpcrl's CP attention
    take them so)."""
    if "packed_input_ids" in micro_batch:
        ids, positions = micro_batch["packed_input_ids"], micro_batch["packed_position_ids"]
        params = packed_seq_params(micro_batch["cu_seqlens"], context_parallel=shard is not None)
    else:
        ids, params = micro_batch["input_ids"], None
        if shard is not None:
            ids = _pad_columns(ids, shard.width)
        # Right-padded sequences under a causal mask: padding never influences earlier
        # tokens, so no attention mask is needed (local spec builds the causal one).
        positions = torch.arange(ids.shape[1], device=ids.device).unsqueeze(0).expand_as(ids)
    if shard is not None:
        index = shard.local_index.to(ids.device)
        ids, positions = ids.index_select(1, index), positions.index_select(1, index)
    if params is None:
        return model(ids, positions, None)
    return model(ids, positions, None, packed_seq_params=params)


def _pad_columns(ids: torch.Tensor, width: int) -> torch.Tensor:
    return F.pad(ids, (0, width - ids.shape[1])) if width > ids.shape[1] else ids


def cp_shard(micro_batch: Batch, multiple: int) -> CpShard | None:
    """This CP rank's split of the micro-batch; None without CP. ``multiple``: what each
    unpacked row is padded to (``cp_pad_multiple``); packs must already be cut so."""
    from hpcrl.core.backends.megatron.context_parallel import CpShard, cp_group_and_size

    _, cp_rank, cp_size = cp_group_and_size()
    if cp_size == 1:
        return None
    if "packed_input_ids" in micro_batch:
        bounds = [int(b) for b in micro_batch["cu_seqlens"].tolist()]
    else:
        bounds = [0, round_up(micro_batch["input_ids"].shape[1], multiple)]
    return CpShard.of(bounds, cp_rank, cp_size)


def cp_pad_multiple(model_chunks: list) -> int:
    """What a sequence's length must divide under CP: 2·CP chunks, each split over TP too
    under sequence parallelism (as megatron-core and NeMo RL require)."""
    from megatron.core import parallel_state as ps

    config = _unwrapped_config(model_chunks[0])
    tp = ps.get_tensor_model_parallel_world_size() if config.sequence_parallel else 1
    return 2 * ps.get_context_parallel_world_size() * tp


def _unwrapped_config(chunk: Any) -> Any:
    while not hasattr(chunk, "config") and hasattr(chunk, "module"):
        chunk = chunk.module
    return chunk.config


def packed_seq_params(cu_seqlens: torch.Tensor, context_parallel: bool = False) -> Any:
    """THD parameters of a pack whose sequences are already padded (``materialize``): under
    CP the padded boundaries are given too, as Transformer Engine's CP attention reads them
    (the same values: the padding is part of each sequence)."""
    from megatron.core.packed_seq_params import PackedSeqParams

    longest = int((cu_seqlens[1:] - cu_seqlens[:-1]).max())
    padded = {"cu_seqlens_q_padded": cu_seqlens, "cu_seqlens_kv_padded": cu_seqlens}
    return PackedSeqParams(
        qkv_format="thd",
        cu_seqlens_q=cu_seqlens,
        cu_seqlens_kv=cu_seqlens,
        max_seqlen_q=longest,
        max_seqlen_kv=longest,
        **(padded if context_parallel else {}),
    )


def micro_batch_logprobs(
    output: torch.Tensor,
    micro_batch: Batch,
    distribution: TokenDistribution,
    shard: CpShard | None = None,
) -> tuple[torch.Tensor, torch.Tensor]:
    """(processed, unfiltered) [rows, width] token log-probs from a micro-batch's logits
    (this CP rank's, gathered to whole rows, under ``shard``), unpacked to its rows if it
    is a pack."""
    packed = "packed_input_ids" in micro_batch
    ids = micro_batch["packed_input_ids" if packed else "input_ids"]
    if shard is None:
        processed, unfiltered = token_logprobs(output, ids, distribution)
    else:
        width = ids.shape[1]
        processed, unfiltered = cp_token_logprobs(
            output, _pad_columns(ids, shard.width), shard, distribution
        )
        processed, unfiltered = processed[:, :width], unfiltered[:, :width]
    if not packed:
        return processed, unfiltered
    return unpack_logprobs(processed, micro_batch), unpack_logprobs(unfiltered, micro_batch)


def _shape_of(micro_batches: Sequence[Batch], model_chunks: list) -> tuple[int, int]:
    """(seq_length, micro_batch_size) megatron's schedules size pipeline buffers with (the
    whole, padded length: they divide it by CP themselves)."""
    first = micro_batches[0]
    if "packed_input_ids" in first:
        return first["packed_input_ids"].shape[1], 1
    shard = cp_shard(first, cp_pad_multiple(model_chunks))
    width = first["input_ids"].shape[1] if shard is None else shard.width
    return width, first["input_ids"].shape[0]


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
    """Forward/backward every micro-batch (on the device: the worker's ``PinnedStaging``
    uploads them together); returns loss and loss_fn metrics summed over the
    global batch (same dict on every rank). Gradients are left in the DDP buffers.
    ``distribution``: what the log-probs are measured in (default: the model's own)."""
    distribution = distribution or TokenDistribution()
    from megatron.core import parallel_state as ps
    from megatron.core.pipeline_parallel import get_forward_backward_func

    scale = len(micro_batches) * ps.get_data_parallel_world_size()
    # Device tensors (or floats) summed over micro-batches: one read-back per step, in
    # ``_sum_over_reporters``, not one host wait per micro-batch.
    totals: dict[str, Any] = {}

    multiple = cp_pad_multiple(model_chunks)

    def loss_func(micro_batch, shard, output_tensor):
        logprobs, unfiltered = micro_batch_logprobs(output_tensor, micro_batch, distribution, shard)
        if distribution.filters:
            micro_batch[UNFILTERED_LOGPROBS_KEY] = unfiltered
        loss, metrics = loss_fn(logprobs, micro_batch, num_global_tokens)
        accumulate(totals, "loss", loss.detach())
        for name, value in metrics.items():
            accumulate(totals, name, value.detach() if isinstance(value, torch.Tensor) else value)
        return loss * scale, {}

    def forward_step(data_iterator, model):
        micro_batch = next(data_iterator)
        shard = cp_shard(micro_batch, multiple)
        output = _forward(model, micro_batch, shard)
        return output, lambda output_tensor: loss_func(micro_batch, shard, output_tensor)

    for chunk in model_chunks:
        chunk.zero_grad_buffer()
    seq_length, micro_batch_size = _shape_of(micro_batches, model_chunks)
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
    """Token log-probs of each micro-batch (given on the device, as to
    ``run_train_microbatches``) ([rows, width], float32, on the device: the caller reads
    them back once) on the reporting rank, else None."""
    from megatron.core.pipeline_parallel import get_forward_backward_func

    distribution = distribution or TokenDistribution()
    collected: list[torch.Tensor] = []

    multiple = cp_pad_multiple(model_chunks)

    def forward_step(data_iterator, model):
        micro_batch = next(data_iterator)
        shard = cp_shard(micro_batch, multiple)
        output = _forward(model, micro_batch, shard)

        def loss_func(output_tensor):
            logprobs, _ = micro_batch_logprobs(output_tensor, micro_batch, distribution, shard)
            collected.append(logprobs.detach().float())
            return torch.zeros((), device=output_tensor.device), {}

        return output, loss_func

    seq_length, micro_batch_size = _shape_of(micro_batches, model_chunks)
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
