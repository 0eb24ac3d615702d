"""GRPO between the environment and the loss against NeMo RL (issue 24, item 6): reward scaling
and shaping, advantage estimators and clipping, groups by prompt content, prompts that do not
fit, dynamic sampling. The reference is tests/core/nemo_rl_reference.py (NeMo RL's formulas,
written from its code); the cases come from NeMo RL's own recipes where one exists."""

from __future__ import annotations

import random
import types

import pytest

from tests.require import require_module

torch = require_module("torch")

from hpcrl.config import ConfigError, validate_recipe_dict  # noqa: E402
from hpcrl.config.recipe import GenerationCfg, Recipe  # noqa: E402
from hpcrl.core.algorithms import advantages as adv  # noqa: E402
from hpcrl.core.algorithms.dynamic_sampling import rows_with_signal  # noqa: E402
from hpcrl.core.algorithms.grpo import (  # noqa: E402
    build_train_batch,
    expand_prompts,
    finish_train_batch,
    score_rollouts,
    truncated_responses,
)
from hpcrl.core.algorithms.reward_terms import shape_rewards  # noqa: E402
from hpcrl.core.data.prompts import fit_prompt, prompt_key  # noqa: E402
from tests.core import nemo_rl_reference as ref  # noqa: E402
from tests.nemo_rl_snapshots import RELEASES, nemo_rl_config  # noqa: E402
from tests.recipe_builder import base_dict, with_keys  # noqa: E402


def recipe_with(**dotted) -> Recipe:
    recipe, _ = validate_recipe_dict(with_keys(base_dict("automodel"), **dotted))
    return recipe


# --------------------------------------------------------------------------- reward shaping
def test_dapo_recipe_scales_rewards_before_the_overlong_penalty_without_a_floor() -> None:
    """NeMo RL's dapo-qwen2.5-7b: reward_scaling to [−1, 1], then DAPO's penalty over a 2048-
    token buffer before max_response_length 14336 (penalty 1, from grpo_math_1B)."""
    grpo = nemo_rl_config("main-7ea279a", "recipes/llm/dapo-qwen2.5-7b.v2.yaml")["grpo"]
    scaling, shaping = grpo["reward_scaling"], grpo["reward_shaping"]
    rewards, lengths = [1.0, 1.0, 0.0, 1.0], [10000, 13000, 14336, 15500]
    want = ref.dapo_shaping(
        ref.scale(
            rewards, *(scaling[k] for k in ("source_min", "source_max", "target_min", "target_max"))
        ),
        lengths,
        shaping["overlong_buffer_length"],
        shaping["overlong_buffer_penalty"],
        shaping["max_response_length"],
    )
    assert want == pytest.approx([1.0, 0.65234, -2.0, -0.56836], abs=1e-5)
    recipe = recipe_with(grpo__reward_scaling=scaling, grpo__reward_shaping=shaping)
    truncated = torch.zeros(4, dtype=torch.bool)
    got = shape_rewards(recipe, torch.tensor(rewards), torch.tensor(lengths), truncated)
    # hpcrl before: shaping first, the penalty capped at 1, then scaling: [1, 0.305, −1, −1]
    assert got.rewards.tolist() == pytest.approx(want, abs=1e-5)
    assert got.unshaped.tolist() == [1.0, 1.0, -1.0, 1.0]  # what dynamic sampling filters on


def test_stop_properly_penalty_scales_truncated_rewards_and_replaces_dapo() -> None:
    shaping = {
        "enabled": True,
        "overlong_buffer_length": None,  # NeMo RL ignores the DAPO keys with the coefficient
        "overlong_buffer_penalty": None,
        "max_response_length": None,
        "stop_properly_penalty_coef": 0.25,
    }
    recipe = recipe_with(grpo__reward_shaping=shaping)
    rewards, truncated = [1.0, 0.5, 1.0, 0.0], [True, True, False, False]
    got = shape_rewards(
        recipe, torch.tensor(rewards), torch.tensor([64] * 4), torch.tensor(truncated)
    )
    assert (
        got.rewards.tolist() == ref.stop_properly(rewards, truncated, 0.25) == [0.25, 0.125, 1, 0]
    )


SHAPING = "grpo.reward_shaping"


