"""Which asynchronous GRPO a recipe asks for, whichever way it spells it: hpcrl's (and NeMo
RL's ``run_grpo``) ``grpo.async_grpo``, or NeMo RL's single-controller ``async_rl``
(``hpcrl.config.recipe_async_rl`` says how one is read onto the other).
"""

from __future__ import annotations

from hpcrl.config.recipe import AsyncGrpoCfg, Recipe

#: NeMo RL's samplers that pick finished prompt groups (hpcrl.core.algorithms.async_grpo_groups)
GROUP_SAMPLERS = ("windowed", "ready_first")


def async_grpo_settings(recipe: Recipe) -> AsyncGrpoCfg | None:
    """The asynchronous GRPO a recipe asks for, in either spelling: NeMo RL's ``async_rl``
    (in_order sampler, lookahead >= 1; lookahead 0 is synchronous; windowed and ready_first
    always asynchronous) or ``grpo.async_grpo``
    (enabled); None: synchronous GRPO. The rules refuse both spellings at once."""
    if recipe.grpo is None:
        return None
    if recipe.async_rl is not None:
        sampler = recipe.async_rl.sampler
        lookahead = sampler.max_lookahead_versions
        if sampler.name in GROUP_SAMPLERS:
            # the group samplers dispatch ahead of the trainer whatever the window: always
            # asynchronous; their window is how old a trained group's weights may be
            lookahead = max(1, sampler.max_staleness_versions)
        elif lookahead == 0:
            return None
        return AsyncGrpoCfg(
            enabled=True,
            max_trajectory_age_steps=lookahead,
            in_flight_weight_updates=True,
            recompute_kv_cache_after_weight_updates=(
                recipe.async_rl.recompute_kv_cache_after_weight_updates
            ),
        )
    return recipe.grpo.async_grpo if recipe.grpo.async_enabled else None
