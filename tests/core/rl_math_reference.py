"""The reference of test_rl_math.py: each GRPO/SFT term of NeMo RL's formulas written from
the formulas below in plain Python floats (no hpcrl code), with its analytic derivative; the
random batches and loss settings the tests compare hpcrl's loss with it on.

Formulas (NeMo RL's ClippedPGLossFn / GRPOAdvantageEstimator, keys in ``loss_fn``/``grpo``):

advantages (normalize_rewards, use_leave_one_out_baseline), n rewards per prompt:
    b_i = mean(r) or mean(r_j, j≠i);  s_i = sample std (denominator m−1) of the same m values
    (0 when m = 1);  A_i = r_i − b_i, then A_i / (s_i + 1e-6) where s_i > 0 (else A_i).
policy gradient per token, ratio ρ = exp(lp − old):
    L = max(−A·ρ, −A·clip(ρ, 1−ε_min, 1+ε_max)); with dual clip c (A < 0): min(L, −c·A)
    ∂L/∂lp = −A·ρ where the unclipped branch is taken, else 0.
importance weight (use_importance_sampling_correction): w = exp(old − gen), NaN/±inf → 0;
    tis: clamp(w, min or 0, max); icepop: w if min ≤ w ≤ max else 0;
    seq-mask-tis: w·[min ≤ exp(mean_t log w) ≤ max] per sequence.
KL (reference_policy_kl_type), r = clamp(ref − lp, ±kl_input_clamp_value):
    k1 = −r, k2 = r²/2, k3 = eʳ − 1 − r; value W·k clamped to ±kl_output_clamp_value with
    W = exp(lp − sg(lp)) (= 1) or, on-policy approximation, exp(lp − gen);
    ∂(W·k)/∂lp = W·(k + k')  with k1' = 1, k2' = lp − ref, k3' = 1 − eʳ  (so k3 → lp − ref);
    0 where either clamp bites.
token level: Σ_tokens mask·(w·L + β·KL) / N_tokens(global);  sequence level:
    Σ_rows [Σ_t mask·(…) / Σ_t mask] / N_sequences(global).
SFT: −Σ mask·lp / N_tokens(global).
"""

from __future__ import annotations

import math
import statistics

import attrs
import torch

from hpcrl.config.recipe import LossFnCfg

BASE = LossFnCfg(reference_policy_kl_penalty=0.0)


def ref_advantages(rewards: list[float], n: int, normalize: bool, loo: bool) -> list[float]:
    out = []
    for start in range(0, len(rewards), n):
        group = rewards[start : start + n]
        for i, r in enumerate(group):
            pool = [x for j, x in enumerate(group) if j != i] if loo else group
            if n == 1:
                out.append(0.0)
                continue
            baseline = sum(pool) / len(pool)
            std = statistics.stdev(pool) if len(pool) > 1 else 0.0
            a = r - baseline
            out.append(a / (std + 1e-6) if normalize and std > 0 else a)
    return out


def ref_pg(lp, old, a, lo, hi, c):
    """(loss, d loss / d lp) of one token."""
    ratio = math.exp(lp - old)
    unclipped, clipped = -a * ratio, -a * min(max(ratio, 1 - lo), 1 + hi)
    loss, grad = (unclipped, -a * ratio) if unclipped >= clipped else (clipped, 0.0)
    if c is not None and a < 0 and -c * a < loss:
        loss, grad = -c * a, 0.0
    return loss, grad


def ref_kl(lp, ref, kind, in_clamp, out_clamp, weight=1.0, weight_has_grad=True):
    """(value, d value / d lp) of W·k for one token; W = weight (its own gradient W)."""
    r = ref - lp
    clamped = in_clamp is not None and abs(r) > in_clamp
    if clamped:
        r = math.copysign(in_clamp, r)
    k = {"k1": -r, "k2": r * r / 2, "k3": math.exp(r) - 1 - r}[kind]
    dk = {"k1": 1.0, "k2": -r, "k3": 1 - math.exp(r)}[kind]
    value = weight * k
    grad = 0.0 if clamped else weight * (k if weight_has_grad else 0.0) + weight * dk
    if out_clamp is not None and abs(value) > out_clamp:
        return math.copysign(out_clamp, value), 0.0
    return value, grad


def ref_weight(old, gen):
    try:
        w = math.exp(old - gen)
    except OverflowError:
        return 0.0
    return 0.0 if math.isnan(w) or math.isinf(w) else w


def random_batch(seed: int, rows: int = 6, width: int = 7, dtype=torch.float64) -> dict:
    g = torch.Generator().manual_seed(seed)
    lp = -3 * torch.rand(rows, width, generator=g, dtype=dtype)
    mask = (torch.rand(rows, width, generator=g, dtype=dtype) > 0.3).to(dtype)
    mask[:, 0] = 0
    return {
        "lp": lp,
        "old_logprobs": lp + 0.4 * torch.randn(rows, width, generator=g, dtype=dtype),
        "generation_logprobs": lp + 0.6 * torch.randn(rows, width, generator=g, dtype=dtype),
        "ref_logprobs": lp + 1.5 * torch.randn(rows, width, generator=g, dtype=dtype),
        "advantages": torch.randn(rows, generator=g, dtype=dtype),
        "token_mask": mask,
        "num_global_sequences": torch.full((rows,), float(rows), dtype=dtype),
    }


