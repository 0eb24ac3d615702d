"""Reward environments: exact rewards for hand-written responses."""

from __future__ import annotations

import pytest

from hpcrl.config.recipe import EnvCfg
from hpcrl.core.environments.build import build_environment
from hpcrl.core.environments.math_env import extract_final_answer


@pytest.mark.parametrize(
    ("response", "expected"),
    [
        ("2 + 3 = 5, so 5 + 1 = 6", 6.0),
        ("The answer is 42. Check: 40 + 2", 42.0),
        ("answer: -7", -7.0),
        ("we get \\boxed{1,234} (not 99)", 1234.0),
        ("half is \\boxed{1/2}", 0.5),
        ("\\boxed{3} then answer is 9", 3.0),
        ("pi is about 3.14", 3.14),
        ("no digits here", None),
    ],
)
def test_math_answer_extraction(response: str, expected: float | None) -> None:
    assert extract_final_answer(response) == expected


def test_math_rewards_one_for_right_final_answer_only() -> None:
    env = build_environment(EnvCfg(name="math"))
    rewards = env.score(
        ["q"] * 5,
        ["12+30=42", "so it is 41", "The answer is 0.5", "\\boxed{ 7 }", ""],
        ["42", "42", "1/2", "7.0", "3"],
    )
    assert rewards == [1.0, 0.0, 1.0, 1.0, 0.0]
    with pytest.raises(ValueError, match="not a number"):
        env.score(["q"], ["1"], ["seven"])


def test_toy_count_rewards_fraction_of_target_characters() -> None:
    env = build_environment(EnvCfg(name="toy_count"))
    rewards = env.score(["p"] * 5, ["1234", "12ab", "abcd", "", "x9"], ["", "", "", "", "9"])
    assert rewards == [1.0, 0.5, 0.0, 0.0, 0.5]
    assert env.score(["p"], ["aab"], ["a"]) == [pytest.approx(2 / 3)]


def test_unknown_env_kwargs_name_the_key() -> None:
    with pytest.raises(ValueError, match="env.kwargs"):
        build_environment(EnvCfg(name="math", kwargs={"tolerance": 1}))
