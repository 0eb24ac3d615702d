"""``env.math.math_verify_impl: dapo_math_verify``: NeMo RL's DAPO checker (the Minerva-style
answer match that DAPO's recipes train with), rebuilt here from its description.

A response earns 1.0 when the text after its last ``Answer:`` (case-insensitive, within its
last 300 characters, up to the end of that line) equals the ground truth once both went
through the same normalisation; else 0.0 (no ``Answer:`` line at all: 0.0). A ``\\boxed{}``
answer without an ``Answer:`` line earns nothing: that is the point of the format reward
DAPO's prompts ask for. The normalisation keeps only the part after the last ``=``, drops
filler words and units, unwraps ``$...$``, ``\\text{}``, ``\\textbf{}``, ``\\overline{}`` and
``\\boxed{}``, expands the shorthand ``\\frac12`` / ``\\sqrt2`` and drops thousands
separators of a plain integer. It is a string comparison: ``0.5`` and ``\\frac{1}{2}`` differ.
"""

from __future__ import annotations

import re
from collections.abc import Sequence

#: NeMo RL looks at the response's tail only (the longest MATH-500 answer is 159 characters).
TAIL_CHARS = 300
ANSWER_LINE_RE = re.compile(r"(?i)Answer\s*:\s*([^\n]+)")
#: Replacements in this order; the first two drop articles as NeMo RL does (a plain string
#: replace, so "a " inside a word's end is dropped too: part of the reference behaviour).
REPLACEMENTS = (
    ("an ", ""),
    ("a ", ""),
    (".$", "$"),
    ("\\$", ""),
    ("\\ ", ""),
    (" ", ""),
    ("mbox", "text"),
    (",\\text{and}", ","),
    ("\\text{and}", ","),
    ("\\text{m}", "\\text{}"),
)
#: Units, filler words and TeX spacing removed (in this order) before the comparison.
DROPPED = (
    *("square ways integers dollars mph inches hours km units \\ldots sue points".split()),
    *("feet minutes digits cents degrees cm gm pounds meters meals edges students".split()),
    *("childrentickets multiples".split()),
    *("\\text{s}", "\\text{.}", "\\text{\ns}", "\\text{}^2", "\\text{}^3", "\\text{\n}"),
    *("\\text{}", "\\mathrm{th}", "^\\circ", "^{\\circ}", "\\;", ",\\!", "{,}", '"', "\\dots"),
)
#: (pattern, replacement) applied in order after the plain replacements.
REWRITES = (
    (re.compile(r"(.*?)(\$)(.*?)(\$)(.*)"), "$\\3$"),
    (re.compile(r"(\\text\{)(.*?)(\})"), "\\2"),
    (re.compile(r"(\\textbf\{)(.*?)(\})"), "\\2"),
    (re.compile(r"(\\overline\{)(.*?)(\})"), "\\2"),
    (re.compile(r"(\\boxed\{)(.*)(\})"), "\\2"),
    (re.compile(r"(frac)([^{])(.)"), "frac{\\2}{\\3}"),
    (re.compile(r"(sqrt)([^{])"), "sqrt{\\2}"),
)


def normalize_answer(text: str) -> str:
    """One final answer in the form both sides are compared in."""
    text = text.split("=")[-1]
    for before, after in REPLACEMENTS:
        text = text.replace(before, after)
    for dropped in DROPPED:
        text = text.replace(dropped, "")
    for pattern, replacement in REWRITES:
        text = pattern.sub(replacement, text)
    text = text.replace("$", "")
    if text.replace(",", "").isdigit():
        text = text.replace(",", "")
    return text.strip()


def stated_answer(response: str) -> str:
    """The normalised text after the last ``Answer:`` of the response's tail, or
    ``[INVALID]`` (normalised) when there is none."""
    found = ANSWER_LINE_RE.findall(response[-TAIL_CHARS:])
    return normalize_answer(found[-1] if found else "[INVALID]")


class DapoMathEnvironment:
    """Reward 1.0 when the stated answer equals the ground truth after normalisation."""

    def score(
        self, prompts: Sequence[str], responses: Sequence[str], answers: Sequence[str]
    ) -> list[float]:
        del prompts
        return [self._score_one(r, a) for r, a in zip(responses, answers, strict=True)]

    def _score_one(self, response: str, answer: str) -> float:
        return 1.0 if stated_answer(response) == normalize_answer(str(answer)) else 0.0
