"""DAPO's dynamic sampling (``grpo.use_dynamic_sampling``): generate batches of
``int(num_prompts_per_step × batch_multiplier)`` prompts, keep only the rollouts whose prompt
group shows reward spread (a group of equal rewards has all-zero advantages and teaches
nothing), until ``num_prompts_per_step × num_generations_per_prompt`` rollouts are kept; at
most ``dynamic_sampling_max_gen_batches`` batches per step, after which the step fails with
the settings to change.

As NeMo RL (``dynamic_sampling`` in its grpo.py, main 7ea279a): a rollout is kept when the
std of its group is not 0, groups formed by prompt content, the std that of the *unshaped*
rewards (scaled, before the overlong / stop-properly shaping: a group of equally correct
answers of different lengths is still dropped) and, with
``grpo.use_leave_one_out_baseline``, the leave-one-out std (the other members'); the kept
rollouts of successive batches are joined in order and cut to the number needed.
"""

from __future__ import annotations

from collections.abc import Callable, Sequence
from typing import Any

import attrs

from hpcrl.core.algorithms.advantages import group_baseline_std, prompt_groups


def rows_with_signal(rollouts: Any, *, leave_one_out: bool) -> list[int]:
    """Indices of the rollouts dynamic sampling keeps (see the module docstring)."""
    groups = prompt_groups(rollouts.prompt_keys)
    _, std = group_baseline_std(rollouts.unshaped_rewards, groups, leave_one_out=leave_one_out)
    return [int(i) for i in (std != 0).nonzero().flatten().tolist()]


def select_rows(rollouts: Any, rows: Sequence[int]) -> Any:
    """The given rollouts, in that order (every per-row field of ``Rollouts`` and of its
    generation)."""
    import torch

    index = torch.tensor(list(rows), dtype=torch.long)
    generation = rollouts.generation
    fields = {
        field.name: _rows_of(getattr(generation, field.name), index)
        for field in attrs.fields(type(generation))
    }
    changes = {
        field.name: _rows_of(getattr(rollouts, field.name), index)
        for field in attrs.fields(type(rollouts))
        if field.name != "generation"
    }
    return attrs.evolve(rollouts, generation=type(generation)(**fields), **changes)


def _rows_of(value: Any, index: Any) -> Any:
    """Per-row tensors and lists are cut to the rows; optional fields (None) and the batch's
    engine figures (``metrics``) stay as they are."""
    import torch

    if isinstance(value, torch.Tensor):
        return value.index_select(0, index)
    if isinstance(value, list):
        return [value[i] for i in index.tolist()]
    return value


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
    changes: dict[str, Any] = {}
    for field in attrs.fields(type(parts[0])):
        if field.name == "generation":
            continue
        values = [getattr(p, field.name) for p in parts]
        if isinstance(values[0], torch.Tensor):
            changes[field.name] = torch.cat(values)
        elif isinstance(values[0], list):
            changes[field.name] = [x for value in values for x in value]
        # else: the same for every batch (the reward components' names)
    return attrs.evolve(parts[0], generation=generation_type(**joined), **changes)


def sample_dynamically(
    sample: Callable[[int], Any], num_rows: int, max_batches: int, *, leave_one_out: bool
) -> tuple[Any, dict[str, float]]:
    """``sample(batch_index)`` → rollouts of one generation batch. Returns exactly
    ``num_rows`` rollouts with reward signal, and how many batches/rollouts it took."""
    kept: list[Any] = []
    num_kept = num_seen = 0
    for batch_index in range(max_batches):
        rollouts = sample(batch_index)
        rows = rows_with_signal(rollouts, leave_one_out=leave_one_out)
        num_seen += len(rollouts.rewards)
        take = rows[: num_rows - num_kept]
        if take:
            kept.append(select_rows(rollouts, take))
            num_kept += len(take)
        if num_kept == num_rows:
            metrics = {
                "dynamic_sampling_gen_batches": float(batch_index + 1),
                "dynamic_sampling_kept_fraction": num_kept / num_seen,
            }
            return concat_rollouts(kept), metrics
    raise RuntimeError(
        f"dynamic sampling kept {num_kept} of the {num_rows} rollouts it needs after "
        f"{max_batches} generation batches (grpo.dynamic_sampling_max_gen_batches): too few "
        "prompt groups have rewards that differ. Raise grpo.dynamic_sampling_max_gen_batches "
        "or grpo.batch_multiplier, or set grpo.use_dynamic_sampling=false"
    )