@pytest.mark.parametrize(
    ("dotted", "path", "value"),
    [
        ({"grpo__reward_shaping": {"enabled": True, "stop_properly_penalty_coef": 1.5}},
         f"{SHAPING}.stop_properly_penalty_coef", 1.5),
        ({"grpo__reward_shaping": {"enabled": True, "overlong_buffer_penalty": -1.0,
                                   "max_response_length": 512}},
         f"{SHAPING}.overlong_buffer_penalty", -1.0),
        ({"grpo__reward_shaping": {"enabled": True, "overlong_buffer_length": None,
                                   "max_response_length": 512}},
         f"{SHAPING}.overlong_buffer_length", None),
        ({"grpo__adv_estimator": {"name": "gdpo"}}, "grpo.adv_estimator.name", "gdpo"),
        ({"grpo__adv_estimator": {"name": "opd"}}, "grpo.adv_estimator.name", "opd"),
        ({"grpo__adv_estimator": {"name": "gae"}}, "grpo.adv_estimator.name", "gae"),
        ({"grpo__adv_estimator": {"reward_weights": [1.0, 2.0]}},
         "grpo.adv_estimator.reward_weights", [1.0, 2.0]),
        ({"grpo__advantage_clip_low": 2.0, "grpo__advantage_clip_high": 1.0},
         "grpo.advantage_clip_low", 2.0),
        ({"grpo__seq_logprob_error_threshold": 0.9}, "grpo.seq_logprob_error_threshold", 0.9),
        ({"loss_fn__positive_example_nll_weight": 0.1},
         "loss_fn.positive_example_nll_weight", 0.1),
    ],
)  # fmt: skip
def test_refused_settings_name_path_value_reason_and_fix(dotted, path, value) -> None:
    with pytest.raises(ConfigError) as caught:
        recipe_with(**dotted)
    (problem,) = caught.value.problems
    assert (problem.path, problem.value) == (path, value)
    assert problem.message and problem.fix


@pytest.mark.parametrize("release", RELEASES)
def test_grpo_math_options_load_where_each_release_puts_them(release) -> None:
    """grpo_math_1B of each release: the options of item 6 (absent in v0.5.0), at NeMo RL's
    values and places, load; the resolved estimator keys point at grpo.* as NeMo RL's do."""
    config = nemo_rl_config(release, "grpo_math_1B.yaml")
    grpo, loss = config["grpo"], config["loss_fn"]
    keys = {
        f"grpo__{k}": grpo[k]
        for k in ("adv_estimator", "advantage_clip_low", "advantage_clip_high",
                  "seq_logprob_error_threshold")
        if k in grpo
    }  # fmt: skip
    keys["grpo__reward_shaping"] = grpo["reward_shaping"]
    if "positive_example_nll_weight" in loss:
        keys["loss_fn__positive_example_nll_weight"] = loss["positive_example_nll_weight"]
    assert len(keys) == (1 if release == "v0.5.0" else 6), sorted(keys)
    recipe = recipe_with(**keys)
    assert adv.estimator_flags(recipe.grpo) == (True, True)
    if release != "v0.5.0":
        assert recipe.grpo.adv_estimator.name == "grpo"
        assert recipe.grpo.reward_shaping.stop_properly_penalty_coef is None


# --------------------------------------------------------------------------- advantages
def random_case(seed: int):
    rng = random.Random(seed)
    prompts = [[rng.choice([1, 2, 3])] for _ in range(12)]  # few prompts: repeats pool
    rewards = [rng.choice([0.0, 1.0, 0.5, rng.random()]) for _ in prompts]
    counts = [rng.randint(1, 9) for _ in prompts]
    return prompts, rewards, counts


@pytest.mark.parametrize("seed", range(4))
@pytest.mark.parametrize("normalize", [True, False])
@pytest.mark.parametrize("loo", [True, False])
def test_grpo_estimator_groups_by_prompt_content(seed, normalize, loo) -> None:
    prompts, rewards, _ = random_case(seed)
    groups = adv.prompt_groups([tuple(p) for p in prompts])
    got = adv.group_advantages(
        torch.tensor(rewards, dtype=torch.float64), groups, normalize=normalize, leave_one_out=loo
    )
    assert got.tolist() == pytest.approx(
        ref.grpo_advantages(prompts, rewards, normalize, loo), abs=1e-5
    )


