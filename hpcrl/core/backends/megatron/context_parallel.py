"""Context parallelism (CP) for the Megatron backend: which tokens each CP rank holds, and
how its results are put back in order (the all-gathers are ``hpcrl.core.cp_gather``).

megatron-core's layout, which its RoPE slicing (``get_pos_emb_on_this_cp_rank``, and
``_get_thd_freqs_on_this_cp_rank`` per packed sequence) and Transformer Engine's CP attention
both assume: every sequence is padded to a multiple of 2·CP and cut into 2·CP equal chunks;
CP rank r holds chunks r and 2·CP−1−r (load balance under the causal mask), in that order.
For a pack (THD layout) each sequence between ``cu_seqlens`` boundaries is cut that way and
rank r's pieces of the sequences are concatenated in pack order.

Every CP rank of a data-parallel rank receives the same whole micro-batch (CP ranks share
the DP rank); the step feeds the model this rank's tokens (``CpShard.local_index``) and
gathers the per-token log-probs back to whole sequences (``gather_replicated``), so the loss
runs on every CP rank on the same numbers as without CP.
"""

from __future__ import annotations

from typing import Any

import attrs
import torch


def chunk_positions(
    bounds: list[int], cp_rank: int, cp_size: int, device: torch.device | None = None
) -> torch.Tensor:
    """Positions (in the whole row / pack) of the tokens ``cp_rank`` holds, in its order.
    ``bounds``: segment boundaries [0, …, total] (one segment for an unpacked row), each
    segment's length a multiple of 2·``cp_size``."""
    pieces = []
    for start, end in zip(bounds[:-1], bounds[1:], strict=True):
        length = end - start
        if length % (2 * cp_size):
            raise ValueError(
                f"context parallelism needs every sequence padded to a multiple of "
                f"2 x context_parallel_size = {2 * cp_size}; got one of length {length}"
            )
        chunk = length // (2 * cp_size)
        for index in (cp_rank, 2 * cp_size - 1 - cp_rank):
            first = start + index * chunk
            pieces.append(torch.arange(first, first + chunk, device=device))
    if not pieces:
        return torch.zeros(0, dtype=torch.long, device=device)
    return torch.cat(pieces)


def all_rank_positions(bounds: list[int], cp_size: int, device: torch.device | None = None):
    """Positions of the tokens of every CP rank, concatenated in rank order: where each entry
    of a CP all-gather (rank-major) sits in the whole row / pack."""
    return torch.cat([chunk_positions(bounds, r, cp_size, device) for r in range(cp_size)])


@attrs.frozen
class CpShard:
    """One micro-batch's split: ``local_index`` selects this rank's tokens of the (padded)
    row; ``gathered_index`` places a rank-major all-gather back in row order."""

    cp_rank: int
    cp_size: int
    width: int  # padded row / pack length
    local_index: torch.Tensor
    gathered_index: torch.Tensor

    @classmethod
    def of(cls, bounds: list[int], cp_rank: int, cp_size: int, device: Any = None) -> CpShard:
        return cls(
            cp_rank=cp_rank,
            cp_size=cp_size,
            width=bounds[-1],
            local_index=chunk_positions(bounds, cp_rank, cp_size, device),
            gathered_index=all_rank_positions(bounds, cp_size, device),
        )

    def restore_order(self, gathered: torch.Tensor) -> torch.Tensor:
        """[..., width] rank-major gathered values → row order (differentiable)."""
        inverse = torch.empty_like(self.gathered_index)
        inverse[self.gathered_index] = torch.arange(
            self.gathered_index.numel(), device=self.gathered_index.device
        )
        return gathered.index_select(-1, inverse.to(gathered.device))


def cp_group_and_size() -> tuple[Any, int, int]:
    """(CP process group, this rank in it, its size) from megatron's parallel state."""
    from megatron.core import parallel_state as ps

    return (
        ps.get_context_parallel_group(),
        ps.get_context_parallel_rank(),
        ps.get_context_parallel_world_size(),
    )
