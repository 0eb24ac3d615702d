"""GRPO advantages: each response's reward against the other responses to the same prompt.

Rewards arrive flat, ``num_generations`` consecutive entries per prompt (the order GRPO
builds its batch in).
"""

from __future__ import annotations

from typing import TYPE_CHECKING

if TYPE_CHECKING:
    import torch

STD_EPSILON = 1e-6


def group_advantages(
    rewards: torch.Tensor,
    num_generations: int,
    *,
    normalize: bool = True,
    leave_one_out: bool = False,
) -> torch.Tensor:
    """Advantage per response: reward − baseline, optionally divided by the group's std.

    baseline: the group mean, or with ``leave_one_out`` the mean of the *other* responses
    of the group (needs num_generations ≥ 2). std: the group's sample std (unbiased); groups
    with equal rewards get advantage 0 rather than a division by ~0.
    """
    import torch

    if rewards.numel() % num_generations != 0:
        raise ValueError(f"{rewards.numel()} rewards do not split into groups of {num_generations}")
    groups = rewards.reshape(-1, num_generations).to(torch.float32)
    if leave_one_out:
        if num_generations < 2:
            raise ValueError("the leave-one-out baseline needs num_generations_per_prompt >= 2")
        baseline = (groups.sum(dim=1, keepdim=True) - groups) / (num_generations - 1)
    else:
        baseline = groups.mean(dim=1, keepdim=True)
    advantages = groups - baseline
    if normalize and num_generations > 1:
        std = groups.std(dim=1, keepdim=True)
        advantages = torch.where(std > STD_EPSILON, advantages / (std + STD_EPSILON), 0.0)
    return advantages.reshape(-1)
