"""Advantages: each response's reward against the other responses to the same prompt.

Groups are formed by prompt *content*, as NeMo RL does (``calculate_baseline_and_std_per_prompt``
over its prompt token ids): rollouts whose prompt token ids are equal share a group, so the
same prompt drawn twice in one step makes one group of 2n (and so do two prompts that did not
fit and were cut to the same stub). ``prompt_groups`` gives each rollout its group's index.

Estimators (``grpo.adv_estimator.name``; formulas from NeMo RL's ``advantage_estimator.py``):

``grpo`` (``normalize_rewards``, ``use_leave_one_out_baseline``), for rollout i of a group of m:
- baseline b_i: the group mean, or with leave-one-out the mean of the *other* m − 1 rewards;
- std s_i: the sample std (k − 1 in the denominator) of the k rewards b_i is the mean of
  (0 when k < 2);
- A_i = r_i − b_i, divided by (s_i + 1e-6) when normalising and s_i > 0; where s_i = 0 (no
  spread to scale by) A_i stays unscaled. A group of one has A = 0.

``reinforce_plus_plus`` (``minus_baseline``): a_i = r_i − (group mean) or r_i; then normalised
over the batch's loss tokens: with n_i the tokens of rollout i that count in the loss,
μ = Σ n_i a_i / Σ n_i, σ² = Σ n_i (a_i − μ)² / Σ n_i, A_i = (a_i − μ) / √max(σ², 1e-8).

``gdpo`` (``normalize_rewards``, ``use_leave_one_out_baseline``, ``reward_weights``), over
the environment's named reward components (``reward/<name>``, taken in sorted name order):
each component c gets the ``grpo`` advantage A_c above, computed on its own rewards; then
A = Σ_c w_c A_c (w: ``reward_weights``, 1.0 each when unset), and A is normalised over the
whole batch: (A − mean) / std (sample std), or A − mean where std = 0.

Then ``grpo.advantage_clip_low`` / ``advantage_clip_high`` clamp A (``clip_advantages``).
"""

from __future__ import annotations

from collections.abc import Mapping, Sequence
from typing import TYPE_CHECKING

if TYPE_CHECKING:
    import torch

    from hpcrl.config.recipe import GrpoCfg

# NeMo RL's epsilons: A / (std + 1e-6) wherever std > 0; Reinforce++'s variance floor.
STD_EPSILON = 1e-6
RPP_VARIANCE_FLOOR = 1e-8


def prompt_groups(prompt_keys: Sequence[Sequence[int]]) -> torch.Tensor:
    """[N] group index per rollout: equal prompt keys (hpcrl.core.data.prompts.prompt_key),
    equal group; numbered in order of first appearance."""
    import torch

    index: dict[tuple[int, ...], int] = {}
    return torch.tensor(
        [index.setdefault(tuple(key), len(index)) for key in prompt_keys], dtype=torch.long
    )


def consecutive_groups(num_rows: int, group_size: int) -> torch.Tensor:
    """[N] group index when every ``group_size`` consecutive rows form a group."""
    import torch

    if group_size < 1 or num_rows % group_size != 0:
        raise ValueError(f"{num_rows} rewards do not split into groups of {group_size}")
    return torch.arange(num_rows, dtype=torch.long) // group_size


def _as_groups(rewards: torch.Tensor, groups: torch.Tensor | int) -> torch.Tensor:
    if isinstance(groups, int):
        return consecutive_groups(rewards.numel(), groups)
    assert groups.shape == rewards.shape, (groups.shape, rewards.shape)
    return groups


def group_baseline_std(
    rewards: torch.Tensor, groups: torch.Tensor | int, *, leave_one_out: bool
) -> tuple[torch.Tensor, torch.Tensor]:
    """Per rollout: the baseline b_i and std s_i of the module docstring ([N] each). A group
    of one gets b = r (A = 0) and s = 0, as in NeMo RL."""
    import torch

    groups = _as_groups(rewards, groups)
    values = rewards.to(torch.float64)
    baseline = values.clone()
    std = torch.zeros_like(values)
    for group in torch.unique(groups).tolist():
        rows = (groups == group).nonzero().flatten()
        if len(rows) < 2:
            continue
        member = values[rows]
        # pool[i, j] = 1: reward j counts in rollout i's baseline and std
        pool = torch.ones(len(rows), len(rows), dtype=values.dtype)
        if leave_one_out:
            pool -= torch.eye(len(rows), dtype=values.dtype)
        size = pool.sum(dim=1)  # k: how many rewards each baseline averages
        means = pool @ member / size
        squares = (pool * (member[None, :] - means[:, None]).square()).sum(dim=1)
        spread = torch.where(size > 1, squares / (size - 1).clamp(min=1.0), 0.0)
        baseline[rows], std[rows] = means, spread.sqrt()
    dtype = rewards.dtype if rewards.is_floating_point() else torch.float32
    return baseline.to(dtype), std.to(dtype)


