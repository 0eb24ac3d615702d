"""How many steps a recipe's data gives, and which keys its rows need: one source for the
planner's checks and the driver.

As in NeMo RL, whose loop ends when ``max_num_epochs`` passes over the data are done or
``max_num_steps`` are taken (``while current_epoch < max_num_epochs and total_steps <
max_num_steps``), a run takes ``min(max_num_steps, steps in max_num_epochs epochs)`` steps.
NeMo RL's dataloader drops each epoch's last partial batch; hpcrl's sampler continues a
batch into the next epoch, so ``rows * epochs // rows_per_step`` steps (the same when the
rows divide into whole steps, as in every shipped recipe).
"""

from __future__ import annotations

import math

from hpcrl.config.recipe import Recipe


def required_keys(recipe: Recipe) -> list[str]:
    """The keys every row of a JSONL data file must have: the prompt and GRPO's answer (the
    environment's ground truth) or SFT's response."""
    data = recipe.data
    if recipe.algorithm == "sft":
        return [data.prompt_key, data.response_key]
    return [data.prompt_key, data.answer_key]


def rows_per_step(recipe: Recipe) -> int:
    """Data rows one step takes: GRPO's prompts per step, SFT's global batch."""
    if recipe.grpo is not None:
        return recipe.grpo.num_prompts_per_step
    return recipe.policy.train_global_batch_size


def num_steps_in_epochs(num_rows: int, rows_per_step: int, num_epochs: int) -> int:
    """Whole steps that fit in ``num_epochs`` passes over the data (at least 1)."""
    return max(1, (num_rows * num_epochs) // rows_per_step)


def rows_needed(num_steps: int, rows_per_step: int, num_epochs: int) -> int:
    """The fewest rows for which ``num_epochs`` passes give ``num_steps`` steps."""
    return math.ceil(num_steps * rows_per_step / num_epochs)


def epochs_needed(num_steps: int, rows_per_step: int, num_rows: int) -> int:
    """The fewest passes over ``num_rows`` rows that give ``num_steps`` steps."""
    return math.ceil(num_steps * rows_per_step / num_rows)
