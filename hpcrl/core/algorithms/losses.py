"""Loss functions computed on the workers (``hpcrl.core.policy.LossFn``).

Every function here is top-level (picklable) and returns a loss that is this micro-batch's
share of the global-batch loss: token sums divided by ``num_global_tokens`` (the loss-mask
token count of the whole global batch), so that micro-batch and data-parallel shares add up
to the loss of one big batch. Metrics are normalised the same way: the backend sums them
over micro-batches and ranks, which yields global token means. Metric values are detached
0-dim tensors on the loss's device, not Python floats: a float would make the host wait for
the device after every micro-batch; the backends add them up and read them once per step.

The GRPO loss is NeMo RL's ``ClippedPGLossFn`` term by term (docs/algorithms.md states every
formula with its ``loss_fn`` key): clipped surrogate with optional dual clip, importance
weights to the sampler's distribution (optionally truncated), and a clamped KL penalty
whose gradient is (logp − ref) per token.

Batch keys read here (all [B, T] unless noted): ``token_mask`` (1 on response tokens that
count), ``advantages`` [B], ``old_logprobs`` (policy before this step), ``ref_logprobs``
(reference policy; only with a KL penalty), ``generation_logprobs`` (sampler's),
``num_global_sequences`` [B] (every entry the number of sequences that count in the global
batch; for sequence-level normalisation and sequence-level metrics), and with top-k/top-p
``curr_logprobs_unfiltered`` (``hpcrl.core.policy.UNFILTERED_LOGPROBS_KEY``).
"""

from __future__ import annotations

from typing import TYPE_CHECKING

from hpcrl.core.algorithms.loss_metrics import (
    masked_token_mean,
    ratio_metrics,
    sampling_error_metrics,
)
from hpcrl.core.policy import UNFILTERED_LOGPROBS_KEY

if TYPE_CHECKING:
    import torch

    from hpcrl.config.recipe import LossFnCfg

KL_TYPES = ("k1", "k2", "k3")


def calculate_kl(
    logprobs: torch.Tensor,
    ref_logprobs: torch.Tensor,
    kl_type: str,
    input_clamp: float | None = None,
    output_clamp: float | None = None,
    weights: torch.Tensor | None = None,
) -> torch.Tensor:
    """Per-token estimate of KL(policy ‖ reference) from samples of the policy.

    With r = ref − logprobs, clamped to ±input_clamp: k1 = −r, k2 = r²/2,
    k3 = eʳ − 1 − r (Schulman's estimators). ``weights`` multiply the estimate before it is
    clamped to ±output_clamp; where the input clamp bites, the weights are detached too, so
    a clamped token passes no gradient at all.
    """
    import torch

    log_ratio = ref_logprobs - logprobs
    if input_clamp is not None:
        clamped = log_ratio.clamp(min=-input_clamp, max=input_clamp)
        if weights is not None:
            weights = torch.where(log_ratio == clamped, weights, weights.detach())
        log_ratio = clamped
    if kl_type == "k1":
        kl = -log_ratio
    elif kl_type == "k2":
        kl = 0.5 * log_ratio.square()
    elif kl_type == "k3":
        kl = torch.exp(log_ratio) - 1.0 - log_ratio
    else:
        raise ValueError(f"loss_fn.reference_policy_kl_type: {kl_type!r} is not k1, k2 or k3")
    if weights is not None:
        kl = weights * kl
    if output_clamp is not None:
        kl = kl.clamp(min=-output_clamp, max=output_clamp)
    return kl


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


def sequence_log_ratio(
    logprobs: torch.Tensor, old_logprobs: torch.Tensor, mask: torch.Tensor
) -> torch.Tensor:
    """GSPO's log-ratio: each sequence's mean over its masked tokens of logp − old, on every
    token of the sequence ([B, T]; the gradient flows through the mean). A sequence without
    tokens gets 0 (ratio 1)."""
    total = ((logprobs - old_logprobs) * mask).sum(dim=-1, keepdim=True)
    mean = total / mask.sum(dim=-1, keepdim=True).clamp(min=1.0)
    return mean.expand_as(logprobs)