def reference_loss(batch: dict, cfg: LossFnCfg) -> tuple[float, list[list[float]]]:
    """The whole GRPO loss and its gradient from the per-token references."""
    rows, width = batch["lp"].shape
    mask = batch["token_mask"].tolist()
    n_tokens = sum(map(sum, mask))
    total, grad = 0.0, [[0.0] * width for _ in range(rows)]
    for b in range(rows):
        count = sum(mask[b])
        scale = 1 / n_tokens if cfg.token_level_loss else 1 / (max(count, 1) * rows)
        row_terms = _row_terms(batch, b, cfg)
        for t in range(width):
            if mask[b][t]:
                value, d = row_terms[t]
                total += value * scale
                grad[b][t] = d * scale
    return total, grad


def _row_terms(batch, b, cfg):
    """Per token of row b: (w·L + β·KL, its derivative)."""
    get = {
        k: batch[k][b].tolist()
        for k in ("lp", "old_logprobs", "generation_logprobs", "ref_logprobs")
    }
    a = batch["advantages"][b].item()
    mask = batch["token_mask"][b].tolist()
    weights = _row_weights(get["old_logprobs"], get["generation_logprobs"], mask, cfg)
    terms = []
    for t in range(len(mask)):
        lp, old, gen, ref = (
            get[k][t] for k in ("lp", "old_logprobs", "generation_logprobs", "ref_logprobs")
        )
        pg, dpg = ref_pg(lp, old, a, cfg.ratio_clip_min, cfg.ratio_clip_max, cfg.ratio_clip_c)
        value, d = weights[t] * pg, weights[t] * dpg
        if cfg.reference_policy_kl_penalty:
            w = math.exp(lp - gen) if cfg.use_on_policy_kl_approximation else 1.0
            kl, dkl = ref_kl(
                lp,
                ref,
                cfg.reference_policy_kl_type,
                cfg.kl_input_clamp_value,
                cfg.kl_output_clamp_value,
                w,
            )
            value += cfg.reference_policy_kl_penalty * kl
            d += cfg.reference_policy_kl_penalty * dkl
        terms.append((value, d))
    return terms


def _row_weights(old, gen, mask, cfg):
    if not cfg.use_importance_sampling_correction:
        return [1.0] * len(old)
    w = [ref_weight(o, g) for o, g in zip(old, gen, strict=True)]
    kind, hi, lo = (
        cfg.truncated_importance_sampling_type,
        cfg.truncated_importance_sampling_ratio,
        cfg.truncated_importance_sampling_ratio_min,
    )
    if kind == "tis":
        return [min(max(x, lo or 0.0), hi) for x in w]
    if kind == "icepop":
        return [x if lo <= x <= hi else 0.0 for x in w]
    if kind == "seq-mask-tis":
        logs = [o - g for o, g, m in zip(old, gen, mask, strict=True) if m]
        geo = math.exp(sum(logs) / max(len(logs), 1))
        return w if lo <= geo <= hi else [0.0] * len(w)
    return w


CONFIGS = {
    "plain": BASE,
    "dual_clip": attrs.evolve(BASE, ratio_clip_c=3.0, ratio_clip_min=0.1, ratio_clip_max=0.28),
    "sequence_level": attrs.evolve(BASE, token_level_loss=False),
    "k3": LossFnCfg(reference_policy_kl_penalty=0.1),
    "k1_unclamped": LossFnCfg(
        reference_policy_kl_penalty=0.2,
        reference_policy_kl_type="k1",
        kl_input_clamp_value=None,
        kl_output_clamp_value=None,
    ),
    "k2_tight_clamps": LossFnCfg(
        reference_policy_kl_penalty=0.3,
        reference_policy_kl_type="k2",
        kl_input_clamp_value=1.0,
        kl_output_clamp_value=0.3,
    ),
    "on_policy_kl": LossFnCfg(reference_policy_kl_penalty=0.1, use_on_policy_kl_approximation=True),
    "is": attrs.evolve(BASE, use_importance_sampling_correction=True),
    "tis": attrs.evolve(
        BASE,
        use_importance_sampling_correction=True,
        truncated_importance_sampling_type="tis",
        truncated_importance_sampling_ratio=1.5,
        truncated_importance_sampling_ratio_min=0.6,
    ),
    "icepop": attrs.evolve(
        BASE,
        use_importance_sampling_correction=True,
        truncated_importance_sampling_type="icepop",
        truncated_importance_sampling_ratio=2.0,
        truncated_importance_sampling_ratio_min=0.5,
    ),
    "seq_mask_tis": attrs.evolve(
        BASE,
        use_importance_sampling_correction=True,
        truncated_importance_sampling_type="seq-mask-tis",
        truncated_importance_sampling_ratio=1.3,
        truncated_importance_sampling_ratio_min=0.8,
        token_level_loss=False,
    ),
    "everything": LossFnCfg(
        reference_policy_kl_penalty=0.05,
        ratio_clip_c=2.0,
        use_importance_sampling_correction=True,
        truncated_importance_sampling_type="tis",
        truncated_importance_sampling_ratio=2.0,
        use_on_policy_kl_approximation=True,
    ),
}
