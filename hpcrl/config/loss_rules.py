"""Rules for the GRPO loss and sampling settings (``loss_fn.*``, GRPO's temperature).

NeMo RL asserts these inside its loss function, i.e. on the GPUs after the queue wait;
here they fail at load time with their key paths. docs/algorithms.md explains each setting.
"""

from __future__ import annotations

from hpcrl.config.errors import Problem
from hpcrl.config.recipe import Recipe

LOSS = "loss_fn"
TIS = f"{LOSS}.truncated_importance_sampling"


def rule_truncated_importance_sampling(recipe: Recipe) -> list[Problem]:
    cfg = recipe.loss_fn
    kind = cfg.truncated_importance_sampling_type
    high = cfg.truncated_importance_sampling_ratio
    low = cfg.truncated_importance_sampling_ratio_min
    if kind is None:
        if high is None and low is None:
            return []
        return [
            Problem(
                path=f"{TIS}_type",
                message="truncation bounds are set but no truncation type",
                fix=f"set {TIS}_type to tis, icepop or seq-mask-tis, or remove {TIS}_ratio/_ratio_min",
            )
        ]
    problems = []
    if not cfg.use_importance_sampling_correction:
        problems.append(
            Problem(
                path=f"{LOSS}.use_importance_sampling_correction",
                value=False,
                message=f"{TIS}_type={kind} truncates importance weights, which are only applied with the correction on",
                fix=f"set {LOSS}.use_importance_sampling_correction=true, or {TIS}_type=null",
            )
        )
    if high is None or not high > 0:
        problems.append(
            Problem(
                path=f"{TIS}_ratio",
                value=high,
                message=f"{kind} needs a positive upper bound for the importance weights",
                fix=f"set {TIS}_ratio, e.g. 2.0 (tis) or 5.0 (icepop)",
            )
        )
    return problems + _truncation_lower_bound(kind, high, low)


def _truncation_lower_bound(kind: str, high: float | None, low: float | None) -> list[Problem]:
    path = f"{TIS}_ratio_min"
    if low is None:
        if kind == "tis":
            return []  # tis clamps from 0
        return [
            Problem(
                path=path,
                message=f"{kind} drops weights below a lower bound; none is set",
                fix=f"set {path}, e.g. 0.5 for icepop or 0.999 for seq-mask-tis",
            )
        ]
    if low < 0 or (high is not None and low > high):
        return [
            Problem(
                path=path,
                value=low,
                message=f"must lie in [0, {TIS}_ratio ({high})]",
                fix=f"set {path} between 0 and {high}",
            )
        ]
    return []


def rule_sequence_level_importance_ratios(recipe: Recipe) -> list[Problem]:
    """GSPO's sequence-level ratio goes with a loss averaged per sequence (NeMo RL asserts
    token_level_loss false); hpcrl does not weight it by sequence-level importance
    sampling, so the correction is refused with it."""
    cfg = recipe.loss_fn
    if not cfg.sequence_level_importance_ratios:
        return []
    problems = []
    if cfg.token_level_loss:
        problems.append(
            Problem(
                path=f"{LOSS}.token_level_loss",
                value=True,
                message="sequence-level importance ratios (GSPO) go with a loss averaged per "
                "sequence (NeMo RL asserts the same)",
                fix=f"set {LOSS}.token_level_loss=false, or "
                f"{LOSS}.sequence_level_importance_ratios=false",
            )
        )
    if cfg.use_importance_sampling_correction:
        problems.append(
            Problem(
                path=f"{LOSS}.use_importance_sampling_correction",
                value=True,
                message="the sequence-level importance-sampling correction that NeMo RL "
                "applies with GSPO is not implemented by hpcrl",
                fix=f"set {LOSS}.use_importance_sampling_correction=false, or "
                f"{LOSS}.sequence_level_importance_ratios=false",
            )
        )
    return problems


def rule_grpo_sampling_temperature(recipe: Recipe) -> list[Problem]:
    """GRPO learns from differences within a group of samples; greedy decoding has none."""
    temperature = recipe.policy.generation.temperature
    if recipe.grpo is None or temperature != 0:
        return []
    return [
        Problem(
            path="policy.generation.temperature",
            value=temperature,
            message="GRPO needs sampled responses: at temperature 0 every response to a prompt is the same and every advantage is 0 (validation is greedy regardless)",
            fix="set policy.generation.temperature=1.0",
        )
    ]


def rule_force_on_policy_ratio(recipe: Recipe) -> list[Problem]:
    """A ratio of 1 is the truth only while the policy has not changed since the old
    log-probs: one optimizer step per rollout batch (NeMo RL requires the same)."""
    grpo = recipe.grpo
    if not recipe.loss_fn.force_on_policy_ratio or grpo is None:
        return []
    rollouts = grpo.num_prompts_per_step * grpo.num_generations_per_prompt
    if recipe.policy.train_global_batch_size == rollouts:
        return []
    return [
        Problem(
            path=f"{LOSS}.force_on_policy_ratio",
            value=True,
            message="a forced ratio of 1 needs one optimizer step per rollout batch: "
            f"policy.train_global_batch_size ({recipe.policy.train_global_batch_size}) must "
            f"equal grpo.num_prompts_per_step x grpo.num_generations_per_prompt ({rollouts})",
            fix=f"set policy.train_global_batch_size={rollouts}, or "
            f"{LOSS}.force_on_policy_ratio=false",
        )
    ]


def rule_cispo(recipe: Recipe) -> list[Problem]:
    """CISPO weights each token's log-prob by its clipped ratio: settings that remove the
    ratio, make it per sequence, cap the loss after it or average per sequence do not fit
    (NeMo RL asserts the same in its loss function)."""
    cfg = recipe.loss_fn
    if not cfg.use_cispo:
        return []
    # (key, its value, the value that fits CISPO, why the value does not)
    clashes = (
        ("force_on_policy_ratio", cfg.force_on_policy_ratio, False, "forces the ratio to 1"),
        (
            "sequence_level_importance_ratios",
            cfg.sequence_level_importance_ratios,
            False,
            "makes the ratio one per sequence; CISPO's is per token",
        ),
        ("ratio_clip_c", cfg.ratio_clip_c, None, "caps the PPO surrogate CISPO replaces"),
        ("token_level_loss", cfg.token_level_loss, True, "CISPO's loss is a mean over tokens"),
    )
    return [
        Problem(
            path=f"{LOSS}.{key}",
            value=value,
            message=f"{LOSS}.use_cispo is true and this value {why}",
            fix=f"set {LOSS}.{key}={'null' if fits is None else str(fits).lower()}, "
            f"or {LOSS}.use_cispo=false",
        )
        for key, value, fits, why in clashes
        if value != fits
    ]


LOSS_RULES = (
    rule_cispo,
    rule_force_on_policy_ratio,
    rule_truncated_importance_sampling,
    rule_sequence_level_importance_ratios,
    rule_grpo_sampling_temperature,
)
