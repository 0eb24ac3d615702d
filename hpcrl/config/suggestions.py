"""The closest of a few known names to one typed wrong: every "did you mean" of a config
problem starts here (``hpcrl.config.key_index`` extends it to whole key paths)."""

from __future__ import annotations

import difflib
import typing


def did_you_mean(word: str, choices: typing.Iterable[str]) -> str | None:
    matches = difflib.get_close_matches(str(word), list(choices), n=1, cutoff=0.6)
    return matches[0] if matches else None
