"""Async GRPO (``grpo.async_grpo.enabled``): separate vLLM workers sample the next batches
while the trainer trains on the current one.

With ``max_trajectory_age_steps = A`` the generation workers run A batches ahead: batch s is
submitted at the start of step s - A with the weights the trainer had then, and trained on at
step s, when the trainer's weights are A optimizer steps newer. Each engine runs its calls in
submission order and a refit is queued behind the batches already submitted, so a batch is
sampled with exactly the weights version it records. The loss corrects the stale samples with
importance sampling (``loss_fn.use_importance_sampling_correction``, which the config rules
require with async); a batch older than the bound is never trained on (an internal invariant:
the look-ahead equals the bound).

With ``in_flight_weight_updates`` (NeMo RL's meaning) the engines are refit right after each
training step, without waiting for the batches they are sampling: those go on with the new
weights from their next token (``recompute_kv_cache_after_weight_updates``: after recomputing
their KV caches with them; ``hpcrl.core.generation.in_flight``). A batch's age still counts
from its submission, so from the oldest weights any of its tokens came from (a batch never
starts before the refit issued ahead of it has landed: ``GenerationGroup.submit`` waits for
it): the bound holds as before, and the sampler's per-token log-probs, which the importance-sampling correction
reads, are those of whichever weights sampled each token. ``generation_refits_in_flight``
counts the refits that landed while the batch was being sampled (summed over engines).

Metrics per step add ``trajectory_age_steps``, ``time_generate_wait_s`` (how long the trainer
waited for its batch: ~0 when generation is fully hidden) and ``time_generate_s`` (the batch's
wall time from submission to collection, overlapping earlier steps).

Checkpoints save the data position after the batches already submitted: a resumed run skips
those A batches of prompts rather than sampling them twice.
"""

from __future__ import annotations

import time
from collections import deque
from collections.abc import Callable
from typing import Any

import attrs

from hpcrl.config.async_settings import GROUP_SAMPLERS, async_grpo_settings
from hpcrl.config.recipe import Recipe
from hpcrl.core.algorithms.async_train_step import step_record, train_on_rollouts
from hpcrl.core.algorithms.grpo import PromptBatch, Rollouts, expand_prompts, score_rollouts
from hpcrl.core.algorithms.loop import StepTimer, generation_seed
from hpcrl.core.data.jsonl import EpochSampler
from hpcrl.core.policy import AsyncGenerationPolicy, Policy


@attrs.frozen(kw_only=True)
class InFlightBatch:
    """A submitted batch: the rollout rows and the engines' pending work."""

    step: int  # the step that will train on it
    submitted_at_step: int  # sampled with the weights the trainer had when this step began
    prompts: PromptBatch
    pending: Any  # PendingShards
    submitted_at_s: float