def cispo_token_loss(
    logprobs: torch.Tensor,
    old_logprobs: torch.Tensor,
    advantages: torch.Tensor,
    clip_low: float,
    clip_high: float,
) -> tuple[torch.Tensor, torch.Tensor]:
    """CISPO's loss per token: −A · sg(clamp(ratio, 1 − clip_low, 1 + clip_high)) · logp.
    The gradient is −A · clipped ratio · ∇logp for every token, clipped or not (PPO's
    clipped branch has none). Returns (loss [B, T], clipped [B, T]: the ratio was clamped)."""
    import torch

    ratio = torch.exp(logprobs - old_logprobs).detach()
    weight = torch.clamp(ratio, 1.0 - clip_low, 1.0 + clip_high)
    return -advantages * weight * logprobs, weight != ratio


def importance_weights(
    old_logprobs: torch.Tensor,
    generation_logprobs: torch.Tensor,
    batch,
    num_global_tokens: float,
    cfg: LossFnCfg,
) -> tuple[torch.Tensor, dict[str, torch.Tensor]]:
    """w = exp(old − generation) per token (NaN/±inf → 0), truncated as configured.

    tis: clamp to [ratio_min or 0, ratio]; icepop: w outside [ratio_min, ratio] → 0;
    seq-mask-tis: whole sequences whose geometric-mean w lies outside [ratio_min, ratio]
    → 0, the others keep untruncated token weights. Returns (weights, metrics) where
    ``is_oob_ratio`` is the share of tokens (sequences for seq-mask-tis) out of bounds.
    """
    import torch

    def finite(values: torch.Tensor) -> torch.Tensor:
        return torch.nan_to_num(values, nan=0.0, posinf=0.0, neginf=0.0)

    weights = finite(torch.exp(old_logprobs - generation_logprobs)).detach()
    kind, high = cfg.truncated_importance_sampling_type, cfg.truncated_importance_sampling_ratio
    if kind is None or high is None:
        return weights, {}
    low = cfg.truncated_importance_sampling_ratio_min
    mask = batch["token_mask"].to(weights.dtype)
    if kind == "tis":
        low = 0.0 if low is None else low
        out = (weights > high) | (weights < low)
        share = _token_share(out, mask, num_global_tokens)
        return weights.clamp(min=low, max=high), {"is_oob_ratio": share}
    assert low is not None, "the rules require truncated_importance_sampling_ratio_min"
    if kind == "icepop":
        kept = (weights >= low) & (weights <= high)
        share = _token_share(~kept, mask, num_global_tokens)
        return torch.where(kept, weights, torch.zeros_like(weights)), {"is_oob_ratio": share}
    assert kind == "seq-mask-tis", kind
    log_w = finite(old_logprobs - generation_logprobs)
    row_mean = (log_w * mask).sum(dim=1) / mask.sum(dim=1).clamp(min=1.0)
    geo_mean = torch.exp(row_mean)
    kept = ((geo_mean >= low) & (geo_mean <= high)).to(weights.dtype)
    counted = (mask.sum(dim=1) > 0).to(weights.dtype)
    sequences = batch["num_global_sequences"].to(weights.dtype)
    share = (((1.0 - kept) * counted) / sequences).sum()
    return weights * kept[:, None], {"is_oob_ratio": share}


def _token_share(flags: torch.Tensor, mask: torch.Tensor, num_global_tokens: float) -> torch.Tensor:
    return (flags.to(mask.dtype) * mask).sum() / num_global_tokens


def _normalise(
    per_token: torch.Tensor, batch, mask: torch.Tensor, num_global_tokens: float, token_level: bool
):
    """Sum of masked per-token values as a share of the global mean."""
    if token_level:
        return (per_token * mask).sum() / num_global_tokens
    tokens_per_row = mask.sum(dim=1).clamp(min=1.0)
    row_means = (per_token * mask).sum(dim=1) / tokens_per_row
    return (row_means / batch["num_global_sequences"].to(row_means.dtype)).sum()


def _kl_term(logprobs: torch.Tensor, batch, cfg: LossFnCfg) -> torch.Tensor:
    """Per-token penalty KL: the unfiltered current log-probs against the reference, weighted
    by exp(lp − sg(lp)) (value 1; it adds the score-function gradient, so the gradient of a
    token's k3 is lp − ref) or, with use_on_policy_kl_approximation, by exp(lp − generation)."""
    import torch

    current = batch.get(UNFILTERED_LOGPROBS_KEY, logprobs).to(logprobs.dtype)
    if cfg.use_on_policy_kl_approximation:
        weights = torch.exp(current - batch["generation_logprobs"].to(logprobs.dtype))
    else:
        weights = torch.exp(current - current.detach())
    weights = torch.nan_to_num(weights, nan=0.0, posinf=0.0, neginf=0.0)
    return calculate_kl(
        current,
        batch["ref_logprobs"].to(logprobs.dtype),
        cfg.reference_policy_kl_type,
        cfg.kl_input_clamp_value,
        cfg.kl_output_clamp_value,
        weights,
    )


