"""Async GRPO: a separate vLLM worker samples one batch ahead while the 2-rank trainer trains.
Trajectory ages stay within the bound, stale samples really come from older weights (the
sampler/trainer log-prob gap is ~0 only for the fresh first batch), and the policy learns
with the importance-sampling correction."""

from __future__ import annotations

from pathlib import Path

import pytest

from tests.require import VLLM_HINT, require_module

require_module("ray", kind="vllm", hint=VLLM_HINT)

from hpcrl.core.algorithms.async_grpo import AsyncGrpoStep  # noqa: E402
from hpcrl.core.workers.ray_policy import RayPolicy  # noqa: E402
from hpcrl.core.workers.vllm_policy import wrap_policy  # noqa: E402
from tests.core._driver_harness import REPO_ROOT, local_plan, mean  # noqa: E402
from tests.core.parallel_harness import start_policy  # noqa: E402
from tests.vllm.harness import build_tiny_model  # noqa: E402
from tests.vllm.test_grpo_vllm import (  # noqa: E402
    PLACEMENTS,
    RECIPE,
    SEPARATE_SLOTS,
    VLLM_OVERRIDES,
)

NUM_STEPS = 16


def legacy_form(max_age: int) -> tuple[str, ...]:
    """hpcrl's (and NeMo RL's run_grpo) spelling of async GRPO."""
    return (
        "grpo.async_grpo.enabled=true",
        f"grpo.async_grpo.max_trajectory_age_steps={max_age}",
    )


def single_controller_form(lookahead: int) -> tuple[str, ...]:
    """NeMo RL's single-controller spelling, as its configs write it (async_grpo nulled,
    the step's whole batch awaited, room for the lookahead's batches); refits in flight."""
    return (
        "grpo.async_grpo=null",
        "async_rl.sampler.name=in_order",
        f"async_rl.sampler.max_lookahead_versions={lookahead}",
        "async_rl.recompute_kv_cache_after_weight_updates=true",
        "async_rl.min_groups_for_streaming_train=${grpo.num_prompts_per_step}",
        "async_rl.max_inflight_prompts=${grpo.num_prompts_per_step}",
        "async_rl.max_buffered_rollouts=64",
        "data_plane.enabled=true",
    )


def async_recipe(model_path: str, max_age: int, extra: tuple[str, ...] = (), form=legacy_form):
    from hpcrl.config import load_recipe

    overrides = [
        *extra,
        f"policy.model_name={model_path}",
        f"grpo.max_num_steps={NUM_STEPS}",
        *form(max_age),
        "loss_fn.use_importance_sampling_correction=true",
        *VLLM_OVERRIDES,
        *PLACEMENTS["separate"],
    ]
    loaded = load_recipe(REPO_ROOT / "recipes" / RECIPE, overrides)
    return loaded.recipe, loaded.source_path.parent


def run_async_grpo(
    model_path: str,
    max_age: int,
    num_steps: int,
    run_dir: Path,
    extra: tuple[str, ...] = (),
    form=legacy_form,
) -> list[dict]:
    from hpcrl.core.data.jsonl import EpochSampler, load_jsonl
    from hpcrl.core.data.prompts import load_tokenizer
    from hpcrl.core.environments.build import build_environment

    recipe, recipe_dir = async_recipe(model_path, max_age, extra, form)
    rows = load_jsonl(recipe_dir / Path(recipe.data.train_path), ["prompt", "answer"])
    tokenizer = load_tokenizer(model_path, recipe.policy.tokenizer)
    training = start_policy(recipe, model_path, world_size=2)
    placement = local_plan(recipe, run_dir, f"worker_slots_per_node={SEPARATE_SLOTS}").generation
    policy = wrap_policy(training, recipe, model_path, "cpu", placement)
    try:
        step_fn = AsyncGrpoStep(
            policy,
            recipe,
            tokenizer,
            build_environment(recipe.env),
            EpochSampler(rows, seed=recipe.grpo.seed),
            last_step=num_steps,
        )
        return [step_fn(step) for step in range(1, num_steps + 1)]
    finally:
        policy.shutdown()


