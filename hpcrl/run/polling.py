"""Waiting for something with a deadline: the one polling loop, shared by both sides.

The login side (run-folder locks, local cancel, ``--wait``) and the job side (Ray bring-up)
poll with short intervals against a deadline, never after a fixed sleep: on a busy node the
awaited thing may take 2 s or 20 s. Pure: standard library only, so both sides import it.
"""

from __future__ import annotations

import time
from collections.abc import Callable

POLL_INTERVAL_S = 0.1


def wait_until(
    condition: Callable[[], bool],
    deadline_s: float,
    *,
    abort: Callable[[], None] = lambda: None,
    interval_s: float = POLL_INTERVAL_S,
    clock: Callable[[], float] = time.monotonic,
    sleep: Callable[[float], None] = time.sleep,
) -> bool:
    """Poll ``condition`` until it holds (True) or ``deadline_s`` passes (False).

    ``abort`` runs between polls and may raise to stop waiting early (another node failed).
    """
    end = clock() + deadline_s
    while True:
        if condition():
            return True
        abort()
        if clock() >= end:
            return False
        sleep(interval_s)