def test_the_same_prompt_twice_in_a_step_is_one_group() -> None:
    # Rows 0-1 and 2-3 hold the same prompt: NeMo RL pools them into one group of four
    # (mean 0.5, std √(1/3)); hpcrl before: two groups of equal rewards, all advantages 0.
    keys = [prompt_key([5, 6, 0], 0)] * 2 + [prompt_key([5, 6], 0)] * 2  # trailing pad: same
    groups = adv.prompt_groups(keys)
    assert groups.tolist() == [0, 0, 0, 0]
    got = adv.group_advantages(torch.tensor([1.0, 1.0, 0.0, 0.0]), groups)
    assert got.tolist() == pytest.approx([0.866, 0.866, -0.866, -0.866], abs=1e-3)
    prompts = [[5, 6]] * 4
    assert got.tolist() == pytest.approx(
        ref.grpo_advantages(prompts, [1, 1, 0, 0], True, False), abs=1e-6
    )


@pytest.mark.parametrize("seed", range(4))
@pytest.mark.parametrize("minus_baseline", [True, False])
def test_reinforce_plus_plus_estimator(seed, minus_baseline) -> None:
    prompts, rewards, counts = random_case(seed)
    mask = torch.zeros(len(prompts), 10)
    for row, count in enumerate(counts):
        mask[row, 1 : 1 + count] = 1.0
    got = adv.reinforce_plus_plus_advantages(
        torch.tensor(rewards), adv.prompt_groups([tuple(p) for p in prompts]), mask,
        minus_baseline=minus_baseline,
    )  # fmt: skip
    want = ref.reinforce_plus_plus_advantages(prompts, rewards, counts, minus_baseline)
    assert got.tolist() == pytest.approx(want, abs=1e-5)


def test_estimator_choice_and_advantage_clipping() -> None:
    prompts, rewards, counts = random_case(7)
    groups = adv.prompt_groups([tuple(p) for p in prompts])
    mask = torch.ones(len(prompts), 9) * (torch.arange(9) < torch.tensor(counts)[:, None])
    for estimator, want in (
        ({"name": "grpo"}, ref.grpo_advantages(prompts, rewards, True, True)),
        ({"name": "grpo", "normalize_rewards": False, "use_leave_one_out_baseline": False},
         ref.grpo_advantages(prompts, rewards, False, False)),
        ({"name": "reinforce_plus_plus"},
         ref.reinforce_plus_plus_advantages(prompts, rewards, counts, True)),
    ):  # fmt: skip
        recipe = recipe_with(
            grpo__adv_estimator=estimator,
            grpo__advantage_clip_low=-0.3,
            grpo__advantage_clip_high=0.5,
        )
        got = adv.estimate_advantages(recipe.grpo, torch.tensor(rewards), groups, mask)
        assert got.tolist() == pytest.approx(ref.clip(want, -0.3, 0.5), abs=1e-5)
        assert min(want) < -0.3 and max(want) > 0.5  # both bounds bite
    # v0.5.0's keys (no adv_estimator section) drive the grpo estimator
    recipe = recipe_with(grpo__normalize_rewards=False, grpo__use_leave_one_out_baseline=False)
    assert adv.estimator_flags(recipe.grpo) == (False, False)


# --------------------------------------------------------------------------- prompts that do not fit
class CharTokenizer:
    """A stand-in tokenizer (one id per character, pad 0, EOS 2): the GRPO data path needs
    only encode/decode and the special ids."""

    pad_token_id, eos_token_id, chat_template = 0, 2, None

    def __call__(self, text):
        return {"input_ids": [ord(c) for c in text]}

    def decode(self, ids, skip_special_tokens=True):
        return "".join(chr(i) for i in ids if i > 2)


def test_prompts_that_do_not_fit_get_loss_multiplier_0_and_stay_in_the_baseline() -> None:
    """data.max_input_seq_length 8: 'abcdefghij' (10 tokens) is cut to its first 4 tokens and
    masked, as NeMo RL's processors do (hpcrl before: the last 8 tokens, trained on)."""
    assert (
        fit_prompt(list(range(10)), 8) == ref.fit_prompt(list(range(10)), 8) == ([0, 1, 2, 3], 0.0)
    )
    assert fit_prompt(list(range(7)), 8) == ref.fit_prompt(list(range(7)), 8)
    assert fit_prompt(list(range(8)), 8) == ref.fit_prompt(list(range(8)), 8)  # ≥: cut
    recipe = recipe_with(
        data__max_input_seq_length=8, grpo__num_generations_per_prompt=2,
        grpo__use_leave_one_out_baseline=False,
    )  # fmt: skip
    rows = [{"prompt": "abcdefghij", "answer": "x"}, {"prompt": "short", "answer": "y"}]
    prompts = expand_prompts(recipe, CharTokenizer(), rows)
    assert prompts.prompt_ids == [[97, 98, 99, 100]] * 2 + [[115, 104, 111, 114, 116]] * 2
    assert prompts.loss_multiplier == [0.0, 0.0, 1.0, 1.0]
    rollouts = score_rollouts(recipe, CharTokenizer(), ScoreByRow([1.0, 0.0, 0.0, 1.0]),
                              prompts, generation_of(prompts.prompt_ids, [[70, 2], [71, 2]] * 2))  # fmt: skip
    batch = build_train_batch(recipe, rollouts)
    assert batch["sample_mask"].tolist() == [0.0, 0.0, 1.0, 1.0]
    assert batch["token_mask"].sum(dim=1).tolist() == [0.0, 0.0, 2.0, 2.0]
    batch["old_logprobs"] = batch["generation_logprobs"].clone()
    finish_train_batch(recipe, rollouts, batch)
    want = ref.grpo_advantages(prompts.prompt_ids, [1.0, 0.0, 0.0, 1.0], True, False)
    assert batch["advantages"].tolist() == pytest.approx(want, abs=1e-5)
    assert want[0] != 0  # the masked group still has its own baseline


