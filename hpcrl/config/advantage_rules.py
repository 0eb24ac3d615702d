"""Load-time rules of NeMo RL's advantage options: ``grpo.adv_estimator``, advantage
clipping and ``grpo.seq_logprob_error_threshold`` (hpcrl.core.algorithms.advantages,
docs/algorithms.md). NeMo RL finds an unknown estimator name when its training loop starts;
here it fails at load time with the key path."""

from __future__ import annotations

from hpcrl.config.errors import Problem
from hpcrl.config.recipe import Recipe

ESTIMATOR = "grpo.adv_estimator"
IMPLEMENTED_ESTIMATORS = ("grpo", "reinforce_plus_plus")
#: NeMo RL's other estimators and why hpcrl cannot run them.
REFUSED_ESTIMATORS = {
    "gdpo": "GDPO combines per-component advantages of several named rewards "
    "(reward/<name>); hpcrl's environments return one reward per response",
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
            fix=f"set {ESTIMATOR}.name to grpo or reinforce_plus_plus",
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


ADVANTAGE_RULES = (rule_adv_estimator, rule_advantage_clip)
