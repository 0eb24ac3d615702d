"""NeMo RL's GRPO formulas outside the loss (rewards, advantages, masks, loss metrics), written
here from reading its code at main 7ea279a (nemo_rl/algorithms/grpo.py, reward_functions.py,
advantage_estimator.py, utils.py, loss/loss_functions.py, data/processors.py), in plain Python
floats and lists, independent of hpcrl's code. Where NeMo RL computes a value in a particular
way (a group's std as E[x²] − E[x]², a NaN turned into 0), the reference does the same, so a
test compares hpcrl with what NeMo RL would print. Used by tests/core/test_grpo_nemo_math.py.
"""

from __future__ import annotations

import math
from collections.abc import Sequence

# ----------------------------------------------------------------------------- rewards


def scale(rewards: Sequence[float], lo: float, hi: float, to_lo: float, to_hi: float):
    """grpo.scale_rewards: clamp to [lo, hi], then linearly onto [to_lo, to_hi]."""
    return [to_lo + (min(max(r, lo), hi) - lo) / (hi - lo) * (to_hi - to_lo) for r in rewards]


def dapo_shaping(rewards, lengths, buffer: int, penalty: float, max_length: int):
    """reward_functions.apply_reward_shaping, DAPO branch: r + min(−(n − (L − B))/B·P, 0)."""
    expected = max_length - buffer
    return [
        r + min(-(n - expected) / buffer * penalty, 0)
        for r, n in zip(rewards, lengths, strict=True)
    ]


def stop_properly(rewards, truncated, coef: float):
    """reward_functions.apply_reward_shaping, stop-properly branch."""
    return [r * coef if t else r for r, t in zip(rewards, truncated, strict=True)]


# ----------------------------------------------------------------------------- advantages


def baseline_and_std_per_prompt(prompts, rewards, leave_one_out: bool):
    """utils.calculate_baseline_and_std_per_prompt with every sample valid: per prompt
    (equal token tuples), baseline = mean over the pool (all, or all but i), std =
    sqrt((E[x²] − E[x]²)·k/(k − 1)) with k the pool size, NaN → 0; a prompt with one sample:
    baseline = reward, std = 0."""
    baseline, std = list(rewards), [0.0] * len(rewards)
    for prompt in dict.fromkeys(map(tuple, prompts)):
        rows = [i for i, p in enumerate(prompts) if tuple(p) == prompt]
        if len(rows) <= 1:
            continue
        for i in rows:
            pool = [rewards[j] for j in rows if not (leave_one_out and j == i)]
            k = len(pool)
            mean = sum(pool) / k
            square = sum(x * x for x in pool) / k
            try:
                value = math.sqrt((square - mean * mean) * (k / (k - 1)))
            except (ZeroDivisionError, ValueError):
                value = 0.0
            baseline[i], std[i] = mean, 0.0 if math.isnan(value) else value
    return baseline, std


def grpo_advantages(prompts, rewards, normalize: bool, leave_one_out: bool):
    """GRPOAdvantageEstimator.compute_advantage (one value per sample)."""
    baseline, std = baseline_and_std_per_prompt(prompts, rewards, leave_one_out)
    out = []
    for r, b, s in zip(rewards, baseline, std, strict=True):
        a = r - b
        out.append(a / (s + 1e-6) if normalize and s > 0 else a)
    return out


def gdpo_advantages(prompts, components, weights, normalize: bool, leave_one_out: bool):
    """GDPOAdvantageEstimator.compute_advantage (one value per sample): ``components`` maps
    reward/<name> to its rewards, taken in sorted name order; per component the grpo
    advantage, then Σ w·A, then (A − mean) / std over the batch (torch.std: k − 1), or
    A − mean where that std is 0."""
    names = sorted(components)
    weights = [1.0] * len(names) if weights is None else weights
    combined = [0.0] * len(prompts)
    for weight, name in zip(weights, names, strict=True):
        part = grpo_advantages(prompts, components[name], normalize, leave_one_out)
        combined = [c + weight * a for c, a in zip(combined, part, strict=True)]
    mean = sum(combined) / len(combined)
    std = math.sqrt(sum((c - mean) ** 2 for c in combined) / (len(combined) - 1))
    return [(c - mean) / std if std > 0 else c - mean for c in combined]


