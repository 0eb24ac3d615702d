"""Splitting global batches across data-parallel ranks and joining results back.

Pure tensor bookkeeping, shared by every backend's worker group: shard ``i`` of ``n`` is a
contiguous slice, so concatenating the per-shard results in ``dp_rank`` order gives back the
original order.
"""

from __future__ import annotations

from collections.abc import Mapping, Sequence
from typing import TYPE_CHECKING

if TYPE_CHECKING:
    import torch

    from hpcrl.core.policy import Batch


def batch_size_of(batch: Batch) -> int:
    sizes = {int(value.shape[0]) for value in batch.values()}
    assert len(sizes) == 1, f"batch tensors disagree on dim 0: {sorted(sizes)}"
    return sizes.pop()


def split_batch(batch: Batch, num_shards: int, what: str) -> list[dict[str, torch.Tensor]]:
    """``num_shards`` equal contiguous shards; a batch that does not divide is a user error."""
    size = batch_size_of(batch)
    if size % num_shards != 0:
        raise ValueError(
            f"{what}: a batch of {size} sequences does not split evenly over {num_shards} "
            f"data-parallel ranks; make the batch size a multiple of {num_shards}"
        )
    shard_size = size // num_shards
    return [
        {key: value[i * shard_size : (i + 1) * shard_size] for key, value in batch.items()}
        for i in range(num_shards)
    ]


def pad_rows(batch: Batch, multiple: int) -> tuple[dict[str, torch.Tensor], int]:
    """Repeat the last row until the batch size is a multiple of ``multiple`` (for outputs
    that are trimmed afterwards); returns the padded batch and the real size."""
    import torch

    size = batch_size_of(batch)
    missing = -size % multiple
    if missing == 0:
        return dict(batch), size
    padded = {
        key: torch.cat([value, value[-1:].expand(missing, *value.shape[1:])])
        for key, value in batch.items()
    }
    return padded, size


def split_micro_batches(batch: Batch, micro_batch_size: int) -> list[dict[str, torch.Tensor]]:
    """Consecutive micro-batches of at most ``micro_batch_size`` sequences."""
    size = batch_size_of(batch)
    return [
        {key: value[start : start + micro_batch_size] for key, value in batch.items()}
        for start in range(0, size, micro_batch_size)
    ]


def pad_prompts_evenly(
    prompt_ids: Sequence[Sequence[int]], num_shards: int
) -> tuple[list[list[list[int]]], int]:
    """Equal-size contiguous prompt shards (FSDP ranks must run the same number of forwards):
    the last prompt is repeated to fill; returns the shards and the real prompt count."""
    num_real = len(prompt_ids)
    assert num_real > 0, "generate needs at least one prompt"
    shard_size = -(-num_real // num_shards)
    padded = [list(p) for p in prompt_ids] + [list(prompt_ids[-1])] * (
        shard_size * num_shards - num_real
    )
    return [padded[i * shard_size : (i + 1) * shard_size] for i in range(num_shards)], num_real


def concat_right_padded(
    parts: Sequence[Mapping[str, torch.Tensor]], pad_values: Mapping[str, int | float]
) -> dict[str, torch.Tensor]:
    """Concatenate per-shard dicts along dim 0, right-padding dim 1 of 2-D tensors to the
    longest shard with ``pad_values[key]`` (0 when absent)."""
    import torch
    import torch.nn.functional as F

    out: dict[str, torch.Tensor] = {}
    for key in parts[0]:
        tensors = [part[key] for part in parts]
        if tensors[0].dim() == 2:
            width = max(t.shape[1] for t in tensors)
            pad = pad_values.get(key, 0)
            tensors = [F.pad(t, (0, width - t.shape[1]), value=pad) for t in tensors]
        out[key] = torch.cat(tensors, dim=0)
    return out


def pad_sequence_dim(batch: Batch, multiple: int) -> dict[str, torch.Tensor]:
    """Every ``[B, T, ...]`` tensor padded with zeros along dim 1 to the smallest multiple of
    ``multiple`` at or above ``T``. Zero is an attention mask of 0 and a token mask of 0, so
    the padding never counts; 1-D tensors pass unchanged, and so do a pack's ``packed_*``
    tensors."""
    import torch.nn.functional as F

    length = int(batch["input_ids"].shape[1])
    padded_length = -(-length // multiple) * multiple
    if padded_length == length:
        return dict(batch)  # F.pad by nothing would still copy every tensor
    out = {}
    for key, value in batch.items():
        # A pack's [1, L] tensors have their own length (``pad_pack``).
        if value.dim() >= 2 and value.shape[1] == length and not key.startswith("packed_"):
            widths = [0, 0] * (value.dim() - 2) + [0, padded_length - length]
            value = F.pad(value, widths)
        out[key] = value
    return out


def is_right_padded(attention_mask: torch.Tensor) -> bool:
    """True when every row's ones come first and its zeros after (the batch contract's
    layout, ``hpcrl.core.policy``). Then causal attention alone gives every real token the
    same context as the mask would: padding only ever comes after it."""
    import torch

    lengths = attention_mask.sum(dim=1, keepdim=True)
    columns = torch.arange(attention_mask.shape[1], device=attention_mask.device)
    return bool(torch.equal(attention_mask.bool(), columns[None, :] < lengths))


def pad_pack(micro: Batch, multiple: int, pad_token_id: int = 0) -> dict[str, torch.Tensor]:
    """A packed micro-batch (``hpcrl.core.workers.micro_batches``) whose pack row is padded to
    the next multiple of ``multiple`` above its length (always at least one token): the fill
    is one more sequence (positions restart at 0, one more ``cu_seqlens`` boundary) that no
    row's ``pack_index`` points into, so no real token attends to it or reads it back."""
    import torch

    ids, positions = micro["packed_input_ids"], micro["packed_position_ids"]
    length = int(ids.shape[1])
    fill = (length // multiple + 1) * multiple - length
    out = dict(micro)
    out["packed_input_ids"] = torch.cat([ids, ids.new_full((1, fill), pad_token_id)], dim=1)
    out["packed_position_ids"] = torch.cat(
        [positions, torch.arange(fill, dtype=positions.dtype)[None, :]], dim=1
    )
    if "cu_seqlens" in micro:
        boundaries = micro["cu_seqlens"]
        out["cu_seqlens"] = torch.cat([boundaries, boundaries.new_tensor([length + fill])])
    return out
