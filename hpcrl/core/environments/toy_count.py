"""Toy environment that a tiny random model learns within a few GRPO steps (the CPU demo).

Reward of one response = the fraction of its characters that belong to the target set given
by the row's answer (a string of characters; empty answer: the ten digits). Special tokens
are stripped before scoring, so a response that stops at once (empty text) scores 0. With
the tiny character-level tokenizer a random model emits a digit about one time in ten, so
the starting reward is ≈ 0.1 and every group of samples has some spread to learn from; a
policy that answers only with target characters scores 1.
"""

from __future__ import annotations

import string
from collections.abc import Sequence

DEFAULT_TARGET = string.digits


def target_fraction(response: str, targets: str) -> float:
    """Share of ``response``'s characters that are in ``targets`` (0 for an empty one)."""
    if not response:
        return 0.0
    target_set = set(targets or DEFAULT_TARGET)
    return sum(char in target_set for char in response) / len(response)


class ToyCountEnvironment:
    """Reward = fraction of the response's characters that are target characters."""

    def __init__(self, default_target: str = DEFAULT_TARGET) -> None:
        self.default_target = default_target

    def score(
        self, prompts: Sequence[str], responses: Sequence[str], answers: Sequence[str]
    ) -> list[float]:
        del prompts
        return [
            target_fraction(response, str(answer) if answer else self.default_target)
            for response, answer in zip(responses, answers, strict=True)
        ]
