"""The recipe schema's algorithm sections: ``grpo`` (with its reward and advantage options),
``sft`` and ``loss_fn``. Part of ``hpcrl.config.recipe`` (which re-exports every name);
frozen and keyword-only like the rest, each range beside its field (``bounded``), cross-field
rules in ``hpcrl.config.loss_rules``, ``grpo_option_rules`` and ``advantage_rules``.
"""

from __future__ import annotations

from typing import Literal

import attrs

from hpcrl.config.field_bounds import (
    POSITIVE_COUNT,
    FieldBound,
    at_least,
    batch_bound,
    bounded,
    seed_bound,
    steps_bound,
)
from hpcrl.config.shared_methods import SharedMethods


# --------------------------------------------------------------------------- algorithms
@attrs.frozen(kw_only=True)
class AsyncGrpoCfg(SharedMethods):
    """Overlap generation of the next batch with training on the current one."""

    enabled: bool = False
    max_trajectory_age_steps: int = bounded(1, at_least(1, "set it to 1 or more"), when="enabled")
    # Refit the engines right after each training step, at the next decode step of the
    # generations in flight, instead of behind them (hpcrl.core.generation.in_flight).
    in_flight_weight_updates: bool = False
    # With in-flight refits: the requests in flight recompute their KV caches with the new
    # weights (else they attend to what the old weights cached).
    recompute_kv_cache_after_weight_updates: bool = False


@attrs.frozen(kw_only=True)
class RewardShapingCfg(SharedMethods):
    """``grpo.reward_shaping``, applied after ``reward_scaling``: DAPO's overlong penalty (a
    response longer than max_response_length − overlong_buffer_length loses
    overlong_buffer_penalty per buffer length beyond it, without a floor), or with
    stop_properly_penalty_coef set, truncated responses' rewards times that coefficient."""

    enabled: bool = False
    overlong_buffer_length: int | None = 128  # None only with stop_properly_penalty_coef
    overlong_buffer_penalty: float | None = 1.0  # >= 0; None only with the coefficient
    max_response_length: int | None = None  # None: policy.generation.max_new_tokens
    stop_properly_penalty_coef: float | None = None  # in [0, 1]; None: DAPO's penalty


@attrs.frozen(kw_only=True)
class RewardScalingCfg(SharedMethods):
    """``grpo.reward_scaling``: rewards clamped to [source_min, source_max] and mapped
    linearly onto [target_min, target_max] before advantages."""

    enabled: bool = False
    source_min: float = 0.0
    source_max: float = 1.0
    target_min: float = 0.0
    target_max: float = 1.0


@attrs.frozen(kw_only=True)
class AdvEstimatorCfg(SharedMethods):
    """``grpo.adv_estimator`` (NeMo RL v0.7.0+): which advantage estimator, and its options
    (hpcrl.core.algorithms.advantages). opd is refused by the rules."""

    name: str = "grpo"  # grpo, gdpo or reinforce_plus_plus
    normalize_rewards: bool | None = None  # grpo; None: grpo.normalize_rewards
    use_leave_one_out_baseline: bool | None = None  # grpo; None: grpo.use_leave_one_out_...
    minus_baseline: bool = True  # reinforce_plus_plus: subtract the prompt group's mean
    # gdpo: weight of each reward component's advantage, in the components' sorted name
    # order; None: 1.0 each
    reward_weights: tuple[float, ...] | None = None


@attrs.frozen(kw_only=True)
class GrpoCfg(SharedMethods):
    """GRPO settings (``grpo``)."""

    num_prompts_per_step: int = bounded(8, POSITIVE_COUNT, batch_bound())
    num_generations_per_prompt: int = bounded(4, POSITIVE_COUNT, batch_bound())
    max_num_steps: int = bounded(100, POSITIVE_COUNT, steps_bound("grpo"))
    max_num_epochs: int = bounded(1, at_least(1, "e.g. 1"))
    normalize_rewards: bool = True
    use_leave_one_out_baseline: bool = True  # NeMo RL's default (its advantage estimator's)
    overlong_filtering: bool = False  # truncated responses (no stop) are left out of the loss
    val_period: int = 0  # <= 0: no periodic validation (NeMo RL's -1 and 0)
    val_at_start: bool = False
    val_at_end: bool = False  # also validate after the last step (NeMo RL's meaning)
    seed: int = bounded(42, seed_bound())
    # None: off, as NeMo RL reads `async_grpo: null` (its single-controller configs write it)
    async_grpo: AsyncGrpoCfg | None = attrs.field(factory=AsyncGrpoCfg)
    # NeMo RL's options (hpcrl.core.algorithms.reward_terms, dynamic sampling in grpo.py)
    max_rollout_turns: int = 1  # single-turn only; the rules refuse more
    use_dynamic_sampling: bool = False
    dynamic_sampling_max_gen_batches: int = bounded(
        10, at_least(1, "set {path}=10"), when="use_dynamic_sampling"
    )
    # prompts per generation batch = int(num_prompts_per_step x this), as in NeMo RL (a float)
    batch_multiplier: float = 1.0
    # true needs loss_fn.reference_policy_kl_penalty 0 (NeMo RL asserts it); at 0 hpcrl never
    # computes reference log-probs, as NeMo RL then turns this on itself
    skip_reference_policy_logprobs_calculation: bool = False
    reward_shaping: RewardShapingCfg = attrs.field(factory=RewardShapingCfg)
    reward_scaling: RewardScalingCfg = attrs.field(factory=RewardScalingCfg)
    adv_estimator: AdvEstimatorCfg = attrs.field(factory=AdvEstimatorCfg)
    advantage_clip_low: float | None = None  # clamp advantages from below; None: off
    advantage_clip_high: float | None = None  # from above; None: off
    # leave sequences whose mean exp|train − sampler log-prob| exceeds this out of the loss
    # None: off (metrics still kept)
    seq_logprob_error_threshold: float | None = bounded(
        None,
        FieldBound(
            low=1.0, fix="e.g. 1.5 (NeMo RL's example), or null to only record the "
            "*_seq_mult_prob_error metrics",
            message="must be at least 1: a sequence's error is the mean of exp(|trainer − "
            "sampler log-prob|) over its tokens, never below 1, so every sequence would be "
            "left out of the loss",
        ),
    )  # fmt: skip
    max_val_samples: int | None = None  # None: the whole validation set
    val_batch_size: int | None = None

    @property
    def async_enabled(self) -> bool:
        return self.async_grpo is not None and self.async_grpo.enabled


