"""Async GRPO with NeMo RL's group samplers (``async_rl.sampler.name`` windowed or
ready_first; ``hpcrl.core.algorithms.group_selection`` says which groups each takes).

Prompts are dispatched to the generation engines one group at a time (its
``num_generations_per_prompt`` samples in one submission), in data order, as far as the
sampler admits and while fewer than ``async_rl.max_buffered_rollouts`` groups are unconsumed
and fewer than ``max_inflight_prompts`` unfinished. Each group records the trainer version it
started on. A step at trainer version v repeatedly evicts what can no longer be selected and
selects a chunk of finished groups (at least ``min_groups_for_streaming_train``, or what the
step still lacks if fewer, NeMo RL's streaming threshold), until it holds
``grpo.num_prompts_per_step`` groups; then it trains on them in one optimizer step. NeMo RL
trains each chunk as it comes and steps once at the end; with the same weights for every
chunk's log-probs and per-group advantages the update is the same: what the threshold changes
is which finished groups the step takes. Unlike NeMo RL a group that falls out of the window
while sampling is not aborted: it finishes and is then evicted (the same groups are trained,
the engines do the wasted work). The engines are refit in flight after each step.

Built by ``hpcrl.core.algorithms.async_grpo.make_async_grpo_step_fn``; the window is
``async_rl.sampler.max_staleness_versions`` and ``hpcrl.config.async_rl_rules`` makes NeMo RL's
setup checks (buffer room, ready_first's importance-sampling correction). Run on vLLM engines
in tests/vllm/test_async_grpo_groups.py.
"""

from __future__ import annotations

import time
from collections import deque
from typing import Any

import attrs

from hpcrl.config.recipe import Recipe
from hpcrl.core.algorithms.async_train_step import step_record, train_on_rollouts
from hpcrl.core.algorithms.dynamic_sampling import concat_rollouts
from hpcrl.core.algorithms.group_selection import BufferedGroup, make_selection
from hpcrl.core.algorithms.grpo import (
    PromptBatch,
    expand_prompts,
    score_rollouts,
)
from hpcrl.core.algorithms.loop import StepTimer, generation_seed
from hpcrl.core.data.jsonl import EpochSampler
from hpcrl.core.policy import AsyncGenerationPolicy

POLL_S = 0.01  # how long a step waits before looking for finished groups again


@attrs.define(kw_only=True)
class GroupWork:
    """A group's prompts and pending generation; its scored rollouts once finished."""

    prompts: PromptBatch
    pending: Any
    submitted_at_s: float
    rollouts: Any = None


class GroupedAsyncGrpoStep:
    """Callable ``step -> metrics record``, like ``AsyncGrpoStep``."""

    def __init__(
        self,
        policy: AsyncGenerationPolicy,
        recipe: Recipe,
        tokenizer: Any,
        env: Any,
        sampler: EpochSampler,
    ) -> None:
        assert recipe.grpo is not None and recipe.async_rl is not None
        self.policy, self.recipe, self.tokenizer, self.env = policy, recipe, tokenizer, env
        self.sampler = sampler
        cfg = recipe.async_rl
        self.recompute_kv_cache = cfg.recompute_kv_cache_after_weight_updates
        self.selection = make_selection(cfg.sampler.name, cfg.sampler.max_staleness_versions)
        self.groups: list[BufferedGroup] = []  # dispatched, not yet taken or evicted
        self.rows: deque[dict] = deque()  # the admitted batch's prompts not yet dispatched
        self.batches_admitted = 0
        self.dispatched = 0
        self.trainer_version = 0  # optimizer steps taken in this run
        self.last_taken: list[BufferedGroup] = []  # the last step's groups (for inspection)

    def _has_room(self) -> bool:
        cfg = self.recipe.async_rl
        assert cfg is not None
        unfinished = sum(1 for g in self.groups if not g.ready)
        return (
            len(self.groups) < cfg.max_buffered_rollouts and unfinished < cfg.max_inflight_prompts
        )

    def _dispatch(self) -> None:
        grpo = self.recipe.grpo
        assert grpo is not None
        while self._has_room():
            if not self.rows:
                if not self.selection.may_admit(self.batches_admitted, self.trainer_version):
                    return
                self.rows.extend(self.sampler.next_batch(grpo.num_prompts_per_step))
                self.batches_admitted += 1
            prompts = expand_prompts(self.recipe, self.tokenizer, [self.rows.popleft()])
            seed = generation_seed(grpo.seed, self.dispatched)
            pending = self.policy.submit_generation(
                prompts.prompt_ids, self.recipe.policy.generation, seed
            )
            work = GroupWork(prompts=prompts, pending=pending, submitted_at_s=time.perf_counter())
            self.groups.append(
                BufferedGroup(
                    index=self.dispatched, start_version=self.trainer_version, payload=work
                )
            )
            self.dispatched += 1

    def _harvest(self) -> None:
        for group in self.groups:
            if group.ready or not self.policy.generation_ready(group.payload.pending):
                continue
            generation = self.policy.collect_generation(group.payload.pending)
            group.payload.rollouts = score_rollouts(
                self.recipe, self.tokenizer, self.env, group.payload.prompts, generation
            )
            group.ready = True

    def _assemble(self) -> tuple[list[BufferedGroup], dict[str, int]]:
        """The step's groups, chunk by chunk as they are selected (module docstring)."""
        cfg, grpo = self.recipe.async_rl, self.recipe.grpo
        assert cfg is not None and grpo is not None
        taken: list[BufferedGroup] = []
        counts = {"chunks": 0, "evicted": 0}
        while len(taken) < grpo.num_prompts_per_step:
            self._dispatch()
            self._harvest()
            evicted = self.selection.evict(self.groups, self.trainer_version)
            counts["evicted"] += len(evicted)
            lacking = grpo.num_prompts_per_step - len(taken)
            chunk = self.selection.select(
                self.groups,
                self.trainer_version,
                min(cfg.min_groups_for_streaming_train, lacking),
                lacking,
            )
            gone = {id(g) for g in [*evicted, *(chunk or [])]}
            self.groups = [g for g in self.groups if id(g) not in gone]
            if chunk is None:
                time.sleep(POLL_S)
                continue
            taken.extend(chunk)
            counts["chunks"] += 1
        return taken, counts

    def __call__(self, step: int) -> dict[str, Any]:
        timer = StepTimer()
        started = time.perf_counter()
        with timer.phase("generate_wait"):
            taken, counts = self._assemble()
        self.last_taken = taken
        self._dispatch()  # refill the room the step freed: generation overlaps training
        rollouts = concat_rollouts([g.payload.rollouts for g in taken])
        generate_s = time.perf_counter() - min(g.payload.submitted_at_s for g in taken)
        age = self.trainer_version - min(g.start_version for g in taken)
        train_metrics, sequence_metrics, gap = train_on_rollouts(
            self.policy, self.recipe, rollouts, timer
        )
        self.trainer_version += 1
        with timer.phase("refit"):
            self.policy.refit_in_flight(self.recompute_kv_cache)
        step_s = time.perf_counter() - started
        record = step_record(step, train_metrics, rollouts, timer, step_s, generate_s, age)
        return {
            **record,
            **sequence_metrics,
            "generation_logprob_gap": gap,
            "streaming_chunks": counts["chunks"],
            "evicted_stale_prompt_groups": counts["evicted"],
        }
