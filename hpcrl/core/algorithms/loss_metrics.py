"""The GRPO loss's diagnostic metrics, under NeMo RL's names (``ClippedPGLossFn``'s metrics;
docs/algorithms.md, "Metrics"). Computed on the workers beside the loss, without gradient;
each mean is this micro-batch's share of the global token mean (÷ ``num_global_tokens``),
so backends add them up (hpcrl.core.metric_reduction); ``*_min``/``*_max`` are extrema.

With o = the old policy's log-prob (the trainer's, before this step), g = the sampler's,
c = the current one, over the loss tokens:
- token_mult_prob_error = mean exp|g − o| (1 when trainer and sampler agree);
- gen_kl_error = mean k(o − g), policy_kl_error = mean k(g − o): the loss's KL estimator k
  (``loss_fn.reference_policy_kl_type``, unclamped) from the sampler to the trainer and back;
- js_divergence_error = mean ½·[f(o − m) + f(g − m)] with m = log((e^o + e^g)/2) and
  f(x) = eˣ − x − 1 (NeMo RL's Jensen–Shannon estimate);
- approx_entropy = −mean exp(c − g)·c (entropy estimated from the sampler's samples);
- probs_ratio, probs_ratio_clamped = mean ρ and mean clip(ρ) with ρ = exp(c − o);
  probs_ratio_min / _max, probs_ratio_clamped_min / _max: their extrema.
"""

from __future__ import annotations

import math
from typing import TYPE_CHECKING

if TYPE_CHECKING:
    import torch


def masked_token_mean(values: torch.Tensor, mask: torch.Tensor, num_global_tokens: float):
    """Σ over the loss tokens / num_global_tokens; values outside the mask (prompt, padding:
    possibly inf) never enter."""
    import torch

    return torch.where(mask > 0, values, torch.zeros_like(values)).sum() / num_global_tokens


def kl_estimate(log_ratio: torch.Tensor, kl_type: str) -> torch.Tensor:
    """k1/k2/k3 of r = log(q/p) for samples of p, unclamped."""
    import torch

    if kl_type == "k1":
        return -log_ratio
    if kl_type == "k2":
        return 0.5 * log_ratio.square()
    return torch.exp(log_ratio) - 1.0 - log_ratio


def sampling_error_metrics(
    old: torch.Tensor,
    generation: torch.Tensor,
    current: torch.Tensor,
    mask: torch.Tensor,
    num_global_tokens: float,
    kl_type: str,
) -> dict[str, torch.Tensor]:
    """How far the trainer's distribution is from the sampler's (see the module docstring)."""
    import torch

    with torch.no_grad():
        old, generation, current = old.detach(), generation.detach(), current.detach()
        mean = lambda values: masked_token_mean(values, mask, num_global_tokens)  # noqa: E731
        log_mixture = torch.logaddexp(old, generation) - math.log(2.0)
        # NeMo RL's form: e^x − x − 1 with x = log p − log m, for p = old and p = sampler
        to_mixture_old = kl_estimate(old - log_mixture, "k3")
        to_mixture_gen = kl_estimate(generation - log_mixture, "k3")
        return {
            "token_mult_prob_error": mean(torch.exp((generation - old).abs())),
            "gen_kl_error": mean(kl_estimate(old - generation, kl_type)),
            "policy_kl_error": mean(kl_estimate(generation - old, kl_type)),
            "js_divergence_error": mean(0.5 * to_mixture_old + 0.5 * to_mixture_gen),
            "approx_entropy": -mean(torch.exp(current - generation) * current),
        }


def ratio_metrics(
    ratio: torch.Tensor, clamped: torch.Tensor, mask: torch.Tensor, num_global_tokens: float
) -> dict[str, torch.Tensor]:
    """Means and extrema of the probability ratio ρ and of clip(ρ) over the loss tokens; with
    no loss token in the micro-batch the extrema are +inf (min) and −inf (max)."""
    import torch

    with torch.no_grad():
        ratio, clamped = ratio.detach(), clamped.detach()
        counted = mask > 0
        metrics = {
            "probs_ratio": masked_token_mean(ratio, mask, num_global_tokens),
            "probs_ratio_clamped": masked_token_mean(clamped, mask, num_global_tokens),
        }
        inf = torch.full_like(ratio, math.inf)
        for name, values in (("probs_ratio", ratio), ("probs_ratio_clamped", clamped)):
            metrics[f"{name}_min"] = torch.where(counted, values, inf).amin()
            metrics[f"{name}_max"] = torch.where(counted, values, -inf).amax()
        return metrics
