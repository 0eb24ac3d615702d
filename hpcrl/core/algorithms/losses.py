"""Loss functions computed on the workers (``hpcrl.core.policy.LossFn``).

Every function here is top-level (picklable) and returns a loss that is this micro-batch's
share of the global-batch loss: token sums divided by ``num_global_tokens`` (the loss-mask
token count of the whole global batch), so that micro-batch and data-parallel shares add up
to the loss of one big batch. Metrics are normalised the same way: the backend sums them
over micro-batches and ranks, which yields global token means.

Batch keys read here (all [B, T] unless noted): ``token_mask`` (1 on response tokens that
count), ``advantages`` [B], ``old_logprobs`` (policy before this step), ``ref_logprobs``
(reference policy; only with a KL penalty), ``generation_logprobs`` (sampler's; only with
importance-sampling correction), ``num_global_sequences`` [B] (every entry the number of
sequences in the global batch; only for sequence-level normalisation).
"""

from __future__ import annotations

from typing import TYPE_CHECKING

if TYPE_CHECKING:
    import torch

    from hpcrl.config.recipe import LossFnCfg


def kl_penalty(logprobs: torch.Tensor, ref_logprobs: torch.Tensor, kl_type: str) -> torch.Tensor:
    """Per-token estimate of KL(policy ‖ reference) from samples of the policy.

    With log_ratio = ref − logprobs: k1 = −log_ratio, k2 = log_ratio² / 2,
    k3 = exp(log_ratio) − 1 − log_ratio (unbiased and ≥ 0; Schulman's estimator).
    """
    import torch

    log_ratio = ref_logprobs - logprobs
    if kl_type == "k1":
        return -log_ratio
    if kl_type == "k2":
        return 0.5 * log_ratio.square()
    if kl_type == "k3":
        return torch.exp(log_ratio) - 1.0 - log_ratio
    raise ValueError(f"loss_fn.reference_policy_kl_type: {kl_type!r} is not k1, k2 or k3")


def clipped_pg_token_loss(
    logprobs: torch.Tensor,
    old_logprobs: torch.Tensor,
    advantages: torch.Tensor,
    clip_low: float,
    clip_high: float,
    dual_clip_c: float | None,
) -> tuple[torch.Tensor, torch.Tensor]:
    """PPO's clipped surrogate per token, as a loss (to minimise); advantages broadcast [B, 1].

    Returns (loss [B, T], clipped [B, T] bool: where the clipped branch was taken).
    Dual clip (c > 1) bounds the loss of negative-advantage tokens at −c·A.
    """
    import torch

    ratio = torch.exp(logprobs - old_logprobs)
    unclipped = -advantages * ratio
    clipped = -advantages * torch.clamp(ratio, 1.0 - clip_low, 1.0 + clip_high)
    loss = torch.maximum(unclipped, clipped)
    was_clipped = clipped > unclipped
    if dual_clip_c is not None:
        bound = -advantages * dual_clip_c
        loss = torch.where(advantages < 0, torch.minimum(loss, bound), loss)
    return loss, was_clipped


def _normalise(
    per_token: torch.Tensor, batch, mask: torch.Tensor, num_global_tokens: float, token_level: bool
):
    """Sum of masked per-token values as a share of the global mean."""
    if token_level:
        return (per_token * mask).sum() / num_global_tokens
    tokens_per_row = mask.sum(dim=1).clamp(min=1.0)
    row_means = (per_token * mask).sum(dim=1) / tokens_per_row
    return (row_means / batch["num_global_sequences"].to(row_means.dtype)).sum()


def grpo_loss(
    logprobs: torch.Tensor, batch, num_global_tokens: float, cfg: LossFnCfg
) -> tuple[torch.Tensor, dict[str, float]]:
    """Clipped policy-gradient loss + optional KL penalty to the reference policy.

    Use as ``functools.partial(grpo_loss, cfg=recipe.loss_fn)``.
    """
    import torch

    mask = batch["token_mask"].to(logprobs.dtype)
    old = batch["old_logprobs"].to(logprobs.dtype)
    advantages = batch["advantages"].to(logprobs.dtype)[:, None]
    pg, was_clipped = clipped_pg_token_loss(
        logprobs, old, advantages, cfg.ratio_clip_min, cfg.ratio_clip_max, cfg.ratio_clip_c
    )
    if cfg.use_importance_sampling_correction:
        # Sampler and trainer numerics differ; reweight toward the trainer's old policy.
        pg = pg * torch.exp(old - batch["generation_logprobs"].to(logprobs.dtype)).detach()
    total = pg
    metrics: dict[str, float] = {}
    if cfg.reference_policy_kl_penalty > 0:
        kl = kl_penalty(
            logprobs, batch["ref_logprobs"].to(logprobs.dtype), cfg.reference_policy_kl_type
        )
        if cfg.use_on_policy_kl_approximation:
            kl = kl * torch.exp(logprobs - old).detach()
        total = pg + cfg.reference_policy_kl_penalty * kl
        metrics["kl"] = float((kl.detach() * mask).sum() / num_global_tokens)
    loss = _normalise(total, batch, mask, num_global_tokens, cfg.token_level_loss)
    ratio = torch.exp(logprobs.detach() - old)
    metrics["pg_loss"] = float(
        _normalise(pg.detach(), batch, mask, num_global_tokens, cfg.token_level_loss)
    )
    metrics["clip_fraction"] = float((was_clipped.to(mask.dtype) * mask).sum() / num_global_tokens)
    metrics["ratio_mean"] = float((ratio * mask).sum() / num_global_tokens)
    return loss, metrics


def sft_loss(
    logprobs: torch.Tensor, batch, num_global_tokens: float
) -> tuple[torch.Tensor, dict[str, float]]:
    """Masked cross-entropy: −Σ token_mask·logprobs / num_global_tokens."""
    mask = batch["token_mask"].to(logprobs.dtype)
    loss = -(logprobs * mask).sum() / num_global_tokens
    return loss, {"num_tokens": float(mask.sum())}
