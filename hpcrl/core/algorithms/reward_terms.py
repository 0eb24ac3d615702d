"""NeMo RL's GRPO reward options applied between the environment and the advantages:
``grpo.reward_scaling``, ``grpo.reward_shaping`` (DAPO's overlong penalty) and dynamic
sampling (DAPO: keep only prompt groups whose rewards differ).

All work on flat rewards, ``num_generations`` consecutive entries per prompt.
"""

from __future__ import annotations

from typing import TYPE_CHECKING

if TYPE_CHECKING:
    import torch

    from hpcrl.config.recipe import Recipe, RewardScalingCfg, RewardShapingCfg


def scale_rewards(rewards: torch.Tensor, cfg: RewardScalingCfg) -> torch.Tensor:
    """Clamp to [source_min, source_max], then map linearly onto [target_min, target_max]."""
    if not cfg.enabled:
        return rewards
    clamped = rewards.clamp(min=cfg.source_min, max=cfg.source_max)
    span = (cfg.target_max - cfg.target_min) / (cfg.source_max - cfg.source_min)
    return cfg.target_min + (clamped - cfg.source_min) * span


def overlong_penalty(
    rewards: torch.Tensor,
    response_lengths: torch.Tensor,
    cfg: RewardShapingCfg,
    max_new_tokens: int,
) -> torch.Tensor:
    """DAPO's soft overlong punishment: with L = max_response_length and B the buffer, a
    response of n > L − B tokens gets −penalty·(n − (L − B))/B added (never more than
    −penalty: n ≤ L since generation stops there)."""
    if not cfg.enabled:
        return rewards
    import torch

    limit = cfg.max_response_length or max_new_tokens
    expected = limit - cfg.overlong_buffer_length
    excess = (response_lengths.to(torch.float32) - expected).clamp(min=0.0)
    penalty = (excess / cfg.overlong_buffer_length * cfg.overlong_buffer_penalty).clamp(
        max=cfg.overlong_buffer_penalty
    )
    return rewards - penalty


def shape_rewards(recipe: Recipe, rewards: torch.Tensor, response_lengths: torch.Tensor):
    """Shaping, then scaling, as NeMo RL orders them."""
    grpo = recipe.grpo
    assert grpo is not None
    max_new = recipe.policy.generation.max_new_tokens
    shaped = overlong_penalty(rewards, response_lengths, grpo.reward_shaping, max_new)
    return scale_rewards(shaped, grpo.reward_scaling)


def groups_with_signal(rewards: torch.Tensor, num_generations: int) -> list[int]:
    """Indices of prompt groups whose rewards are not all equal (their advantages are not
    all 0): the groups dynamic sampling keeps."""
    groups = rewards.reshape(-1, num_generations)
    spread = groups.max(dim=1).values - groups.min(dim=1).values
    return [int(i) for i in (spread > 0).nonzero().flatten().tolist()]