class ScoreByRow:
    def __init__(self, rewards):
        self.rewards = rewards

    def score(self, prompts, responses, answers):
        return list(self.rewards)


def generation_of(prompt_ids, responses):
    """A GenerationOutput-like batch: each prompt followed by its response, right-padded."""
    width = max(len(p) + len(r) for p, r in zip(prompt_ids, responses, strict=True))
    ids = torch.zeros(len(prompt_ids), width, dtype=torch.long)
    response_mask = torch.zeros(len(prompt_ids), width)
    for row, (p, r) in enumerate(zip(prompt_ids, responses, strict=True)):
        ids[row, : len(p) + len(r)] = torch.tensor(p + r)
        response_mask[row, len(p) : len(p) + len(r)] = 1.0
    return types.SimpleNamespace(
        input_ids=ids,
        attention_mask=(ids != 0).long(),
        response_mask=response_mask,
        generation_logprobs=-0.5 * response_mask,
        prompt_lengths=torch.tensor([len(p) for p in prompt_ids]),
        response_lengths=torch.tensor([len(r) for r in responses]),
    )


def test_truncated_counts_the_tokens_a_prompt_left_of_the_context() -> None:
    # max_total 10: a 7-token prompt may generate 3 tokens, fewer than max_new_tokens 5.
    cfg = GenerationCfg(max_new_tokens=5)
    generation = generation_of([[9] * 7, [9] * 7, [9] * 2], [[5, 5, 5], [5, 5, 2], [5, 5, 5]])
    flags = truncated_responses(generation, cfg, 2, ["", "", ""], 10)
    assert flags.tolist() == [True, False, False]


# --------------------------------------------------------------------------- dynamic sampling
def test_dynamic_sampling_filters_on_unshaped_rewards_by_prompt_content() -> None:
    # Prompt A (rows 0-1, 4-5: drawn twice): unshaped [1, 1, 0, 0] → spread, all kept (hpcrl
    # before: two equal groups, both dropped). Prompt B (rows 2-3): unshaped [1, 1] but
    # shaped [1, 0.4] by length → dropped (NeMo RL filters on the unshaped rewards).
    keys = [(1,), (1,), (2,), (2,), (1,), (1,)]
    unshaped = [1.0, 1.0, 1.0, 1.0, 0.0, 0.0]
    rollouts = types.SimpleNamespace(
        prompt_keys=keys,
        unshaped_rewards=torch.tensor(unshaped),
        rewards=torch.tensor([1.0, 1.0, 1.0, 0.4, 0.0, 0.0]),
    )
    assert rows_with_signal(rollouts, leave_one_out=False) == [0, 1, 4, 5]
    _, std = ref.baseline_and_std_per_prompt([list(k) for k in keys], unshaped, False)
    assert [i for i, s in enumerate(std) if s != 0] == [0, 1, 4, 5]
    # leave-one-out: a member is kept when the *others* differ (NeMo RL's per-sample std)
    keys, unshaped = [(1,)] * 4, [1.0, 0.0, 0.0, 0.0]
    rollouts = types.SimpleNamespace(prompt_keys=keys, unshaped_rewards=torch.tensor(unshaped))
    _, std = ref.baseline_and_std_per_prompt([list(k) for k in keys], unshaped, True)
    want = [i for i, s in enumerate(std) if s != 0]
    assert rows_with_signal(rollouts, leave_one_out=True) == want == [1, 2, 3]
