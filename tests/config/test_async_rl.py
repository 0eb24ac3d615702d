"""NeMo RL's ``async_rl`` (its single-controller async GRPO) read from its own example files
(the snapshots, tests/nemo_rl_snapshots.py): the in_order sampler's lookahead becomes hpcrl's
bound on trajectory age, refit in flight as the single controller does (lookahead 0 is
synchronous GRPO); the windowed and ready_first samplers run the grouped loop; what hpcrl
cannot honour is refused by key with its fix, and NeMo RL's own setup checks are made at
validate time. The runs that train with this form are
tests/vllm/test_async_grpo.py::test_nemo_rl_async_rl_form_trains_one_batch_ahead_refit_in_flight
and tests/vllm/test_async_grpo_groups.py."""

from __future__ import annotations

import pytest

from hpcrl.config import ConfigError
from hpcrl.config.async_settings import async_grpo_settings
from hpcrl.config.recipe import AsyncGrpoCfg
from tests.nemo_rl_snapshots import config_path, load_as_hpcrl

SC_1B = "grpo_math_1B_megatron_single_controller.yaml"
SC_SYNC = "recipes/llm/grpo-qwen2.5-math-1.5b-instruct-1n8g-megatron-single-controller-sync.yaml"
SC_STREAMING = (
    "recipes/llm/grpo-llama3.1-8b-instruct-2n8g-async-1off-single-controller-streaming2.yaml"
)
SC_READY_FIRST = "recipes/llm/grpo-llama3.1-8b-instruct-2n8g-ready-first-single-controller.yaml"


def errors_of(relative: str, overrides: list[str]) -> dict[str, str]:
    try:
        load_as_hpcrl(config_path(relative), overrides)
    except ConfigError as error:
        return {problem.path: problem.format() for problem in error.errors if problem.is_error}
    raise AssertionError("loaded without errors")


def test_in_order_with_lookahead_is_async_grpo_refit_in_flight():
    recipe = load_as_hpcrl(config_path(SC_1B)).recipe
    assert recipe.async_rl is not None and recipe.grpo is not None
    assert recipe.grpo.async_grpo is None  # the file nulls the legacy block, as NeMo RL asks
    assert async_grpo_settings(recipe) == AsyncGrpoCfg(
        enabled=True,
        max_trajectory_age_steps=1,
        in_flight_weight_updates=True,
        recompute_kv_cache_after_weight_updates=False,
    )
    # NeMo RL's single controller trains without importance-sampling correction when told
    # to (grpo_math_1B's false); only its grpo.async_grpo loop insists on it.
    assert recipe.loss_fn.use_importance_sampling_correction is False
    deeper = load_as_hpcrl(
        config_path(SC_1B),
        [
            "async_rl.sampler.max_lookahead_versions=3",
            "async_rl.recompute_kv_cache_after_weight_updates=true",
            "async_rl.max_buffered_rollouts=128",
        ],
    ).recipe
    settings = async_grpo_settings(deeper)
    assert settings is not None
    assert (
        settings.max_trajectory_age_steps,
        settings.recompute_kv_cache_after_weight_updates,
    ) == (
        3,
        True,
    )


def test_zero_lookahead_is_synchronous_grpo():
    recipe = load_as_hpcrl(config_path(SC_SYNC)).recipe
    assert recipe.async_rl is not None
    assert recipe.async_rl.sampler.max_lookahead_versions == 0
    assert async_grpo_settings(recipe) is None


def test_windowed_and_ready_first_load_onto_the_grouped_loop():
    """NeMo RL's streaming2 (windowed) and ready-first configs load as they are: async GRPO
    whose window is max(1, max_staleness_versions), streaming 16 of 64 groups."""
    for name, relative in (("windowed", SC_STREAMING), ("ready_first", SC_READY_FIRST)):
        recipe = load_as_hpcrl(config_path(relative)).recipe
        assert recipe.async_rl is not None and recipe.grpo is not None
        assert (recipe.async_rl.sampler.name, recipe.async_rl.sampler.max_staleness_versions) == (
            name,
            1,
        )
        assert (
            recipe.async_rl.min_groups_for_streaming_train,
            recipe.grpo.num_prompts_per_step,
        ) == (16, 64)
        settings = async_grpo_settings(recipe)
        assert settings is not None and settings.max_trajectory_age_steps == 1
    # window 0 still runs asynchronously (dispatch never waits for the trainer under windowed)
    fresh = load_as_hpcrl(
        config_path(SC_STREAMING), ["async_rl.sampler.max_staleness_versions=0"]
    ).recipe
    settings = async_grpo_settings(fresh)
    assert settings is not None and settings.max_trajectory_age_steps == 1


