"""GDPO (issue 24): NeMo RL's math_multi_reward environment and its GDPO advantage estimator,
against tests/core/nemo_rl_reference.py (NeMo RL's formula written from its code), on the
rollout path (score_rollouts -> finish_train_batch) and through the loader."""

from __future__ import annotations

import pytest

from tests.require import require_module

torch = require_module("torch")

from hpcrl.config import ConfigError, validate_recipe_dict  # noqa: E402
from hpcrl.config.advantage_rules import MULTI_REWARD_NAMES  # noqa: E402
from hpcrl.config.recipe import EnvCfg, Recipe  # noqa: E402
from hpcrl.core.algorithms import advantages as adv  # noqa: E402
from hpcrl.core.algorithms.grpo import (  # noqa: E402
    build_train_batch,
    expand_prompts,
    finish_train_batch,
    rollout_metrics,
    score_rollouts,
)
from hpcrl.core.environments import math_multi_reward_env as multi  # noqa: E402
from hpcrl.core.environments.build import build_environment  # noqa: E402
from tests.core import nemo_rl_reference as ref  # noqa: E402
from tests.core.test_grpo_nemo_rewards import CharTokenizer, generation_of  # noqa: E402
from tests.recipe_builder import base_dict, with_keys  # noqa: E402


def recipe_with(**dotted) -> Recipe:
    recipe, _ = validate_recipe_dict(with_keys(base_dict("automodel"), **dotted))
    return recipe


GOOD = "<think>6 times 7</think>\n<answer>42</answer>"


@pytest.mark.parametrize(
    ("response", "correct", "integer", "formatted"),
    [
        (GOOD, 1.0, 1.0, 1.0),
        ("<think>guess</think>\n<answer>41</answer>", 0.0, 1.0, 1.0),  # wrong, still an integer
        ("<think>x</think>\n<answer> 42 </answer>", 1.0, 1.0, 1.0),  # the answer is stripped
        ("<think>x</think>\n<answer>-42</answer>", 0.0, 0.0, 1.0),  # a sign is not isdigit
        ("<think>x</think>\n<answer>42.0</answer>", 0.0, 0.0, 1.0),  # a string comparison
        ("<think>x</think> <answer>42</answer>", 1.0, 1.0, 0.0),  # no newline between them
        ("<think>x</think>\n<answer>42</answer> done", 1.0, 1.0, 0.0),  # text after the tag
        ("<think>x</think>\n<answer>1</answer><answer>42</answer>", 1.0, 1.0, 0.0),  # two tags
        ("The answer is 42", 0.0, 0.0, 0.0),  # no tags: the whole text is the answer
        ("42", 1.0, 1.0, 0.0),
    ],
)
def test_math_multi_reward_components(response, correct, integer, formatted) -> None:
    got = multi.component_rewards(response, "42")
    assert got == {
        "reward/correctness": correct,
        "reward/integer": integer,
        "reward/format": formatted,
    }
    env = build_environment(EnvCfg(), "math_multi_reward")
    assert env.score(["q"], [response], ["42"]) == [correct + integer + formatted]
    assert tuple(multi.REWARD_NAMES) == MULTI_REWARD_NAMES  # the rules' copy of the names


# Prompts 1 and 2 hold 4 samples each, prompt 3 one; prompt 2's format rewards tie (std 0).
PROMPTS = [[1]] * 4 + [[2]] * 4 + [[3]]
COMPONENTS = {
    "reward/correctness": [1.0, 0.0, 0.0, 1.0, 0.0, 0.0, 0.0, 0.0, 1.0],
    "reward/format": [1.0, 1.0, 0.0, 1.0, 1.0, 1.0, 1.0, 1.0, 0.0],
    "reward/integer": [1.0, 1.0, 1.0, 0.0, 0.0, 1.0, 0.0, 1.0, 1.0],
}


@pytest.mark.parametrize("normalize", [True, False])
@pytest.mark.parametrize("loo", [True, False])
@pytest.mark.parametrize("weights", [None, [2.0, 0.5, 1.0]])
def test_gdpo_matches_nemo_rl(normalize, loo, weights) -> None:
    groups = adv.prompt_groups([tuple(p) for p in PROMPTS])
    components = {k: torch.tensor(v) for k, v in COMPONENTS.items()}
    got = adv.gdpo_advantages(
        components, groups, weights=weights, normalize=normalize, leave_one_out=loo
    )
    want = ref.gdpo_advantages(PROMPTS, COMPONENTS, weights, normalize, loo)
    assert got.tolist() == pytest.approx(want, abs=1e-5)
    assert float(got.mean()) == pytest.approx(0.0, abs=1e-6)
    assert float(got.std()) == pytest.approx(1.0, abs=1e-5)


def test_gdpo_ties_everywhere_give_zero_advantages_and_weights_follow_sorted_names() -> None:
    groups = adv.consecutive_groups(4, 2)
    tied = {"reward/b": torch.ones(4), "reward/a": torch.zeros(4)}
    assert adv.gdpo_advantages(tied, groups).tolist() == [0.0] * 4  # std 0: mean only
    # weights apply to the sorted names: reward/a first
    spread = {"reward/b": torch.tensor([1.0, 0.0, 1.0, 0.0]), "reward/a": torch.zeros(4)}
    only_a = adv.gdpo_advantages(spread, groups, weights=[1.0, 0.0])
    assert only_a.tolist() == [0.0] * 4
    with pytest.raises(ValueError, match="reward_weights has 1 weights"):
        adv.gdpo_advantages(spread, groups, weights=[1.0])
    with pytest.raises(ValueError, match="several reward components"):
        adv.gdpo_advantages({"reward/a": torch.zeros(4)}, groups)


