"""Load-time rules of NeMo RL's advantage options: ``grpo.adv_estimator``, advantage
clipping and ``grpo.seq_logprob_error_threshold`` (hpcrl.core.algorithms.advantages,
docs/algorithms.md). NeMo RL finds an unknown estimator name when its training loop starts;
here it fails at load time with the key path."""

from __future__ import annotations

from hpcrl.config.errors import Problem
from hpcrl.config.recipe import Recipe

ESTIMATOR = "grpo.adv_estimator"
IMPLEMENTED_ESTIMATORS = ("grpo", "gdpo", "reinforce_plus_plus")
#: The reward components of NeMo RL's multi-reward environment, sorted as GDPO weighs them
#: (hpcrl.core.environments.math_multi_reward_env.REWARD_NAMES; text here: no job imports).
MULTI_REWARD_NAMES = ("reward/correctness", "reward/format", "reward/integer")
#: NeMo RL's other estimators and why hpcrl cannot run them.
REFUSED_ESTIMATORS = {
    "opd": "on-policy distillation takes its advantages from a teacher model's log-probs; "
    "hpcrl has no teacher models (distillation is not supported yet)",
}


def rule_adv_estimator(recipe: Recipe) -> list[Problem]:
    grpo = recipe.grpo
    if grpo is None or grpo.adv_estimator.name in IMPLEMENTED_ESTIMATORS:
        return []
    name = grpo.adv_estimator.name
    unknown = "not an advantage estimator NeMo RL knows (grpo, gdpo, reinforce_plus_plus, opd)"
    return [
        Problem(
            path=f"{ESTIMATOR}.name",
            value=name,
            message=REFUSED_ESTIMATORS.get(name, unknown),
            fix=f"set {ESTIMATOR}.name to grpo, gdpo or reinforce_plus_plus",
        )
    ]


def rule_gdpo_rewards(recipe: Recipe) -> list[Problem]:
    """GDPO needs several named rewards per response: NeMo RL stops at its first step when
    the environment returns one; here it is refused at load time. ``reward_weights`` takes
    one weight per component."""
    from hpcrl.config.datasets import data_env_name

    grpo = recipe.grpo
    if grpo is None:
        return []
    weights = grpo.adv_estimator.reward_weights
    if grpo.adv_estimator.name != "gdpo":
        if weights is None:
            return []
        return [
            Problem(
                path=f"{ESTIMATOR}.reward_weights",
                value=list(weights),
                message=f"weighs gdpo's reward components; the {grpo.adv_estimator.name} "
                "estimator never reads it, so it would be ignored",
                fix=f"remove {ESTIMATOR}.reward_weights, or set {ESTIMATOR}.name: gdpo",
            )
        ]
    env_name = data_env_name(recipe)
    if env_name != "math_multi_reward":
        return [
            Problem(
                path=f"{ESTIMATOR}.name",
                value="gdpo",
                message="GDPO combines per-component advantages of several named rewards "
                f"(reward/<name>), and this recipe's environment ({env_name}) returns one "
                "reward per response",
                fix="score with NeMo RL's multi-reward math environment "
                "(data.default.env_name: math_multi_reward, or env.name: math_multi_reward "
                f"with data.train_path), or set {ESTIMATOR}.name: grpo",
            )
        ]
    if weights is None or len(weights) == len(MULTI_REWARD_NAMES):
        return []
    return [
        Problem(
            path=f"{ESTIMATOR}.reward_weights",
            value=list(weights),
            message=f"has {len(weights)} weights, but math_multi_reward returns "
            f"{len(MULTI_REWARD_NAMES)} reward components ({', '.join(MULTI_REWARD_NAMES)}, "
            "the order the weights apply in)",
            fix=f"give {len(MULTI_REWARD_NAMES)} weights in that order, or remove "
            f"{ESTIMATOR}.reward_weights (1.0 each)",
        )
    ]


def rule_advantage_clip(recipe: Recipe) -> list[Problem]:
    grpo = recipe.grpo
    if grpo is None:
        return []
    low, high = grpo.advantage_clip_low, grpo.advantage_clip_high
    if low is None or high is None or low <= high:
        return []
    return [
        Problem(
            path="grpo.advantage_clip_low",
            value=low,
            message=f"is above grpo.advantage_clip_high ({high}): every advantage would "
            "become advantage_clip_high",
            fix="give a window, e.g. advantage_clip_low=-5.0 and advantage_clip_high=5.0",
        )
    ]


ADVANTAGE_RULES = (rule_adv_estimator, rule_gdpo_rewards, rule_advantage_clip)