@pytest.mark.parametrize(
    ("relative", "override", "path", "says"),
    [
        # NeMo RL's validate_single_controller_config: ready_first's off-policy groups
        (SC_READY_FIRST, "loss_fn.use_importance_sampling_correction=false",
         "loss_fn.use_importance_sampling_correction",
         "fix: set loss_fn.use_importance_sampling_correction=true"),
        (SC_READY_FIRST, "loss_fn.force_on_policy_ratio=true", "loss_fn.force_on_policy_ratio",
         "fix: set loss_fn.force_on_policy_ratio=false"),
        # its required buffer capacity: the live batch and one per version of the window
        (SC_READY_FIRST, "async_rl.max_buffered_rollouts=127", "async_rl.max_buffered_rollouts",
         "128 prompt groups (grpo.num_prompts_per_step x (1 + 1)"),
        (SC_READY_FIRST, "async_rl.sampler.max_staleness_versions=2",
         "async_rl.max_buffered_rollouts", "fix: set async_rl.max_buffered_rollouts=192 or more"),
        # windowed has no capacity rule of NeMo RL's, but must hold the streaming threshold
        (SC_STREAMING, "async_rl.max_buffered_rollouts=15", "async_rl.max_buffered_rollouts",
         "fix: set async_rl.max_buffered_rollouts=16 or more"),
        (SC_STREAMING, "async_rl.min_groups_for_streaming_train=65",
         "async_rl.min_groups_for_streaming_train",
         "must not exceed grpo.num_prompts_per_step (64)"),
        # in_order still waits for its whole batch; weight_fifo and custom are refused
        (SC_STREAMING, "async_rl.sampler.name=in_order", "async_rl.min_groups_for_streaming_train",
         "streaming training with the in_order sampler (starting a step once 16 of its 64"),
        (SC_STREAMING, "async_rl.sampler.name=weight_fifo", "async_rl.sampler.name",
         "NeMo RL's weight_fifo sampler (drains finished groups oldest weight version first"),
    ],
)  # fmt: skip
def test_the_group_samplers_are_checked_as_nemo_rl_checks_them(relative, override, path, says):
    errors = errors_of(relative, [override])
    assert list(errors) == [path], errors
    assert says in errors[path]


@pytest.mark.parametrize(
    ("override", "path", "says"),
    [
        (
            "grpo.async_grpo={enabled: true}",
            "grpo.async_grpo.enabled",
            "fix: set grpo.async_grpo: null",
        ),
        ("async_rl.max_buffered_rollouts=63", "async_rl.max_buffered_rollouts", "64 or more"),
        (
            "policy.train_global_batch_size=256",
            "policy.train_global_batch_size",
            "set policy.train_global_batch_size=512",
        ),
        ("async_rl.min_groups_for_streaming_train=33", "async_rl.min_groups_for_streaming_train",
         "must not exceed grpo.num_prompts_per_step (32)"),
        (
            "async_rl.rollout_failure.max_skipped_prompts=2",
            "async_rl.rollout_failure.max_skipped_prompts",
            "set it to 0",
        ),
        (
            "async_rl.stall_watchdog.stall_action=abort",
            "async_rl.stall_watchdog.stall_action",
            "set it to 'warn'",
        ),
        (
            "async_rl.generation_fleet_health.enabled=true",
            "async_rl.generation_fleet_health",
            "generation_fleet_health.enabled=false",
        ),
        ("policy.generation.colocated.enabled=true", "policy.generation.colocated.enabled",
         "or async_rl.sampler.max_lookahead_versions=0"),
    ],
)  # fmt: skip
def test_what_hpcrl_or_nemo_rl_cannot_run_is_refused_with_its_fix(override, path, says):
    errors = errors_of(SC_1B, [override])
    assert path in errors, errors
    assert says in errors[path]


def test_resiliency_settings_at_any_value_but_drops_are_accepted():
    # retries, backoff and deadlines: how a run meets faults, not what a step trains on
    recipe = load_as_hpcrl(
        config_path(SC_1B),
        [
            "async_rl.rollout_failure.max_infra_attempts_per_prompt=9",
            "async_rl.rollout_failure.native.generation_timeout_s=120",
            "async_rl.stall_watchdog.stall_timeout_s=900",
            "async_rl.max_inflight_prompts=8",
            "async_rl.diagnostics=true",
        ],
    ).recipe
    assert recipe.async_rl is not None and recipe.async_rl.max_inflight_prompts == 8


def test_grpo_async_grpo_still_needs_the_correction():
    errors = errors_of("grpo_math_1B.yaml", ["grpo.async_grpo.enabled=true",
                                             "policy.generation.colocated.enabled=false",
                                             "policy.generation.colocated.resources.gpus_per_node=1",
                                             "cluster.gpus_per_node=2"])  # fmt: skip
    assert "loss_fn.use_importance_sampling_correction" in errors