class AsyncGrpoStep:
    """Callable ``step -> metrics record``, like ``hpcrl.core.algorithms.grpo.grpo_step``."""

    def __init__(
        self,
        policy: Policy,
        recipe: Recipe,
        tokenizer: Any,
        env: Any,
        sampler: EpochSampler,
        last_step: int,
    ) -> None:
        assert recipe.grpo is not None
        if not isinstance(policy, AsyncGenerationPolicy):
            raise ValueError(
                "grpo.async_grpo.enabled: true needs vLLM on separate generation workers; set "
                "policy.generation.backend=vllm and policy.generation.colocated.enabled=false "
                "(with colocated.resources), or grpo.async_grpo.enabled=false"
            )
        self.policy: AsyncGenerationPolicy = policy
        self.recipe = recipe
        self.tokenizer = tokenizer
        self.env = env
        self.sampler = sampler
        self.last_step = last_step
        # grpo.async_grpo, or NeMo RL's async_rl read onto it (hpcrl.config.recipe_async_rl)
        settings = async_grpo_settings(recipe)
        assert settings is not None  # built only for asynchronous GRPO
        self.max_age = max(0, settings.max_trajectory_age_steps)
        self.in_flight_weight_updates = settings.in_flight_weight_updates
        self.recompute_kv_cache = settings.recompute_kv_cache_after_weight_updates
        self.in_flight: deque[InFlightBatch] = deque()

    def _submit(self, step: int, submit_step: int) -> None:
        grpo = self.recipe.grpo
        assert grpo is not None
        rows = self.sampler.next_batch(grpo.num_prompts_per_step)
        prompts = expand_prompts(self.recipe, self.tokenizer, rows)
        pending = self.policy.submit_generation(
            prompts.prompt_ids, self.recipe.policy.generation, generation_seed(grpo.seed, step)
        )
        self.in_flight.append(
            InFlightBatch(
                step=step,
                submitted_at_step=submit_step,
                prompts=prompts,
                pending=pending,
                submitted_at_s=time.perf_counter(),
            )
        )

    def _fill(self, step: int) -> None:
        """Keep batches for steps step .. step + max_age submitted (none past the last)."""
        next_step = self.in_flight[-1].step + 1 if self.in_flight else step
        while next_step <= min(step + self.max_age, self.last_step):
            self._submit(next_step, submit_step=step)
            next_step += 1

    def _collect(self, step: int) -> tuple[Rollouts, InFlightBatch]:
        batch = self.in_flight.popleft()
        assert batch.step == step, f"in-flight batch for step {batch.step} at step {step}"
        generation = self.policy.collect_generation(batch.pending)
        rollouts = score_rollouts(self.recipe, self.tokenizer, self.env, batch.prompts, generation)
        return rollouts, batch

    def __call__(self, step: int) -> dict[str, Any]:
        timer = StepTimer()
        started = time.perf_counter()
        with timer.phase("submit"):
            self._fill(step)
        with timer.phase("generate_wait"):
            rollouts, in_flight = self._collect(step)
        generate_s = time.perf_counter() - in_flight.submitted_at_s
        age = step - in_flight.submitted_at_step  # in GRPO steps (optimizer steps may be more)
        assert 0 <= age <= self.max_age, f"trajectory age {age} > bound {self.max_age}"
        train_metrics, sequence_metrics, gap = train_on_rollouts(
            self.policy, self.recipe, rollouts, timer
        )
        if self.in_flight_weight_updates and step < self.last_step:
            with timer.phase("refit"):
                self.policy.refit_in_flight(self.recompute_kv_cache)
        step_s = time.perf_counter() - started
        record = step_record(step, train_metrics, rollouts, timer, step_s, generate_s, age)
        return {**record, **sequence_metrics, "generation_logprob_gap": gap}


StepFn = Callable[[int], dict[str, Any]]


def make_async_grpo_step_fn(
    policy: Policy, recipe: Recipe, tokenizer: Any, env: Any, sampler: EpochSampler, last_step: int
) -> StepFn:
    """The driver's step function for asynchronous GRPO: NeMo RL's windowed and ready_first
    samplers (``async_rl.sampler.name``) pick finished prompt groups
    (``async_grpo_groups``); in_order and ``grpo.async_grpo`` train whole batches in order."""
    if recipe.async_rl is not None and recipe.async_rl.sampler.name in GROUP_SAMPLERS:
        from hpcrl.core.algorithms.async_grpo_groups import GroupedAsyncGrpoStep

        if not isinstance(policy, AsyncGenerationPolicy):
            raise ValueError(
                f"async_rl.sampler.name={recipe.async_rl.sampler.name} needs vLLM on separate "
                "generation workers; set policy.generation.backend=vllm and "
                "policy.generation.colocated.enabled=false (with colocated.resources)"
            )
        return GroupedAsyncGrpoStep(policy, recipe, tokenizer, env, sampler)
    return AsyncGrpoStep(policy, recipe, tokenizer, env, sampler, last_step)
