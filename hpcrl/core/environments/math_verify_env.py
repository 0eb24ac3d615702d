"""``env.math.math_verify_impl: hf_math_verify`` (NeMo RL's default): Hugging Face's
math-verify parses the response's final answer (LaTeX or plain expression) and checks it
symbolically against the ground truth, given as ``\\boxed{truth}``. Reward 1.0 or 0.0.

math-verify is an optional package of the job image (NeMo RL's images ship it); without it
the environment fails at setup naming the key, never falling back silently.
"""

from __future__ import annotations

from collections.abc import Sequence

KEY = "env.math.math_verify_impl"


class MathVerifyEnvironment:
    def __init__(self) -> None:
        try:
            import math_verify
        except ImportError:
            raise ValueError(
                f"{KEY}: hf_math_verify needs the math-verify package in the job's Python "
                "(pip install math-verify); or set it to hpcrl_numeric for hpcrl's numeric check"
            ) from None
        self._math_verify = math_verify

    def score(
        self, prompts: Sequence[str], responses: Sequence[str], answers: Sequence[str]
    ) -> list[float]:
        del prompts
        return [self._score_one(r, a) for r, a in zip(responses, answers, strict=True)]

    def _score_one(self, response: str, answer: str) -> float:
        mv = self._math_verify
        try:
            gold = mv.parse("\\boxed{" + str(answer) + "}")
            found = mv.parse(response)
            return 1.0 if found and mv.verify(gold, found) else 0.0
        except Exception:  # noqa: BLE001 - an unparsable response earns nothing, as in NeMo RL
            return 0.0
