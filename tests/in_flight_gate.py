"""Runs a refit from a second thread at a chosen step boundary of a generation, the same
boundary on a loaded machine as on an idle one (``hpcrl.core.generation.in_flight``).

A refit thread that only polls the step count may first run after the wave has ended (then
the refit lands while idle and the test reads a race as a bug): the generating thread holds
at the chosen boundary until the refit is staged, so the refit lands exactly there."""

from __future__ import annotations

import threading
import time
from collections.abc import Callable, Iterator
from contextlib import contextmanager
from typing import Any


@contextmanager
def refit_at_step(
    engine: Any, after_steps: int, refit: Callable[[], bool], timeout_s: float = 60
) -> Iterator[list[bool]]:
    """Within the block, a generation on ``engine`` gets ``refit()`` staged at its
    ``after_steps``-th step boundary; the list yielded receives what ``refit()`` returned."""
    in_flight = engine.in_flight
    landed: list[bool] = []
    reached = threading.Event()
    boundary = in_flight.at_step_boundary

    def gated_boundary() -> bool:
        if in_flight.steps + 1 == after_steps:
            reached.set()
            deadline = time.monotonic() + timeout_s
            while not in_flight.pending and time.monotonic() < deadline:
                time.sleep(0.0005)
        return boundary()

    def refit_once_reached() -> None:
        reached.wait(timeout=timeout_s)
        landed.append(refit())

    in_flight.at_step_boundary = gated_boundary
    thread = threading.Thread(target=refit_once_reached)
    thread.start()
    try:
        yield landed
    finally:
        if not reached.is_set():  # the generation never got there: let the thread go
            reached.set()
        thread.join(timeout=timeout_s)
        in_flight.at_step_boundary = boundary