def test_async_needs_separate_generation_workers() -> None:
    recipe, _ = async_recipe("unused", 1)
    colocated = RayPolicy.__new__(RayPolicy)  # workers that sample themselves (not started)
    with pytest.raises(ValueError, match="policy.generation.colocated.enabled=false"):
        AsyncGrpoStep(colocated, recipe, None, None, None, last_step=1)


def test_driver_routes_async_recipes_to_the_async_step() -> None:
    from hpcrl.core.driver import _make_step_fn

    recipe, _ = async_recipe("unused", 1)
    colocated = RayPolicy.__new__(RayPolicy)
    # Reaching AsyncGrpoStep's own placement check proves the driver chose the async step.
    with pytest.raises(ValueError, match="policy.generation.colocated.enabled=false"):
        _make_step_fn(colocated, recipe, None, None, None, 1)


@pytest.mark.slow
def test_async_grpo_bounded_staleness_learns(ray_cluster, tmp_path) -> None:
    model_path = build_tiny_model(tmp_path / "tiny-qwen2")
    metrics = run_async_grpo(model_path, max_age=1, num_steps=NUM_STEPS, run_dir=tmp_path / "run")

    assert [m["trajectory_age_steps"] for m in metrics] == [0] + [1] * (NUM_STEPS - 1)
    gaps = [m["generation_logprob_gap"] for m in metrics]
    assert gaps[0] < 1e-3, gaps  # fresh: sampled with exactly the trainer's weights
    assert min(gaps[2:]) > 2e-3, gaps  # one optimizer step older than the trainer
    rewards = [m["reward_mean"] for m in metrics]
    assert mean(rewards[-3:]) >= mean(rewards[:3]) + 0.3, rewards
    assert all(m["time_generate_wait_s"] >= 0 and m["time_generate_s"] > 0 for m in metrics)
    # Every batch came from the vLLM engine: its own request stats counted the tokens trained on.
    assert all(
        m["engine_generated_tokens"] == round(m["response_length_mean"] * 32) > 0 for m in metrics
    )


@pytest.mark.slow
def test_nemo_rl_async_rl_form_trains_one_batch_ahead_refit_in_flight(
    ray_cluster, tmp_path
) -> None:
    """NeMo RL's single-controller form (``async_rl``: in_order sampler, lookahead 1,
    recompute_kv_cache_after_weight_updates) trains as hpcrl's async GRPO with in-flight
    weight updates, which the single controller always does: the engine is refit right after
    each training step, beside the batch it is sampling. Ages still count from submission (so
    the lookahead bounds them), the importance-sampling correction still sees the sampler's
    own log-probs, and the policy learns as much as without in-flight refits."""
    from hpcrl.config.async_settings import async_grpo_settings

    model_path = build_tiny_model(tmp_path / "tiny-qwen2")
    recipe, _ = async_recipe(model_path, 1, form=single_controller_form)
    settings = async_grpo_settings(recipe)
    assert settings is not None and recipe.grpo is not None and recipe.grpo.async_grpo is None
    assert (settings.max_trajectory_age_steps, settings.in_flight_weight_updates) == (1, True)
    metrics = run_async_grpo(
        model_path, 1, NUM_STEPS, tmp_path / "run", form=single_controller_form
    )

    assert [m["trajectory_age_steps"] for m in metrics] == [0] + [1] * (NUM_STEPS - 1)
    # A refit after every training step but the last, each timed (never skipped).
    assert all("time_refit_s" in m for m in metrics[:-1]) and "time_refit_s" not in metrics[-1]
    refits = [m["generation_refits_in_flight"] for m in metrics]
    assert all(count in (0.0, 1.0) for count in refits), refits  # one engine, one per step
    rewards = [m["reward_mean"] for m in metrics]
    assert mean(rewards[-3:]) >= mean(rewards[:3]) + 0.3, rewards
    assert all(
        m["engine_generated_tokens"] == round(m["response_length_mean"] * 32) > 0 for m in metrics
    )
    print("in-flight refits per step:", refits)
