"""``grpo.seq_logprob_error_threshold``: leave sequences on which the sampler and the trainer
disagree out of the loss (NeMo RL's ``compute_and_apply_seq_logprob_error_masking``).

A sequence's error is the mean over its loss tokens of exp|g − o| (g: the sampler's
log-prob, o: the trainer's old log-prob; −inf → 0 as in the loss): the sequence form of the
loss's ``token_mult_prob_error``, ≥ 1. With a threshold, sequences above it get sample mask 0:
they keep their place in their group's baseline (advantages are computed afterwards from all
rewards) and leave the loss and its denominators. The metrics are written every step, with or
without a threshold (NeMo RL's names):
``max/mean/min_seq_mult_prob_error`` over the sequences that count, the same ``*_after_mask``
over those kept, ``num_masked_seqs_by_logprob_error`` and ``masked_correct_pct`` (the share of
masked sequences whose reward is 1).
"""

from __future__ import annotations

from typing import TYPE_CHECKING, Any

from hpcrl.core.algorithms.losses import finite_or_zero

if TYPE_CHECKING:
    import torch


def sequence_logprob_errors(batch: dict[str, Any]) -> tuple[torch.Tensor, torch.Tensor]:
    """([N] each sequence's error, [N] bool: the sequence has loss tokens)."""
    import torch

    mask = batch["token_mask"].to(torch.float64)
    old = finite_or_zero(batch["old_logprobs"].to(torch.float64))
    error = torch.exp((batch["generation_logprobs"].to(torch.float64) - old).abs())
    tokens = mask.sum(dim=1)
    summed = torch.where(mask > 0, error, torch.zeros_like(error)).sum(dim=1)
    counted = tokens > 0
    return torch.where(counted, summed / tokens.clamp(min=1.0), 0.0), counted


def _extrema(errors: torch.Tensor, rows: torch.Tensor, suffix: str = "") -> dict[str, float]:
    chosen = errors[rows]
    if chosen.numel() == 0:
        values = (0.0, 0.0, 0.0)
    else:
        values = (float(chosen.max()), float(chosen.mean()), float(chosen.min()))
    return {
        f"{kind}_seq_mult_prob_error{suffix}": value
        for kind, value in zip(("max", "mean", "min"), values, strict=True)
    }


def mask_by_sequence_logprob_error(
    batch: dict[str, Any], rewards: torch.Tensor, threshold: float | None
) -> dict[str, float]:
    """Apply the threshold to ``batch`` (its sample and token masks) in place; the metrics."""
    errors, counted = sequence_logprob_errors(batch)
    metrics = _extrema(errors, counted)
    if threshold is None:
        return {
            **metrics,
            **{f"{key}_after_mask": value for key, value in metrics.items()},
            "num_masked_seqs_by_logprob_error": 0,
            "masked_correct_pct": 0.0,
        }
    sample_mask = batch["sample_mask"]
    kept = (errors <= threshold).to(sample_mask.dtype) * sample_mask
    masked = (sample_mask - kept) > 0
    num_masked = int(masked.sum())
    correct = float((rewards[masked] == 1).sum()) / num_masked if num_masked else 0.0
    batch["sample_mask"] = kept
    batch["token_mask"] = batch["token_mask"] * kept[:, None]
    return {
        **metrics,
        **_extrema(errors, (kept > 0) & counted, "_after_mask"),
        "num_masked_seqs_by_logprob_error": num_masked,
        "masked_correct_pct": correct,
    }
