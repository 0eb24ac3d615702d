"""NeMo RL's GRPO reward options: scaling, DAPO's overlong shaping, dynamic sampling; env.math
and the GRPO option rules."""

from __future__ import annotations

import attrs
import pytest
import torch

from hpcrl.config.recipe import EnvCfg, MathEnvCfg, RewardScalingCfg, RewardShapingCfg
from hpcrl.core.algorithms.dynamic_sampling import rows_with_signal, sample_dynamically
from hpcrl.core.algorithms.grpo import Rollouts
from hpcrl.core.algorithms.reward_terms import overlong_penalty, scale_rewards
from hpcrl.core.workers.ray_policy import GenerationResult
from tests.recipe_builder import problems_for


def test_scaling_clamps_then_maps_linearly():
    cfg = RewardScalingCfg(
        enabled=True, source_min=0.0, source_max=1.0, target_min=-1.0, target_max=1.0
    )
    got = scale_rewards(torch.tensor([-0.5, 0.0, 0.25, 1.0, 3.0]), cfg)
    assert got.tolist() == [-1.0, -1.0, -0.5, 1.0, 1.0]
    assert scale_rewards(torch.tensor([3.0]), RewardScalingCfg()).tolist() == [3.0]


def test_overlong_penalty_is_linear_over_the_buffer_without_a_floor():
    cfg = RewardShapingCfg(
        enabled=True,
        overlong_buffer_length=100,
        overlong_buffer_penalty=0.5,
        max_response_length=400,
    )
    # 450 tokens (possible when max_new_tokens > max_response_length): 1.5 buffers past
    # 300, so −0.75, not capped at −0.5 (NeMo RL's min(−excess/B·P, 0) has no floor).
    lengths = torch.tensor([100, 300, 350, 400, 450])
    got = overlong_penalty(torch.ones(5), lengths, cfg, max_new_tokens=999)
    assert got.tolist() == pytest.approx([1.0, 1.0, 0.75, 0.5, 0.25])


def fake_rollouts(rewards: list[float], tag: str) -> Rollouts:
    """Rows 2k and 2k + 1 share prompt ``tag``k (different tags: different prompt ids)."""
    n = len(rewards)
    ids = torch.arange(n * 3).reshape(n, 3)
    generation = GenerationResult(
        input_ids=ids,
        attention_mask=torch.ones(n, 3, dtype=torch.long),
        response_mask=torch.ones(n, 3, dtype=torch.long),
        generation_logprobs=torch.zeros(n, 3),
        prompt_lengths=torch.ones(n, dtype=torch.long),
        response_lengths=torch.full((n,), 2),
    )
    return Rollouts(
        prompts=[f"{tag}{i // 2}" for i in range(n)],
        answers=["a"] * n,
        responses=[f"{tag}r{i}" for i in range(n)],
        rewards=torch.tensor(rewards),
        unshaped_rewards=torch.tensor(rewards),
        truncated=torch.tensor([i % 3 == 0 for i in range(n)]),
        generation=generation,
        loss_multiplier=torch.ones(n),
        prompt_keys=[(ord(tag), i // 2) for i in range(n)],
    )


def test_dynamic_sampling_keeps_groups_with_signal_across_batches():
    batches = [
        fake_rollouts([1, 1, 0, 1, 0, 0], "x"),  # groups: equal, differ, equal
        fake_rollouts([0, 0, 1, 0, 1, 0], "y"),  # equal, differ, differ
    ]
    assert rows_with_signal(batches[0], leave_one_out=False) == [2, 3]
    rollouts, metrics = sample_dynamically(
        lambda i: batches[i], 4, max_batches=5, leave_one_out=False
    )
    assert rollouts.prompts == ["x1", "x1", "y1", "y1"]
    assert rollouts.rewards.tolist() == [0.0, 1.0, 1.0, 0.0]
    assert rollouts.truncated.tolist() == [False, True, False, True]  # rows 2, 3 of each
    assert rollouts.prompt_keys == [(120, 1), (120, 1), (121, 1), (121, 1)]
    assert rollouts.generation.input_ids.shape == (4, 3)
    assert metrics == {
        "dynamic_sampling_gen_batches": 2.0,
        "dynamic_sampling_kept_fraction": 4 / 12,
    }


def test_dynamic_sampling_gives_up_naming_the_settings():
    flat = fake_rollouts([1, 1, 0, 0], "z")
    with pytest.raises(RuntimeError, match="grpo.dynamic_sampling_max_gen_batches"):
        sample_dynamically(lambda i: flat, 4, max_batches=3, leave_one_out=False)


def grpo_problems(**dotted):
    return problems_for("automodel", "grpo", **dotted)


def test_grpo_option_rules_name_their_keys():
    assert [p.path for p in grpo_problems(grpo__max_rollout_turns=3)] == ["grpo.max_rollout_turns"]
    assert [p.path for p in grpo_problems(grpo__batch_multiplier=2)] == ["grpo.batch_multiplier"]
    assert grpo_problems(grpo__batch_multiplier=2, grpo__use_dynamic_sampling=True) == []
    bad_scaling = {"enabled": True, "source_min": 1.0, "source_max": 1.0}
    assert [p.path for p in grpo_problems(grpo__reward_scaling=bad_scaling)] == [
        "grpo.reward_scaling.source_max"
    ]
    bad_shaping = {"enabled": True, "overlong_buffer_length": 0}
    assert [p.path for p in grpo_problems(grpo__reward_shaping=bad_shaping)] == [
        "grpo.reward_shaping.overlong_buffer_length"
    ]


def test_env_math_picks_the_checker():
    from hpcrl.core.environments.build import build_environment

    numeric = build_environment(EnvCfg(math=MathEnvCfg(math_verify_impl="hpcrl_numeric")))
    assert numeric.score(["p"], ["so \\boxed{12}"], ["12"]) == [1.0]
    try:
        import math_verify  # noqa: F401
    except ImportError:
        with pytest.raises(ValueError, match="env.math.math_verify_impl"):
            build_environment(EnvCfg(math=MathEnvCfg()))
    else:
        verify = build_environment(EnvCfg(math=MathEnvCfg()))
        assert verify.score(["p", "p"], ["\\boxed{\\frac{1}{2}}", "\\boxed{3}"], ["0.5", "2"]) == [
            1.0,
            0.0,
        ]


def test_dynamic_sampling_keeps_engine_counts_and_sums_engine_figures():
    batches = [fake_rollouts([1, 0, 1, 1], "x"), fake_rollouts([0, 1, 0, 0], "y")]
    for index, rollouts in enumerate(batches):
        generation = attrs.evolve(
            rollouts.generation,
            engine_generated_tokens=torch.tensor([10, 11, 12, 13]) + 10 * index,
            metrics={"time_sample_s": 1.0 + index, "generation_decode_steps": 5.0},
        )
        batches[index] = attrs.evolve(rollouts, generation=generation)
    rollouts, _ = sample_dynamically(lambda i: batches[i], 4, max_batches=5, leave_one_out=False)
    assert rollouts.generation.engine_generated_tokens.tolist() == [10, 11, 20, 21]
    assert rollouts.generation.metrics == {"time_sample_s": 3.0, "generation_decode_steps": 10.0}
