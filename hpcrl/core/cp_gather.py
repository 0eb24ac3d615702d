"""The two autograd all-gathers context parallelism needs, shared by both backends
(``core/backends/automodel/context_parallel.py`` and ``core/backends/megatron/``).

Both concatenate every CP rank's piece along one dim in rank order. They differ in what the
backward does with the gradient of the whole:

- ``gather_summed``: sums every rank's gradient of the whole and hands each rank its own
  piece (a reduce-scatter). For inputs each rank then uses differently — K/V, which every
  rank's own queries attend to — so the owner must collect all ranks' contributions.
- ``gather_replicated``: keeps this rank's piece of its own gradient, unsummed. For values
  every rank feeds into the same computation (per-token log-probs into the same loss), where
  each rank's gradient of the whole already is the full gradient.

Not ``torch.distributed.nn``'s all-gather: on gloo its backward scatters from group ranks as
if they were global ranks, which fails in any group that does not start at global rank 0
(CP groups under FSDP × CP or DP × CP).
"""

from __future__ import annotations

from typing import Any

import torch


def _gather_along(tensor: torch.Tensor, dim: int, group: Any) -> torch.Tensor:
    import torch.distributed as dist

    parts = [torch.empty_like(tensor) for _ in range(dist.get_world_size(group))]
    dist.all_gather(parts, tensor.contiguous(), group=group)
    return torch.cat(parts, dim=dim)


def _own_piece(whole: torch.Tensor, dim: int, group: Any) -> torch.Tensor:
    import torch.distributed as dist

    width = whole.size(dim) // dist.get_world_size(group)
    return whole.narrow(dim, dist.get_rank(group) * width, width).contiguous()


def _summed_own_piece(grad: torch.Tensor, dim: int, group: Any) -> torch.Tensor:
    import torch.distributed as dist

    if dist.get_backend(group) == dist.Backend.NCCL:
        pieces = [p.contiguous() for p in grad.chunk(dist.get_world_size(group), dim=dim)]
        out = torch.empty_like(pieces[dist.get_rank(group)])
        dist.reduce_scatter(out, pieces, group=group)
        return out
    # gloo has no reduce-scatter: sum the whole, keep this rank's piece.
    total = grad.contiguous().clone()
    dist.all_reduce(total, group=group)
    return _own_piece(total, dim, group)


class _GatherSummed(torch.autograd.Function):
    @staticmethod
    def forward(ctx: Any, tensor: torch.Tensor, dim: int, group: Any) -> torch.Tensor:
        ctx.dim, ctx.group = dim, group
        return _gather_along(tensor, dim, group)

    @staticmethod
    def backward(ctx: Any, grad: torch.Tensor) -> tuple[torch.Tensor, None, None]:
        return _summed_own_piece(grad, ctx.dim, ctx.group), None, None


class _GatherReplicated(torch.autograd.Function):
    @staticmethod
    def forward(ctx: Any, tensor: torch.Tensor, dim: int, group: Any) -> torch.Tensor:
        ctx.dim, ctx.group = dim, group
        return _gather_along(tensor, dim, group)

    @staticmethod
    def backward(ctx: Any, grad: torch.Tensor) -> tuple[torch.Tensor, None, None]:
        return _own_piece(grad, ctx.dim, ctx.group), None, None


def gather_summed(tensor: torch.Tensor, dim: int, group: Any) -> torch.Tensor:
    """All ranks' pieces along ``dim``; backward: the sum of all ranks' gradients, own piece."""
    result: torch.Tensor = _GatherSummed.apply(tensor, dim, group)
    return result


def gather_replicated(tensor: torch.Tensor, dim: int, group: Any) -> torch.Tensor:
    """All ranks' pieces along ``dim``; backward: this rank's own gradient, own piece."""
    result: torch.Tensor = _GatherReplicated.apply(tensor, dim, group)
    return result
