"""``async_rl``: NeMo RL's single-controller asynchronous GRPO (its ``run_grpo_single_controller``
entry point), read onto hpcrl's asynchronous GRPO. Part of the recipe schema
(``hpcrl.config.recipe`` re-exports every name); cross-field rules in
``hpcrl.config.async_rl_rules``; what the job runs: ``hpcrl.config.async_settings``; NeMo RL's resiliency blocks (``rollout_failure``,
``stall_watchdog``, ``generation_fleet_health``, ``generation_router``) in
``hpcrl.config.foreign_keys``.

NeMo RL's ``in_order`` sampler stamps each dispatched prompt batch with the step that will
train on it and lets dispatch run at most ``max_lookahead_versions`` batches ahead of the
trainer: batch s is generated with weights at most that many optimizer steps old and trained
whole, in data order, at step s. That is hpcrl's ``grpo.async_grpo`` with
``max_trajectory_age_steps`` = the lookahead (0: synchronous GRPO), with the engines refit in
flight (the single controller always refits without waiting for the rollouts in flight). The
``windowed`` and ``ready_first`` samplers choose which finished prompt groups a step trains
on, within ``max_staleness_versions`` (``hpcrl.core.algorithms.async_grpo_groups``); hpcrl
refuses ``weight_fifo`` and ``custom`` by name.
"""

from __future__ import annotations

from typing import Literal

import attrs

from hpcrl.config.field_bounds import POSITIVE_COUNT, at_least, bounded
from hpcrl.config.shared_methods import SharedMethods

SamplerName = Literal["in_order", "windowed", "weight_fifo", "ready_first", "custom"]


@attrs.frozen(kw_only=True)
class AsyncRlSamplerCfg(SharedMethods):
    """``async_rl.sampler``: which finished rollouts a training step takes (NeMo RL's
    staleness sampler; hpcrl implements ``in_order``, ``windowed`` and ``ready_first``)."""

    name: SamplerName = "in_order"
    # in_order: how many batches generation may run ahead of the trainer (0: synchronous)
    max_lookahead_versions: int = bounded(1, at_least(0, "0 (synchronous) or more"))
    # windowed / ready_first (weight_fifo is refused): their staleness window
    max_staleness_versions: int = bounded(1, at_least(0, "0 or more"))


@attrs.frozen(kw_only=True)
class AsyncRlCfg(SharedMethods):
    """``async_rl``: NeMo RL's single-controller GRPO settings (module docstring)."""

    sampler: AsyncRlSamplerCfg = attrs.field(factory=AsyncRlSamplerCfg)
    # the requests in flight recompute their KV caches after each in-flight refit
    recompute_kv_cache_after_weight_updates: bool = False
    # finished groups a step takes at least per chunk; in_order trains on the whole batch, so
    # there it must be grpo.num_prompts_per_step (async_rl_rules)
    min_groups_for_streaming_train: int = bounded(32, POSITIVE_COUNT)
    # prompt groups generating at once (windowed / ready_first); in_order submits a step's
    # whole batch
    max_inflight_prompts: int = bounded(32, POSITIVE_COUNT)
    # unconsumed groups buffered; must hold the lookahead's batches (async_rl_rules)
    max_buffered_rollouts: int = bounded(64, POSITIVE_COUNT)
    diagnostics: bool = False  # NeMo RL prints a preview of each finished rollout
