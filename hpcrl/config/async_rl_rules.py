"""Cross-field rules of ``async_rl`` (NeMo RL's single-controller GRPO,
``hpcrl.config.recipe_async_rl``): what hpcrl cannot honour is refused by key, and the
checks NeMo RL's own single controller makes at setup are made here, before a job is queued.
"""

from __future__ import annotations

from hpcrl.config.errors import Problem
from hpcrl.config.recipe import Recipe

# What each refused sampler does that hpcrl's loop cannot (NeMo RL's staleness_sampler.py).
# hpcrl's generation takes and returns whole batches of num_prompts_per_step prompts in data
# order and step s trains on exactly batch s: there are no finished groups to pick among.
_OTHER_SAMPLERS = {
    "windowed": "dispatches prompt groups one by one without waiting for the trainer (bounded "
    "only by async_rl.max_buffered_rollouts and max_inflight_prompts), each stamped with the "
    "weight version it started on; a step at trainer version v takes, as they finish, any "
    "finished groups started on versions v-{window}..v, earliest dispatched first, passing "
    "over unfinished ones (sample_freshest_first: least stale first), so which prompts a step "
    "trains on depends on which generations finished first; finished groups older than the window are evicted "
    "untrained and unfinished ones aborted",
    "weight_fifo": "drains finished groups oldest weight version first, whichever prompts "
    "they hold",
    "ready_first": "trains on whichever groups finish first, across weight versions",
    "custom": "is a class of the user's own",
}


def rule_async_rl_sampler(recipe: Recipe) -> list[Problem]:
    """Only the in_order sampler is hpcrl's async GRPO (``recipe_async_rl``)."""
    if recipe.async_rl is None or recipe.async_rl.sampler.name == "in_order":
        return []
    sampler = recipe.async_rl.sampler
    window = sampler.max_staleness_versions if sampler.name != "custom" else 1
    return [
        Problem(
            path="async_rl.sampler.name",
            value=sampler.name,
            message=f"NeMo RL's {sampler.name} sampler "
            f"({_OTHER_SAMPLERS[sampler.name].format(window=window)}) is not supported yet: "
            "hpcrl generates whole batches of grpo.num_prompts_per_step prompts in data order "
            "and trains each step on exactly one of them, every prompt once, none dropped (the "
            "in_order sampler); it has no per-group rollouts to select among",
            fix=f"set async_rl.sampler.name=in_order and "
            f"async_rl.sampler.max_lookahead_versions={window} (the same bound on how old a "
            "rollout's weights may be; what grpo.async_grpo.max_trajectory_age_steps does)",
        )
    ]


def rule_async_rl_legacy_block(recipe: Recipe) -> list[Problem]:
    """NeMo RL's single controller reads ``async_rl`` only and refuses ``grpo.async_grpo``."""
    if recipe.async_rl is None or recipe.grpo is None or not recipe.grpo.async_enabled:
        return []
    return [
        Problem(
            path="grpo.async_grpo.enabled",
            value=True,
            message="async_rl and grpo.async_grpo both ask for asynchronous GRPO (NeMo RL's "
            "single controller reads only async_rl and refuses a grpo.async_grpo block)",
            fix="set grpo.async_grpo: null (as NeMo RL's single-controller configs do), or "
            "remove async_rl",
        )
    ]


def rule_async_rl_streaming(recipe: Recipe) -> list[Problem]:
    """A step waits for its whole batch: hpcrl does not stream partial batches into it."""
    if recipe.async_rl is None or recipe.grpo is None:
        return []
    wanted = recipe.grpo.num_prompts_per_step
    given = recipe.async_rl.min_groups_for_streaming_train
    if given == wanted:
        return []
    if given > wanted:
        message = (
            f"must not exceed grpo.num_prompts_per_step ({wanted}): a step would wait for "
            "more prompt groups than it has (NeMo RL refuses it too)"
        )
    else:
        # NeMo RL's chunks each get log-probs and advantages of whole groups and one
        # optimizer step at the end is scaled by the whole step's token count: with the
        # per-group grpo estimator the update is the whole batch's; what it changes is when
        # training starts and, under windowed, which finished groups the later chunks take.
        message = (
            f"streaming training (starting a step once {given} of its {wanted} prompt groups "
            "have finished, training each chunk of finished groups as it comes and taking one "
            "optimizer step when all have been trained) is not supported yet: hpcrl waits for "
            "the step's whole batch, then trains on it"
        )
    return [
        Problem(
            path="async_rl.min_groups_for_streaming_train",
            value=given,
            message=message,
            fix="set async_rl.min_groups_for_streaming_train: ${grpo.num_prompts_per_step}",
        )
    ]


def rule_async_rl_capacity(recipe: Recipe) -> list[Problem]:
    """NeMo RL's setup checks: the buffer holds the lookahead's batches, and one step is one
    optimizer step."""
    if recipe.async_rl is None or recipe.grpo is None:
        return []
    grpo = recipe.grpo
    problems = []
    lookahead = recipe.async_rl.sampler.max_lookahead_versions
    needed = grpo.num_prompts_per_step * (lookahead + 1)
    if (
        recipe.async_rl.sampler.name == "in_order"
        and recipe.async_rl.max_buffered_rollouts < needed
    ):
        problems.append(
            Problem(
                path="async_rl.max_buffered_rollouts",
                value=recipe.async_rl.max_buffered_rollouts,
                message=f"must hold the batch in training and the {lookahead} ahead of it: "
                f"{needed} prompt groups (NeMo RL's rollouts would wait for room forever, "
                "and it refuses it too)",
                fix=f"set async_rl.max_buffered_rollouts={needed} or more",
            )
        )
    samples = grpo.num_prompts_per_step * grpo.num_generations_per_prompt
    if recipe.policy.train_global_batch_size != samples:
        problems.append(
            Problem(
                path="policy.train_global_batch_size",
                value=recipe.policy.train_global_batch_size,
                message=f"with async_rl a step is one optimizer step over its {samples} "
                "samples (grpo.num_prompts_per_step x num_generations_per_prompt; NeMo RL's "
                "single controller refuses several optimizer steps per step too)",
                fix=f"set policy.train_global_batch_size={samples}, or remove async_rl",
            )
        )
    return problems


ASYNC_RL_RULES = (
    rule_async_rl_sampler,
    rule_async_rl_legacy_block,
    rule_async_rl_streaming,
    rule_async_rl_capacity,
)
