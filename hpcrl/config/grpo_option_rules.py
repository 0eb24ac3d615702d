"""Load-time rules of NeMo RL's GRPO options that hpcrl implements: single-turn rollouts,
dynamic sampling, reward shaping and scaling (the advantage options: advantage_rules.py)."""

from __future__ import annotations

from hpcrl.config.errors import Problem
from hpcrl.config.recipe import GrpoCfg, Recipe

G = "grpo"


def rule_single_turn(recipe: Recipe) -> list[Problem]:
    grpo = recipe.grpo
    if grpo is None or grpo.max_rollout_turns == 1:
        return []
    return [
        Problem(
            path=f"{G}.max_rollout_turns",
            value=grpo.max_rollout_turns,
            message="multi-turn rollouts (environments that answer back) are not supported "
            "by hpcrl yet",
            fix=f"set {G}.max_rollout_turns=1 (the math environment answers once)",
        )
    ]


def generation_batch_prompts(grpo: GrpoCfg) -> int:
    """Prompts of one dynamic-sampling generation batch: NeMo RL's
    ``int(num_prompts_per_step * batch_multiplier)`` (the multiplier may be a float)."""
    return int(grpo.num_prompts_per_step * grpo.batch_multiplier)


def rule_dynamic_sampling(recipe: Recipe) -> list[Problem]:
    grpo = recipe.grpo
    if grpo is None:
        return []
    problems = []
    multiplier = grpo.batch_multiplier
    if not grpo.use_dynamic_sampling and multiplier != 1:
        # NeMo RL asserts the same: the multiplier only feeds dynamic sampling.
        problems.append(
            Problem(
                path=f"{G}.batch_multiplier",
                value=multiplier,
                message="generates extra prompts for dynamic sampling to choose from, so it "
                "must be 1 without use_dynamic_sampling; NeMo RL stops on it too (its GRPO "
                "setup asserts batch_multiplier == 1 unless use_dynamic_sampling is true)",
                fix=f"set {G}.batch_multiplier=1, or {G}.use_dynamic_sampling=true",
            )
        )
    elif grpo.use_dynamic_sampling and generation_batch_prompts(grpo) < 1:
        problems.append(
            Problem(
                path=f"{G}.batch_multiplier",
                value=multiplier,
                message=f"each generation batch takes int({G}.num_prompts_per_step × "
                f"batch_multiplier) = int({grpo.num_prompts_per_step} × {multiplier}) = "
                f"{generation_batch_prompts(grpo)} prompts",
                fix=f"set {G}.batch_multiplier so that batch holds at least one prompt, "
                "e.g. 1.0 (more than 1 gives dynamic sampling more groups to choose from)",
            )
        )
    return problems


def rule_reward_terms(recipe: Recipe) -> list[Problem]:
    grpo = recipe.grpo
    if grpo is None:
        return []
    problems = []
    scaling = grpo.reward_scaling
    if scaling.enabled and scaling.source_max <= scaling.source_min:
        problems.append(
            Problem(
                path=f"{G}.reward_scaling.source_max",
                value=scaling.source_max,
                message=f"must be larger than source_min ({scaling.source_min})",
                fix="give the range the environment's rewards fall in, e.g. 0.0 to 1.0",
            )
        )
    if grpo.reward_shaping.enabled:
        problems += _shaping_problems(recipe)
    return problems


def _shaping_problems(recipe: Recipe) -> list[Problem]:
    """NeMo RL asserts these in ``apply_reward_shaping``, at the first step."""
    assert recipe.grpo is not None
    shaping = recipe.grpo.reward_shaping
    path = f"{G}.reward_shaping"
    coef = shaping.stop_properly_penalty_coef
    if coef is not None:
        if 0.0 <= coef <= 1.0:
            return []
        return [
            Problem(
                path=f"{path}.stop_properly_penalty_coef",
                value=coef,
                message="must be in [0, 1]: truncated responses' rewards are multiplied by it",
                fix="e.g. 0.0 (a truncated response earns nothing), or null for DAPO's "
                "overlong penalty",
            )
        ]
    problems = []
    limit = shaping.max_response_length or recipe.policy.generation.max_new_tokens
    length = shaping.overlong_buffer_length
    if length is None or not 0 < length <= limit:
        problems.append(
            Problem(
                path=f"{path}.overlong_buffer_length",
                value=length,
                message=f"must be in (0, max_response_length = {limit}]",
                fix="e.g. 128: the last 128 tokens before the limit are penalised linearly",
            )
        )
    penalty = shaping.overlong_buffer_penalty
    if penalty is None or penalty < 0:
        problems.append(
            Problem(
                path=f"{path}.overlong_buffer_penalty",
                value=penalty,
                message="must be at least 0: the reward lost per buffer length past "
                "max_response_length − overlong_buffer_length",
                fix=f"set {path}.overlong_buffer_penalty=1.0",
            )
        )
    return problems


def rule_skip_reference_logprobs(recipe: Recipe) -> list[Problem]:
    """Skipping the reference log-probs leaves the KL term nothing to compare with: NeMo RL
    asserts the penalty is 0 then; at 0 hpcrl skips them whatever the switch says."""
    grpo = recipe.grpo
    penalty = recipe.loss_fn.reference_policy_kl_penalty
    if grpo is None or not grpo.skip_reference_policy_logprobs_calculation or penalty == 0:
        return []
    return [
        Problem(
            path=f"{G}.skip_reference_policy_logprobs_calculation",
            value=True,
            message=f"the KL penalty (loss_fn.reference_policy_kl_penalty = {penalty}) needs "
            "the reference policy's log-probs, so they cannot be skipped (NeMo RL asserts "
            "the penalty is 0 too)",
            fix=f"set loss_fn.reference_policy_kl_penalty=0, or "
            f"{G}.skip_reference_policy_logprobs_calculation=false",
        )
    ]


def rule_host_reference_unused(recipe: Recipe) -> list[Problem]:
    """``policy.automodel_cfg.reference_on_host`` places the reference model, which only
    GRPO's KL term builds: under SFT or a zero penalty the switch changes nothing."""
    cfg = recipe.policy.automodel_cfg
    penalty = recipe.loss_fn.reference_policy_kl_penalty
    if not (cfg.enabled and cfg.reference_on_host) or (recipe.grpo is not None and penalty):
        return []
    why = "SFT builds" if recipe.grpo is None else "loss_fn.reference_policy_kl_penalty = 0 builds"
    path = "policy.automodel_cfg.reference_on_host"
    return [
        Problem(
            path=path,
            value=True,
            message=f"has no effect: {why} no reference model",
            fix=f"remove {path}, or give GRPO a KL penalty (e.g. "
            "loss_fn.reference_policy_kl_penalty=0.01)",
            severity="warning",
        )
    ]


GRPO_OPTION_RULES = (
    rule_single_turn,
    rule_dynamic_sampling,
    rule_reward_terms,
    rule_skip_reference_logprobs,
    rule_host_reference_unused,
)
