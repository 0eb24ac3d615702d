"""NeMo RL's ``math_multi_reward`` environment (``data.*.env_name: math_multi_reward``, set up
by ``env.math_multi_reward``): three named rewards per response, 1.0 or 0.0 each, for GDPO
(hpcrl.core.algorithms.advantages.gdpo_advantages). The answer is the text between the last
``<answer>`` and the first ``</answer>`` after it (the whole response, stripped, when there
is no tag):

- ``reward/correctness``: that answer equals the ground truth as a string;
- ``reward/integer``: that answer is all digits (``str.isdigit``: no sign, no decimals);
- ``reward/format``: the whole response is ``<think>...</think>\\n<answer>...</answer>``
  with exactly one ``<answer>`` and one ``</answer>``.

A response's scalar reward is the sum of the three, as NeMo RL's rollout adds a
multi-reward environment's components into its total reward. Plain string checks: the
math-verify package is not needed (NeMo RL's worker loads it but never calls it here).
"""

from __future__ import annotations

import re
from collections.abc import Sequence

CORRECTNESS = "reward/correctness"
INTEGER = "reward/integer"
FORMAT = "reward/format"
#: The components, in the sorted order GDPO weighs them in (``reward_weights``).
REWARD_NAMES = tuple(sorted((CORRECTNESS, INTEGER, FORMAT)))

_FORMAT_RE = re.compile(r"^<think>.*?</think>\n<answer>.*?</answer>$", re.DOTALL)


def extract_answer(response: str) -> str:
    """The text between the last ``<answer>`` and the ``</answer>`` after it, stripped."""
    return response.split("<answer>")[-1].split("</answer>")[0].strip()


def component_rewards(response: str, truth: str) -> dict[str, float]:
    """The three named rewards of one response (see the module docstring)."""
    answer = extract_answer(response)
    well_formed = (
        _FORMAT_RE.search(response) is not None
        and response.count("<answer>") == 1
        and response.count("</answer>") == 1
    )
    return {
        CORRECTNESS: 1.0 if answer == truth else 0.0,
        INTEGER: 1.0 if answer.isdigit() else 0.0,
        FORMAT: 1.0 if well_formed else 0.0,
    }


class MathMultiRewardEnvironment:
    """``score``: the scalar rewards (sum of the components); ``score_components``: each
    component's rewards by name."""

    reward_names = REWARD_NAMES

    def score_components(
        self, prompts: Sequence[str], responses: Sequence[str], answers: Sequence[str]
    ) -> dict[str, list[float]]:
        del prompts  # the ground truth is all this environment needs
        rows = [component_rewards(r, str(a)) for r, a in zip(responses, answers, strict=True)]
        return {name: [row[name] for row in rows] for name in REWARD_NAMES}

    def score(
        self, prompts: Sequence[str], responses: Sequence[str], answers: Sequence[str]
    ) -> list[float]:
        components = self.score_components(prompts, responses, answers)
        return [sum(values) for values in zip(*components.values(), strict=True)]
