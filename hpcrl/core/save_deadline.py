"""The job's side of ``checkpointing.checkpoint_must_save_by`` (``hpcrl.config.save_deadline``):
a clock started with the training loop that says, after each step, whether the time spent
plus the average step reaches the deadline, once."""

from __future__ import annotations

import time
from collections.abc import Callable

import attrs

from hpcrl.config.save_deadline import deadline_s


@attrs.define
class SaveDeadline:
    deadline_s: float
    clock: Callable[[], float] = time.monotonic
    started_s: float = attrs.field(init=False)
    last_step_s: float = attrs.field(init=False)
    step_times_s: list[float] = attrs.field(factory=list)
    fired: bool = False

    def __attrs_post_init__(self) -> None:
        self.started_s = self.last_step_s = self.clock()

    @classmethod
    def from_text(cls, text: str | None, clock: Callable[[], float] = time.monotonic):
        """None without a deadline."""
        seconds = None if text is None else deadline_s(text)
        return None if seconds is None else cls(float(seconds), clock)

    def step_done(self) -> bool:
        """Mark a step done; True the first time the next step would end past the deadline."""
        now = self.clock()
        self.step_times_s.append(now - self.last_step_s)
        self.last_step_s = now
        if self.fired:
            return False
        average_s = sum(self.step_times_s) / len(self.step_times_s)
        self.fired = now - self.started_s + average_s >= self.deadline_s
        return self.fired
