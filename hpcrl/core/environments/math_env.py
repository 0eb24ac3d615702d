"""Math environment: reward 1 when the response's final numeric answer equals the ground truth.

The answer taken from a response is, in order of preference: the content of the last
``\\boxed{...}``; the number after the last "answer is" / "answer:"; else the last number in
the text. Numbers may carry a sign, thousands separators, decimals or be a fraction ``a/b``.
A response with no number scores 0.
"""

from __future__ import annotations

import math
import re
from collections.abc import Sequence

_NUMBER = r"[-+]?(?:\d{1,3}(?:,\d{3})+|\d+)(?:\.\d+)?(?:\s*/\s*[-+]?\d+(?:\.\d+)?)?|[-+]?\.\d+"
NUMBER_RE = re.compile(_NUMBER)
BOXED_RE = re.compile(r"\\boxed\{([^{}]*)\}")
ANSWER_IS_RE = re.compile(r"answer\s*(?:is|:|=)\s*\$?\s*(" + _NUMBER + ")", re.IGNORECASE)


def parse_number(text: str) -> float | None:
    """A float for one number token ("1,234", "-3.5", "3/4"); None if it is not one."""
    cleaned = text.replace(",", "").replace(" ", "")
    try:
        if "/" in cleaned:
            numerator, denominator = cleaned.split("/", 1)
            return float(numerator) / float(denominator)
        return float(cleaned)
    except (ValueError, ZeroDivisionError):
        return None


def extract_final_answer(response: str) -> float | None:
    """The response's final numeric answer (see the module docstring), or None."""
    boxed = BOXED_RE.findall(response)
    if boxed:
        numbers = NUMBER_RE.findall(boxed[-1])
        return parse_number(numbers[-1]) if numbers else None
    stated = ANSWER_IS_RE.findall(response)
    if stated:
        return parse_number(stated[-1])
    numbers = NUMBER_RE.findall(response)
    return parse_number(numbers[-1]) if numbers else None


class MathEnvironment:
    """Reward 1.0 when |answer − truth| ≤ abs_tol + rel_tol·|truth|, else 0.0."""

    def __init__(self, abs_tol: float = 1e-6, rel_tol: float = 1e-6) -> None:
        self.abs_tol = abs_tol
        self.rel_tol = rel_tol

    def score(
        self, prompts: Sequence[str], responses: Sequence[str], answers: Sequence[str]
    ) -> list[float]:
        del prompts  # the ground truth is all this environment needs
        return [self._score_one(r, a) for r, a in zip(responses, answers, strict=True)]

    def _score_one(self, response: str, answer: str) -> float:
        truth = parse_number(str(answer).strip())
        if truth is None:
            raise ValueError(f"math environment: ground-truth answer {answer!r} is not a number")
        found = extract_final_answer(response)
        if found is None or not math.isfinite(found):
            return 0.0
        close = math.isclose(found, truth, rel_tol=self.rel_tol, abs_tol=self.abs_tol)
        return 1.0 if close else 0.0
