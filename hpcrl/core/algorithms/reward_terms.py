"""NeMo RL's GRPO reward options applied between the environment and the advantages:
``grpo.reward_scaling``, then ``grpo.reward_shaping`` (DAPO's overlong penalty, or the
stop-properly penalty), in that order (NeMo RL's ``scale_rewards`` then
``apply_reward_shaping``, the same in v0.5.0, v0.7.0 and main 7ea279a).

All work on flat rewards, one entry per rollout.
"""

from __future__ import annotations

from typing import TYPE_CHECKING

import attrs

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
    response of n > L − B tokens gets −penalty·(n − (L − B))/B added. No floor: a response
    longer than L (possible when max_new_tokens > L) loses more than ``penalty``, as in NeMo
    RL."""
    import torch

    buffer, per_buffer = cfg.overlong_buffer_length, cfg.overlong_buffer_penalty
    assert buffer is not None and per_buffer is not None, "the rules require both"
    limit = cfg.max_response_length or max_new_tokens
    excess = response_lengths.to(torch.float32) - (limit - buffer)
    return rewards - (excess / buffer * per_buffer).clamp(min=0.0)


def stop_properly_penalty(
    rewards: torch.Tensor, truncated: torch.Tensor, coef: float
) -> torch.Tensor:
    """Rewards of responses cut off by the length limit (no stop) multiplied by ``coef``."""
    import torch

    return torch.where(truncated, rewards * coef, rewards)


@attrs.frozen(kw_only=True)
class ShapedRewards:
    """What the step trains on (``rewards``) and what dynamic sampling filters on
    (``unshaped``: scaled, before the shaping's length- or truncation-dependent terms, as
    NeMo RL's ``unshaped_total_reward``)."""

    rewards: torch.Tensor
    unshaped: torch.Tensor


def shape_rewards(
    recipe: Recipe,
    rewards: torch.Tensor,
    response_lengths: torch.Tensor,
    truncated: torch.Tensor,
) -> ShapedRewards:
    """Scaling, then shaping, as NeMo RL orders them. With
    ``reward_shaping.stop_properly_penalty_coef`` set, the DAPO overlong terms are not
    applied (NeMo RL ignores them then)."""
    grpo = recipe.grpo
    assert grpo is not None
    scaled = scale_rewards(rewards, grpo.reward_scaling)
    shaping = grpo.reward_shaping
    if not shaping.enabled:
        return ShapedRewards(rewards=scaled, unshaped=scaled)
    if shaping.stop_properly_penalty_coef is not None:
        shaped = stop_properly_penalty(scaled, truncated, shaping.stop_properly_penalty_coef)
    else:
        max_new = recipe.policy.generation.max_new_tokens
        shaped = overlong_penalty(scaled, response_lengths, shaping, max_new)
    return ShapedRewards(rewards=shaped, unshaped=scaled)