def group_advantages(
    rewards: torch.Tensor,
    groups: torch.Tensor | int,
    *,
    normalize: bool = True,
    leave_one_out: bool = False,
) -> torch.Tensor:
    """The ``grpo`` estimator (see the module docstring). ``groups``: a group index per
    rollout, or a group size when consecutive rows form the groups."""
    import torch

    rewards = rewards.to(torch.float32)
    baseline, std = group_baseline_std(rewards, groups, leave_one_out=leave_one_out)
    advantages = rewards - baseline
    if normalize:
        advantages = torch.where(std > 0, advantages / (std + STD_EPSILON), advantages)
    return advantages


def reinforce_plus_plus_advantages(
    rewards: torch.Tensor,
    groups: torch.Tensor | int,
    loss_mask: torch.Tensor,
    *,
    minus_baseline: bool = True,
) -> torch.Tensor:
    """The ``reinforce_plus_plus`` estimator; ``loss_mask`` [N, T] marks the tokens that
    count in the loss (token mask × sample mask)."""
    import torch

    rewards = rewards.to(torch.float32)
    raw = rewards
    if minus_baseline:
        raw = rewards - group_baseline_std(rewards, groups, leave_one_out=False)[0]
    tokens = loss_mask.to(torch.float64).sum(dim=1)
    total = tokens.sum().clamp(min=1.0)
    values = raw.to(torch.float64)
    mean = (values * tokens).sum() / total
    variance = ((values - mean).square() * tokens).sum() / total
    return ((values - mean) * variance.clamp(min=RPP_VARIANCE_FLOOR).rsqrt()).to(torch.float32)


def gdpo_advantages(
    components: Mapping[str, torch.Tensor],
    groups: torch.Tensor | int,
    *,
    weights: Sequence[float] | None = None,
    normalize: bool = True,
    leave_one_out: bool = False,
) -> torch.Tensor:
    """The ``gdpo`` estimator (see the module docstring); ``components``: [N] rewards by
    component name."""
    names = sorted(components)
    if len(names) < 2:
        raise ValueError(
            f"gdpo needs several reward components, the environment returned {names}; "
            "set grpo.adv_estimator.name=grpo"
        )
    weights = [1.0] * len(names) if weights is None else list(weights)
    if len(weights) != len(names):
        raise ValueError(
            f"grpo.adv_estimator.reward_weights has {len(weights)} weights for the "
            f"{len(names)} components {names} (in that order)"
        )
    combined = sum(
        weight
        * group_advantages(
            components[name], groups, normalize=normalize, leave_one_out=leave_one_out
        )
        for weight, name in zip(weights, names, strict=True)
    )
    assert not isinstance(combined, int)
    mean = combined.mean()
    std = combined.std() if combined.numel() > 1 else combined.new_zeros(())
    return (combined - mean) / std if std > 0 else combined - mean


def clip_advantages(advantages: torch.Tensor, low: float | None, high: float | None):
    """``grpo.advantage_clip_low`` / ``advantage_clip_high`` (None: that side unclipped)."""
    if low is not None:
        advantages = advantages.clamp(min=low)
    if high is not None:
        advantages = advantages.clamp(max=high)
    return advantages


def estimate_advantages(
    grpo: GrpoCfg,
    rewards: torch.Tensor,
    groups: torch.Tensor,
    loss_mask: torch.Tensor,
    components: Mapping[str, torch.Tensor] | None = None,
) -> torch.Tensor:
    """[N] advantages of one step's rollouts under ``grpo.adv_estimator``, clipped;
    ``components``: the named rewards gdpo reads (scaled, as ``rewards``)."""
    estimator = grpo.adv_estimator
    if estimator.name == "gdpo":
        normalize, leave_one_out = estimator_flags(grpo)
        advantages = gdpo_advantages(
            components or {},
            groups,
            weights=estimator.reward_weights,
            normalize=normalize,
            leave_one_out=leave_one_out,
        )
    elif estimator.name == "reinforce_plus_plus":
        advantages = reinforce_plus_plus_advantages(
            rewards, groups, loss_mask, minus_baseline=estimator.minus_baseline
        )
    else:
        assert estimator.name == "grpo", f"the rules refuse adv_estimator {estimator.name!r}"
        normalize, leave_one_out = estimator_flags(grpo)
        advantages = group_advantages(
            rewards, groups, normalize=normalize, leave_one_out=leave_one_out
        )
    return clip_advantages(advantages, grpo.advantage_clip_low, grpo.advantage_clip_high)


def estimator_flags(grpo: GrpoCfg) -> tuple[bool, bool]:
    """(normalize_rewards, use_leave_one_out_baseline) of the ``grpo`` estimator: its own
    keys under ``grpo.adv_estimator`` where given (NeMo RL v0.7.0 and later read them there;
    their example configs point them at the ``grpo.*`` keys), else ``grpo.*`` (v0.5.0, and
    v0.7.0 without an ``adv_estimator`` section)."""
    estimator = grpo.adv_estimator
    normalize = estimator.normalize_rewards
    leave_one_out = estimator.use_leave_one_out_baseline
    return (
        grpo.normalize_rewards if normalize is None else normalize,
        grpo.use_leave_one_out_baseline if leave_one_out is None else leave_one_out,
    )