def reinforce_plus_plus_advantages(prompts, rewards, token_counts, minus_baseline: bool):
    """ReinforcePlusPlusAdvantageEstimator.compute_advantage without KL in the reward: the
    per-sample value broadcast to its tokens, normalised over all masked tokens."""
    if minus_baseline:
        baseline, _ = baseline_and_std_per_prompt(prompts, rewards, False)
        raw = [r - b for r, b in zip(rewards, baseline, strict=True)]
    else:
        raw = list(rewards)
    total = sum(token_counts)
    mean = sum(a * n for a, n in zip(raw, token_counts, strict=True)) / total
    var = sum((a - mean) ** 2 * n for a, n in zip(raw, token_counts, strict=True)) / total
    return [(a - mean) / math.sqrt(max(var, 1e-8)) for a in raw]


def clip(values, low, high):
    """grpo._clip_grpo_advantages."""
    out = list(values)
    if low is not None:
        out = [max(v, low) for v in out]
    if high is not None:
        out = [min(v, high) for v in out]
    return out


# ----------------------------------------------------------------------------- data


def fit_prompt(ids, max_seq_length: int):
    """data/processors.py (one message): length ≥ max_seq_length → the first
    min(4, max_seq_length) tokens and loss_multiplier 0."""
    if len(ids) >= max_seq_length:
        return list(ids[: min(4, max_seq_length)]), 0.0
    return list(ids), 1.0


# ----------------------------------------------------------------------------- log-prob errors


def seq_mult_prob_errors(generation, prev, mask):
    """compute_and_apply_seq_logprob_error_masking: per sequence Σ mask·exp(|g − p|·mask) /
    Σ mask (None for a sequence without loss tokens)."""
    out = []
    for g_row, p_row, m_row in zip(generation, prev, mask, strict=True):
        count = sum(m_row)
        total = sum(
            m * math.exp(abs(g - p) * m) for g, p, m in zip(g_row, p_row, m_row, strict=True)
        )
        out.append(total / count if count > 0 else None)
    return out


def _kl(log_ratio: float, kind: str) -> float:
    return {"k1": -log_ratio, "k2": log_ratio**2 / 2, "k3": math.exp(log_ratio) - 1 - log_ratio}[
        kind
    ]


def loss_metrics(curr, prev, generation, mask, kl_type: str, clip_min: float, clip_max: float):
    """ClippedPGLossFn's diagnostic metrics over one batch (global token normalisation),
    with curr/prev already through mask_out_neg_inf_logprobs (−inf → 0)."""
    tokens = [
        (c, p, g)
        for c_row, p_row, g_row, m_row in zip(curr, prev, generation, mask, strict=True)
        for c, p, g, m in zip(c_row, p_row, g_row, m_row, strict=True)
        if m
    ]
    n = len(tokens)

    def mean(values):
        return sum(values) / n

    ratios = [math.exp(c - p) for c, p, _ in tokens]
    clamped = [min(max(r, 1 - clip_min), 1 + clip_max) for r in ratios]
    js = []
    for _, p, g in tokens:
        m = math.log(0.5 * math.exp(p) + 0.5 * math.exp(g))
        js.append(0.5 * (math.exp(p - m) - (p - m) - 1) + 0.5 * (math.exp(g - m) - (g - m) - 1))
    return {
        "token_mult_prob_error": mean([math.exp(abs(g - p)) for _, p, g in tokens]),
        "gen_kl_error": mean([_kl(p - g, kl_type) for _, p, g in tokens]),
        "policy_kl_error": mean([_kl(g - p, kl_type) for _, p, g in tokens]),
        "js_divergence_error": mean(js),
        "approx_entropy": -mean([math.exp(c - g) * c for c, _, g in tokens]),
        "probs_ratio": mean(ratios),
        "probs_ratio_clamped": mean(clamped),
        "probs_ratio_min": min(ratios),
        "probs_ratio_max": max(ratios),
        "probs_ratio_clamped_min": min(clamped),
        "probs_ratio_clamped_max": max(clamped),
    }