def finite_or_zero(logprobs: torch.Tensor) -> torch.Tensor:
    """−inf (a token the trainer's top-k/top-p dropped) and other non-finite log-probs → 0,
    with no gradient there: NeMo RL's ``mask_out_neg_inf_logprobs``, which keeps the token in
    the loss mask (so a token both passes dropped has ratio 1 and adds a constant)."""
    import torch

    return torch.where(torch.isfinite(logprobs), logprobs, torch.zeros_like(logprobs))


def grpo_loss(
    logprobs: torch.Tensor, batch, num_global_tokens: float, cfg: LossFnCfg
) -> tuple[torch.Tensor, dict[str, torch.Tensor]]:
    """Clipped policy-gradient loss + optional KL penalty to the reference policy.

    Use as ``functools.partial(grpo_loss, cfg=recipe.loss_fn)``. Current and old log-probs
    pass through ``finite_or_zero`` first (NeMo RL's handling of top-k/top-p: the token
    stays in every denominator, including a sequence's own token count).
    """
    import torch

    mask = batch["token_mask"].to(logprobs.dtype)
    current = finite_or_zero(logprobs)
    # force_on_policy_ratio: NeMo RL's ratio exp(logp − logp.detach()), 1 with gradient
    old = (
        current.detach()
        if cfg.force_on_policy_ratio
        else finite_or_zero(batch["old_logprobs"].to(logprobs.dtype))
    )
    generation = batch["generation_logprobs"].to(logprobs.dtype)
    advantages = batch["advantages"].to(logprobs.dtype)[:, None]
    # the log-ratio each token's surrogate uses: its own, or (GSPO) its sequence's mean
    log_ratio = (
        sequence_log_ratio(current, old, mask)
        if cfg.sequence_level_importance_ratios
        else current - old
    )
    zeros = torch.zeros_like(log_ratio)
    if cfg.use_cispo:
        pg, was_clipped = cispo_token_loss(
            current, old, advantages, cfg.ratio_clip_min, cfg.ratio_clip_max
        )
    else:
        pg, was_clipped = clipped_pg_token_loss(
            log_ratio, zeros, advantages, cfg.ratio_clip_min, cfg.ratio_clip_max, cfg.ratio_clip_c
        )
    metrics: dict[str, torch.Tensor] = {}
    if cfg.use_importance_sampling_correction:
        weights, is_metrics = importance_weights(old, generation, batch, num_global_tokens, cfg)
        pg = pg * weights
        metrics.update(is_metrics)
        metrics["sampling_importance_ratio"] = (weights * mask).sum() / num_global_tokens
    level = cfg.token_level_loss
    pg_loss = _normalise(pg, batch, mask, num_global_tokens, level)
    loss = pg_loss
    if cfg.reference_policy_kl_penalty != 0:
        kl = _kl_term(logprobs, batch, cfg)
        kl_loss = _normalise(kl, batch, mask, num_global_tokens, level)
        loss = pg_loss + cfg.reference_policy_kl_penalty * kl_loss
        metrics["kl"] = metrics["kl_penalty"] = kl_loss.detach()
    ratio = torch.exp(log_ratio.detach())
    clamped = ratio.clamp(1.0 - cfg.ratio_clip_min, 1.0 + cfg.ratio_clip_max)
    metrics["pg_loss"] = pg_loss.detach()
    metrics["clip_fraction"] = (was_clipped.to(mask.dtype) * mask).sum() / num_global_tokens
    metrics["ratio_mean"] = masked_token_mean(ratio, mask, num_global_tokens)  # = probs_ratio
    metrics.update(ratio_metrics(ratio, clamped, mask, num_global_tokens))
    metrics.update(
        sampling_error_metrics(
            old, generation, current, mask, num_global_tokens, cfg.reference_policy_kl_type
        )
    )
    return loss, metrics


def sft_loss(
    logprobs: torch.Tensor, batch, num_global_tokens: float
) -> tuple[torch.Tensor, dict[str, torch.Tensor]]:
    """Masked cross-entropy: −Σ token_mask·logprobs / num_global_tokens."""
    mask = batch["token_mask"].to(logprobs.dtype)
    loss = -(logprobs * mask).sum() / num_global_tokens
    return loss, {"num_tokens": mask.sum().detach()}
