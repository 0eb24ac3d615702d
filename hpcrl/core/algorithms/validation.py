"""Validation on ``data.val_path`` every ``val_period`` steps (and at start, at end if asked).

GRPO: one response per validation prompt, sampled as NeMo RL samples it (never greedily: at
``policy.generation.val_temperature`` / ``val_top_p``, which default to the training
``temperature`` / ``top_p``; the same seed every time, so two validations differ only by the
weights), scored by the environment → ``val_reward_mean`` (NeMo RL's ``val:accuracy``) and
``val_avg_length``. SFT: masked
cross-entropy of the validation pairs under the current weights (no update) → ``val_loss``.
"""

from __future__ import annotations

from collections.abc import Callable, Sequence
from typing import Any

import attrs

from hpcrl.config.recipe import GenerationCfg, Recipe
from hpcrl.core.algorithms.grpo import context_length, decode_responses
from hpcrl.core.algorithms.sft import build_sft_batch
from hpcrl.core.data.prompts import encode_prompt, fit_prompt, prompt_length_limit
from hpcrl.core.policy import Policy

ValidateFn = Callable[[], dict[str, float]]


def validation_due(
    step: int, val_period: int, val_at_start: bool, *, val_at_end: bool = False, last_step: int = 0
) -> bool:
    """Step 0 means 'before the first step'. As in NeMo RL, val_at_start validates before
    the first step whatever val_period says, val_at_end after the last one (``last_step``)
    whatever it says, and a val_period of 0 or less (its -1) turns periodic validation off."""
    if step == 0:
        return val_at_start
    if val_at_end and step == last_step:
        return True
    return val_period > 0 and step % val_period == 0


def grpo_validation(
    policy: Policy, recipe: Recipe, tokenizer: Any, env: Any, rows: Sequence[dict]
) -> dict[str, float]:
    """A sampled response to every validation prompt (``validation_sampling``), mean reward."""
    import torch

    data = recipe.data
    limit = prompt_length_limit(data.max_input_seq_length, context_length(recipe))
    use_chat = recipe.policy.tokenizer.chat_template is not None
    kwargs = recipe.policy.tokenizer.chat_template_kwargs
    prompts = [str(row[data.prompt_key]) for row in rows]
    # A prompt that does not fit is scored on its stub's response, as in NeMo RL.
    prompt_ids = [
        fit_prompt(row.get("prompt_ids") or encode_prompt(tokenizer, p, use_chat, kwargs), limit)[0]
        for row, p in zip(rows, prompts, strict=True)
    ]
    policy.prepare_for_generation()
    generation = policy.generate(prompt_ids, validation_sampling(recipe.policy.generation), 0)
    policy.prepare_for_training()
    answers = [str(row.get(data.answer_key, "")) for row in rows]
    rewards = torch.tensor(env.score(prompts, decode_responses(tokenizer, generation), answers))
    # NeMo RL's validation metrics under hpcrl's names: accuracy (the mean reward) and
    # avg_length (mean response tokens); hpcrl.config.checkpoint_metrics maps them.
    return {
        "val_reward_mean": float(rewards.mean()),
        "val_avg_length": float(generation.response_lengths.float().mean()),
        "val_num_prompts": float(len(rows)),
    }


def validation_sampling(generation: GenerationCfg) -> GenerationCfg:
    """The training sampling settings with the validation ones in their place."""
    return attrs.evolve(
        generation,
        temperature=(
            generation.temperature
            if generation.val_temperature is None
            else generation.val_temperature
        ),
        top_p=generation.top_p if generation.val_top_p is None else generation.val_top_p,
    )


def sft_validation(
    policy: Policy, recipe: Recipe, tokenizer: Any, rows: Sequence[dict], world_size: int
) -> dict[str, float]:
    """Token-mean negative log-likelihood of the validation responses; ``world_size``: the
    planned training ranks (``JobSpec.world_size``)."""
    # Pad to a multiple of the world size (every data-parallel size divides it) with
    # copies of the last row that the mask ignores.
    padded = list(rows) + [rows[-1]] * (-len(rows) % world_size)
    batch = build_sft_batch(recipe, tokenizer, padded)
    batch["token_mask"][len(rows) :] = 0.0
    logprobs = policy.get_logprobs(batch)
    mask = batch["token_mask"]
    loss = -(logprobs * mask).sum() / mask.sum().clamp(min=1.0)
    return {"val_loss": float(loss), "val_num_examples": float(len(rows))}