@attrs.frozen(kw_only=True)
class SftCfg(SharedMethods):
    """SFT settings (``sft``)."""

    max_num_steps: int = bounded(100, POSITIVE_COUNT, steps_bound("sft"))
    max_num_epochs: int = bounded(1, at_least(1, "e.g. 1"))
    val_period: int = 0  # <= 0: no periodic validation
    val_at_start: bool = False
    val_at_end: bool = False  # also validate after the last step (NeMo RL's meaning)
    # validation on the first val_batches x val_global_batch_size examples (None: all)
    val_batches: int | None = None
    val_global_batch_size: int | None = None
    seed: int = bounded(42, seed_bound())


def _kl_clamp() -> FieldBound:
    return FieldBound(
        low=0.0, low_open=True, message="a clamp bound must be positive",
        fix="set {path} to a positive number (NeMo RL: 20 for the input, 10 for the output) "
        "or null for no clamp",
    )  # fmt: skip


def _clip_epsilon(usual: str) -> FieldBound:
    return FieldBound(
        low=0, fix=f"set {{path}}={usual}",
        message="must be at least 0: it is the ε of the clip window [1 − "
        "loss_fn.ratio_clip_min, 1 + loss_fn.ratio_clip_max], not a bound of the ratio",
    )  # fmt: skip


@attrs.frozen(kw_only=True)
class LossFnCfg(SharedMethods):
    """Policy-gradient loss (``loss_fn``); SFT ignores it. Names, meanings and defaults are
    NeMo RL's (ClippedPGLossConfig); docs/algorithms.md gives every formula."""

    reference_policy_kl_penalty: float = 0.01  # 0: no KL term, no reference log-probs
    reference_policy_kl_type: Literal["k1", "k2", "k3"] = "k3"
    kl_input_clamp_value: float | None = bounded(20.0, _kl_clamp())  # |ref − logp|; None: off
    kl_output_clamp_value: float | None = bounded(10.0, _kl_clamp())  # |per-token KL|; None: off
    # PPO's ε: the ratio is clamped to [1 − ratio_clip_min, 1 + ratio_clip_max] (NeMo RL's
    # ClippedPGLossFn); a negative ε would move a bound past 1 and invert the window
    ratio_clip_min: float = bounded(0.2, _clip_epsilon("0.2"))
    ratio_clip_max: float = bounded(0.2, _clip_epsilon("0.2, or 0.28 as in DAPO"))
    # dual clip caps −A·r at −c·A for A < 0; c ≤ 1 would cut below the clip window. None: off
    ratio_clip_c: float | None = bounded(
        None,
        FieldBound(
            low=1.0, low_open=True, fix="set {path}=3.0, or null to turn dual clipping off",
            message="the dual-clip bound must exceed 1 (it caps the ratio of negative-advantage "
            "tokens from above; 3 is usual)",
        ),
    )  # fmt: skip
    use_on_policy_kl_approximation: bool = False
    use_importance_sampling_correction: bool = False
    truncated_importance_sampling_type: Literal["tis", "icepop", "seq-mask-tis"] | None = None
    truncated_importance_sampling_ratio: float | None = None  # upper bound of the weights
    truncated_importance_sampling_ratio_min: float | None = None  # lower bound
    # GSPO: every token's ratio is its sequence's exp(mean(logp − old)) (with a per-sequence
    # loss average, token_level_loss false, as NeMo RL asserts)
    sequence_level_importance_ratios: bool = False
    token_level_loss: bool = True
    # ratio = exp(logp − logp.detach()) = 1: the old log-probs are the current ones (one
    # optimizer step per rollout batch, which the rules require)
    force_on_policy_ratio: bool = False
    # CISPO (MiniMax-M1): −A·sg(clamp(ratio))·logp per token, the clipped ratio a weight
    # without gradient instead of PPO's min over two branches; every token keeps its gradient
    use_cispo: bool = False
