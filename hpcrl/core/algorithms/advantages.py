"""GRPO advantages: each response's reward against the other responses to the same prompt.

Rewards arrive flat, ``num_generations`` consecutive entries per prompt (the order GRPO
builds its batch in). The formulas are NeMo RL's (``grpo.normalize_rewards``,
``grpo.use_leave_one_out_baseline``):

- baseline b_i: the group mean, or with leave-one-out the mean of the *other* n − 1 rewards;
- std s_i: the sample std (n − 1 in the denominator) of the rewards b_i is the mean of, i.e.
  of the whole group, or with leave-one-out of the other n − 1 (0 when they are one value);
- A_i = r_i − b_i, divided by (s_i + 1e-6) when normalising and s_i > 0; where s_i = 0 (no
  spread to scale by) A_i stays unscaled. A group of one has A = 0.
"""

from __future__ import annotations

from typing import TYPE_CHECKING

if TYPE_CHECKING:
    import torch

# NeMo RL's epsilon: A / (std + 1e-6) wherever std > 0.
STD_EPSILON = 1e-6


def group_advantages(
    rewards: torch.Tensor,
    num_generations: int,
    *,
    normalize: bool = True,
    leave_one_out: bool = False,
) -> torch.Tensor:
    """Advantage per response (see the module docstring)."""
    import torch

    if rewards.numel() % num_generations != 0:
        raise ValueError(f"{rewards.numel()} rewards do not split into groups of {num_generations}")
    groups = rewards.reshape(-1, num_generations).to(torch.float32)
    if num_generations == 1:
        return torch.zeros_like(groups).reshape(-1)
    if leave_one_out:
        baseline, std = _leave_one_out_stats(groups)
    else:
        baseline = groups.mean(dim=1, keepdim=True).expand_as(groups)
        std = groups.std(dim=1, keepdim=True).expand_as(groups)
    advantages = groups - baseline
    if normalize:
        advantages = torch.where(std > 0, advantages / (std + STD_EPSILON), advantages)
    return advantages.reshape(-1)


def _leave_one_out_stats(groups: torch.Tensor) -> tuple[torch.Tensor, torch.Tensor]:
    """Per member: mean and sample std of the other members of its group ([G, n] each)."""
    import torch

    size = groups.shape[1]
    others = 1.0 - torch.eye(size, dtype=groups.dtype)  # others[i, j]: j counts for i
    baseline = groups @ others.T / (size - 1)
    if size < 3:  # one other member: no spread
        return baseline, torch.zeros_like(groups)
    deviations = groups[:, None, :] - baseline[:, :, None]  # [G, i, j]
    variance = (deviations.square() * others).sum(dim=2) / (size - 2)
    return baseline, variance.sqrt()
