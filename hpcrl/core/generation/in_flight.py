"""In-flight weight updates (``grpo.async_grpo.in_flight_weight_updates``): a refit that lands
between two decode steps of a generation that is still running, instead of waiting behind it.

NeMo RL's meaning: the trainer synchronises the generation engines as soon as it has trained,
without waiting for the rollouts in flight to finish; those requests go on with the new
weights from their next token. ``recompute_kv_cache_after_weight_updates`` then decides what
their attention reads for the tokens already there: the cache the old weights computed (off,
"Magistral-style"), or a cache recomputed with the new weights (on, "AREAL-style").

The engine is only ever driven by one thread: the refit caller (a second thread of the
engine's actor) stages the weights and waits; the thread that generates applies them at its
next step boundary and says so. With no generation running the caller applies them itself.
"""

from __future__ import annotations

import threading
from collections.abc import Callable, Iterator
from contextlib import contextmanager
from typing import Any

import attrs

#: ``apply(named_tensors, recompute_kv_cache, running)``: load the weights into the engine;
#: ``running``: requests are in flight (their caches hold what the old weights computed).
ApplyRefit = Callable[[list[tuple[str, Any]], bool, bool], None]


@attrs.define
class _Staged:
    named_tensors: list[tuple[str, Any]]
    recompute_kv_cache: bool
    applied: threading.Event = attrs.field(factory=threading.Event)
    error: BaseException | None = None


class InFlightRefits:
    """The hand-over of one refit at a time between a refit thread and a generating thread."""

    def __init__(self, apply: ApplyRefit) -> None:
        self._apply = apply
        self._lock = threading.Lock()
        self._generating = False
        self._staged: _Staged | None = None
        self.applied_while_running = 0  # in the current (or last) generation call
        self.steps = 0  # step boundaries the current (or last) generation call passed

    @property
    def pending(self) -> bool:
        """A refit is staged and waits for the next step boundary."""
        with self._lock:
            return self._staged is not None

    def update(self, named_tensors: list[tuple[str, Any]], recompute_kv_cache: bool) -> bool:
        """Load these weights at the running generation's next step boundary, or now when
        none runs; returns once they are loaded. True when a generation was running."""
        with self._lock:
            if not self._generating:
                self._apply(named_tensors, recompute_kv_cache, False)
                return False
            # The actor's refit concurrency group runs one refit at a time.
            assert self._staged is None, "a second refit staged before the first was applied"
            staged = self._staged = _Staged(named_tensors, recompute_kv_cache)
        staged.applied.wait()
        if staged.error is not None:
            raise staged.error
        return True

    @contextmanager
    def generating(self) -> Iterator[None]:
        """Around one generation call; a refit staged as it ends is applied before it returns."""
        with self._lock:
            assert not self._generating, "two generation calls at once on one engine"
            self._generating = True
            self.applied_while_running = 0
            self.steps = 0
        try:
            yield
        finally:
            with self._lock:
                self._generating = False
                self._apply_staged(running=False)

    def at_step_boundary(self) -> bool:
        """Between two decode steps: apply a staged refit; True when one was applied."""
        with self._lock:
            self.steps += 1
            return self._apply_staged(running=True)

    def _apply_staged(self, running: bool) -> bool:
        staged, self._staged = self._staged, None
        if staged is None:
            return False
        try:
            self._apply(staged.named_tensors, staged.recompute_kv_cache, running)
        except BaseException as error:
            staged.error = error  # the refit caller raises it; so does the generating thread
            raise
        finally:
            staged.applied.set()
        if running:
            self.applied_while_running += 1
        return running
