"""``env.math.math_verify_impl: dapo_math_verify`` (NeMo RL's DAPO recipes set it, with the
DAPOMath17K prompts that ask for the answer on its own line after "Answer:").

The expected rewards are worked out by hand from NeMo RL's own checker
(nemo_rl/environments/dapo_math_verifier.py at 7ea279a: the last ``Answer:`` line of the
last 300 characters, both sides through its normalize_final_answer, string equality), one
case per step of that normalisation.
"""

from __future__ import annotations

import pytest

from hpcrl.config.recipe import EnvCfg, MathEnvCfg
from hpcrl.core.environments.build import build_environment
from hpcrl.core.environments.dapo_math_env import DapoMathEnvironment, normalize_answer

CASES = [
    # (response, ground truth, NeMo RL's reward, which step decides)
    ("Adding them up gives 42.\nAnswer: 42", "42", 1.0, "plain"),
    ("The sum is \\boxed{42}.", "42", 0.0, "no Answer: line, boxed only"),
    ("Answer: 3\nWait, I made an error.\nAnswer: 4", "4", 1.0, "the last Answer: wins"),
    ("Answer: 3\nWait, I made an error.\nAnswer: 4", "3", 0.0, "the last Answer: wins"),
    ("answer : $1,000$ dollars", "1000", 1.0, "case, $..$, units, thousands separator"),
    ("Answer: x = \\frac12", "\\frac{1}{2}", 1.0, "after '=', \\frac shorthand"),
    ("Answer: 0.5", "\\frac{1}{2}", 0.0, "a string match, not a numeric one"),
    ("Answer: 90^\\circ", "90", 1.0, "degree sign dropped"),
    ("Answer: \\boxed{17}", "17", 1.0, "\\boxed unwrapped"),
    ("Answer: \\text{12 inches}", "12", 1.0, "\\text unwrapped, unit dropped"),
    ("Answer: 7\n" + "Let me double-check. " * 20, "7", 0.0, "Answer: before the last 300"),
]


@pytest.mark.parametrize(("response", "truth", "reward", "why"), CASES)
def test_rewards_match_nemo_rl_dapo_checker(response, truth, reward, why):
    assert DapoMathEnvironment().score(["q"], [response], [truth]) == [reward], why


def test_normalisation_steps():
    assert normalize_answer("x = $2,500$ cents") == "2500"
    assert normalize_answer("\\sqrt2") == "\\sqrt{2}"
    assert normalize_answer("\\overline{AB}") == "AB"
    assert normalize_answer("1,2") == "12"  # NeMo RL drops commas of all-digit answers


def test_env_math_math_verify_impl_switches_to_the_dapo_checker():
    """Setting the key changes the rewards a run trains on: the boxed-only response that
    hpcrl's numeric check rewards earns nothing under DAPO's format."""
    responses = ["so \\boxed{12}", "work...\nAnswer: 12"]
    dapo = build_environment(EnvCfg(math=MathEnvCfg(math_verify_impl="dapo_math_verify")))
    numeric = build_environment(EnvCfg(math=MathEnvCfg(math_verify_impl="hpcrl_numeric")))
    assert type(dapo) is DapoMathEnvironment
    assert dapo.score(["p", "p"], responses, ["12", "12"]) == [0.0, 1.0]
    assert numeric.score(["p", "p"], responses, ["12", "12"]) == [1.0, 1.0]
