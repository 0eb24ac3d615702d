"""DAPO's dynamic sampling (``grpo.use_dynamic_sampling``): generate batches of
``int(num_prompts_per_step × batch_multiplier)`` prompts, keep only the prompt groups whose
rewards differ (a group of equal rewards has all-zero advantages and teaches nothing), until
``num_prompts_per_step`` groups are kept; at most ``dynamic_sampling_max_gen_batches``
batches per step, after which the step fails with the settings to change."""

from __future__ import annotations

from collections.abc import Callable, Sequence
from typing import Any

import attrs

from hpcrl.core.algorithms.reward_terms import groups_with_signal


def select_groups(rollouts: Any, groups: Sequence[int], num_generations: int) -> Any:
    """The rollouts of the given prompt groups, in that order."""
    import torch

    rows = [g * num_generations + k for g in groups for k in range(num_generations)]
    index = torch.tensor(rows, dtype=torch.long)
    generation = rollouts.generation
    fields = {
        field.name: _rows_of(getattr(generation, field.name), index)
        for field in attrs.fields(type(generation))
    }
    return attrs.evolve(
        rollouts,
        prompts=[rollouts.prompts[r] for r in rows],
        answers=[rollouts.answers[r] for r in rows],
        responses=[rollouts.responses[r] for r in rows],
        rewards=rollouts.rewards.index_select(0, index),
        truncated=rollouts.truncated.index_select(0, index),
        generation=type(generation)(**fields),
    )


def _rows_of(value: Any, index: Any) -> Any:
    """Per-row tensors are cut to the rows; optional fields (None) and the batch's engine
    figures (``metrics``) stay as they are."""
    import torch

    return value.index_select(0, index) if isinstance(value, torch.Tensor) else value


def _joined_fields(generations: Sequence[Any]) -> dict[str, Any]:
    """Tensor fields concatenated (right-padded); an optional field only when every batch
    has it; engine figures (``metrics``) summed: the batches ran one after another."""
    import torch

    from hpcrl.core.workers.sharding import concat_right_padded

    tensors: dict[str, list[Any]] = {}
    others: dict[str, Any] = {}
    for field in attrs.fields(type(generations[0])):
        values = [getattr(g, field.name) for g in generations]
        if all(isinstance(v, torch.Tensor) for v in values):
            tensors[field.name] = values
        elif all(isinstance(v, dict) for v in values):
            summed: dict[str, float] = {}
            for figures in values:
                for key, number in figures.items():
                    summed[key] = summed.get(key, 0.0) + number
            others[field.name] = summed
        else:
            others[field.name] = None
    parts = [{name: values[i] for name, values in tensors.items()} for i in range(len(generations))]
    return {**concat_right_padded(parts, {}), **others}


def concat_rollouts(parts: Sequence[Any]) -> Any:
    """Rollouts of several generation batches as one (token tensors right-padded)."""
    import torch

    if len(parts) == 1:
        return parts[0]
    generation_type = type(parts[0].generation)
    joined = _joined_fields([p.generation for p in parts])
    return attrs.evolve(
        parts[0],
        prompts=[x for p in parts for x in p.prompts],
        answers=[x for p in parts for x in p.answers],
        responses=[x for p in parts for x in p.responses],
        rewards=torch.cat([p.rewards for p in parts]),
        truncated=torch.cat([p.truncated for p in parts]),
        generation=generation_type(**joined),
    )


def sample_dynamically(
    sample: Callable[[int], Any], num_prompts: int, num_generations: int, max_batches: int
) -> tuple[Any, dict[str, float]]:
    """``sample(batch_index)`` → rollouts of one generation batch. Returns exactly
    ``num_prompts`` groups with reward signal, and how many batches/groups it took."""
    kept: list[Any] = []
    num_kept = num_seen = 0
    for batch_index in range(max_batches):
        rollouts = sample(batch_index)
        groups = groups_with_signal(rollouts.rewards, num_generations)
        num_seen += len(rollouts.rewards) // num_generations
        take = groups[: num_prompts - num_kept]
        if take:
            kept.append(select_groups(rollouts, take, num_generations))
            num_kept += len(take)
        if num_kept == num_prompts:
            metrics = {
                "dynamic_sampling_gen_batches": float(batch_index + 1),
                "dynamic_sampling_kept_fraction": num_kept / num_seen,
            }
            return concat_rollouts(kept), metrics
    raise RuntimeError(
        f"dynamic sampling kept {num_kept} of the {num_prompts} prompt groups it needs after "
        f"{max_batches} generation batches (grpo.dynamic_sampling_max_gen_batches): too few "
        "groups have rewards that differ. Raise grpo.dynamic_sampling_max_gen_batches or "
        "grpo.batch_multiplier, or set grpo.use_dynamic_sampling=false"
    )
