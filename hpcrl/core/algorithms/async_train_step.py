"""What both async GRPO loops (``async_grpo``: whole batches in order; ``async_grpo_groups``:
NeMo RL's group samplers) do once their rollouts are finished: log-probs, the train pass and
the step's metrics record (the async keys are described in ``async_grpo``'s docstring)."""

from __future__ import annotations

from typing import Any

from hpcrl.config.recipe import Recipe
from hpcrl.core.algorithms.grpo import (
    Rollouts,
    add_logprobs,
    build_train_batch,
    finish_train_batch,
    rollout_metrics,
    train_on_batch,
)
from hpcrl.core.algorithms.loop import StepTimer


def train_on_rollouts(
    policy: Any, recipe: Recipe, rollouts: Any, timer: StepTimer
) -> tuple[dict[str, Any], dict[str, Any], float]:
    """One optimizer step on finished rollouts, whoever sampled them: log-probs, the batch's
    sequence metrics, the train pass; (train metrics, sequence metrics, log-prob gap)."""
    batch = build_train_batch(recipe, rollouts)
    with timer.phase("logprobs"):
        add_logprobs(policy, recipe, batch)
    gap = logprob_gap(batch)
    sequence_metrics = finish_train_batch(recipe, rollouts, batch)
    with timer.phase("train"):
        train_metrics = train_on_batch(policy, recipe, batch)
    return train_metrics, sequence_metrics, gap


def logprob_gap(batch: dict[str, Any]) -> float:
    """Mean |trainer log-prob - sampler log-prob| over response tokens: ~0 for fresh
    samples, grows with the policy change since they were sampled."""
    import torch

    # With top-k/top-p a token outside the trainer's kept set has log-prob -inf: not counted.
    mask = batch["token_mask"] * torch.isfinite(batch["old_logprobs"])
    diff = (batch["old_logprobs"] - batch["generation_logprobs"]).abs()
    diff = torch.where(mask.bool(), diff, torch.zeros_like(diff))
    return float(diff.sum() / mask.sum().clamp(min=1.0))


def step_record(
    step: int,
    train_metrics: dict[str, float],
    rollouts: Rollouts,
    timer: StepTimer,
    step_s: float,
    generate_s: float,
    age: int,
) -> dict[str, Any]:
    """The metrics keys of ``grpo_step`` plus the async ones (see the module docstring)."""
    return {
        "step": step,
        **train_metrics,
        **rollout_metrics(rollouts, step_s, generate_s),
        **timer.as_metrics(),
        "time_generate_s": generate_s,
        "trajectory_age_steps": age,
        "sample_response": rollouts.responses[0],
    }
