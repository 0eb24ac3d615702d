"""``checkpointing.checkpoint_must_save_by``: NeMo RL's wall-clock save deadline, written
``DD:HH:MM:SS`` and counted from the start of the training loop. After each step NeMo RL
saves and stops once the time spent, plus one average step, reaches it
(``nemo_rl.utils.timer.TimeoutChecker`` with ``fit_last_save_time``); hpcrl does the same
(``hpcrl.core.save_deadline``), ending the run unfinished so ``hpcrl resume`` continues it. Parsed here, for the rule and for the job."""

from __future__ import annotations

from hpcrl.config.errors import Problem
from hpcrl.config.recipe import Recipe

PATH = "checkpointing.checkpoint_must_save_by"
UNITS_S = (86400, 3600, 60, 1)


def deadline_s(text: str) -> int | None:
    """Seconds of ``DD:HH:MM:SS``; None when it is not written that way."""
    parts = text.split(":")
    if len(parts) != len(UNITS_S) or not all(part.strip().isdigit() for part in parts):
        return None
    return sum(int(part) * unit for part, unit in zip(parts, UNITS_S, strict=True))


def rule_save_deadline(recipe: Recipe) -> list[Problem]:
    text = recipe.checkpointing.checkpoint_must_save_by
    if text is None or deadline_s(text) is not None:
        return []
    return [
        Problem(
            path=PATH,
            value=text,
            message="not a duration written DD:HH:MM:SS (days, hours, minutes, seconds)",
            fix=f"write it as NeMo RL does, e.g. {PATH}: '00:03:45:00' (3 h 45 min), or null",
        )
    ]