def test_rollouts_carry_the_components_to_the_gdpo_advantages_and_metrics() -> None:
    recipe = recipe_with(
        env__name="math_multi_reward",
        grpo__num_generations_per_prompt=4,
        grpo__adv_estimator={"name": "gdpo", "reward_weights": [1.0, 0.5, 2.0]},
        grpo__reward_scaling={"enabled": True, "source_min": 0.0, "source_max": 1.0,
                              "target_min": -1.0, "target_max": 1.0},
    )  # fmt: skip
    rows = [{"prompt": "pa", "answer": "7"}, {"prompt": "pb", "answer": "8"}]
    prompts = expand_prompts(recipe, CharTokenizer(), rows)
    texts = [
        "<think>a</think>\n<answer>7</answer>", "<answer>7</answer>", "x", "<answer>-7</answer>",
        "<think>b</think>\n<answer>8</answer>", "8", "<think>b</think>\n<answer>9</answer>", "",
    ]  # fmt: skip
    generation = generation_of(prompts.prompt_ids, [[ord(c) for c in t] + [2] for t in texts])
    generation.metrics, generation.engine_generated_tokens = {}, None
    env = build_environment(recipe.env)
    rollouts = score_rollouts(recipe, CharTokenizer(), env, prompts, generation)
    raw = {name: [multi.component_rewards(t, a)[name] for t, a in
                  zip(texts, prompts.answers, strict=True)] for name in MULTI_REWARD_NAMES}  # fmt: skip
    scaled = {name: [2 * r - 1 for r in values] for name, values in raw.items()}
    # the scalar reward: the sum of the components, then scaled (clamped to [0, 1] first)
    totals = [sum(values) for values in zip(*raw.values(), strict=True)]
    assert rollouts.rewards.tolist() == pytest.approx([2 * min(t, 1.0) - 1 for t in totals])
    assert {k: v.tolist() for k, v in rollouts.components().items()} == scaled
    batch = build_train_batch(recipe, rollouts)
    batch["old_logprobs"] = batch["generation_logprobs"].clone()
    finish_train_batch(recipe, rollouts, batch)
    want = ref.gdpo_advantages(prompts.prompt_ids, scaled, [1.0, 0.5, 2.0], True, True)
    assert batch["advantages"].tolist() == pytest.approx(want, abs=1e-5)
    metrics = rollout_metrics(rollouts, 1.0, 1.0)
    for name in MULTI_REWARD_NAMES:
        key = name.replace("/", "_") + "_mean"
        assert metrics[key] == pytest.approx(sum(scaled[name]) / 8)


@pytest.mark.parametrize(
    ("dotted", "path", "value"),
    [
        ({"grpo__adv_estimator": {"name": "gdpo"}}, "grpo.adv_estimator.name", "gdpo"),
        ({"env__name": "math_multi_reward",
          "grpo__adv_estimator": {"name": "gdpo", "reward_weights": [1.0, 2.0]}},
         "grpo.adv_estimator.reward_weights", [1.0, 2.0]),
        ({"env__name": "math_multi_reward", "grpo__adv_estimator": {"reward_weights": [1.0] * 3}},
         "grpo.adv_estimator.reward_weights", [1.0] * 3),
    ],
)  # fmt: skip
def test_gdpo_refusals_name_path_value_reason_and_fix(dotted, path, value) -> None:
    with pytest.raises(ConfigError) as caught:
        recipe_with(**dotted)
    (problem,) = caught.value.problems
    assert (problem.path, problem.value) == (path, value)
    assert problem.message and problem.fix


def test_nemo_rl_gdpo_config_loads_unmodified_with_its_estimator_and_environment() -> None:
    """gdpo_math_1B.yaml (main 7ea279a, v0.7.0) as written: gdpo without leave-one-out over
    math_multi_reward, named by data.default.env_name (the bar renders it on eos)."""
    from hpcrl.config import load_recipe
    from hpcrl.config.datasets import data_env_name
    from tests.nemo_rl_snapshots import release_root

    for release in ("main-7ea279a", "v0.7.0"):
        recipe = load_recipe(release_root(release) / "examples/configs/gdpo_math_1B.yaml").recipe
        assert recipe.grpo is not None
        assert recipe.grpo.adv_estimator.name == "gdpo"
        assert adv.estimator_flags(recipe.grpo) == (True, False)
        assert data_env_name(recipe) == "math_multi_reward"
        assert recipe.env.math_multi_reward is not None
        assert recipe.env.math_multi_reward.num_workers == 8


def test_data_sets_naming_two_environments_are_refused() -> None:
    data = base_dict("automodel")
    local = {"dataset_name": "ResponseDataset", "data_path": __file__}
    data["data"] = {
        "train": {**local, "env_name": "math_multi_reward"},
        "validation": {**local, "env_name": "math"},
    }
    with pytest.raises(ConfigError) as caught:
        validate_recipe_dict(data)
    (problem,) = caught.value.problems
    assert (problem.path, problem.value) == ("data.validation.env_name", "math")
    assert "one environment" in problem.message and problem.fix
