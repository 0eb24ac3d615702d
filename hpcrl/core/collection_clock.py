"""How long Python's garbage collector ran, per step, in the driver and in each worker.

A full (generation 2) collection walks every object the process tracks: with torch,
transformers and Ray loaded that is hundreds of thousands of objects and 0.1-0.4 s, on
whichever step the collector's thresholds happen to pick. Such a step shows up as a stall
with nothing in the step's own phases to explain it; the step's metrics name it instead
(``time_gc_driver_s``, ``time_gc_worker_s``: the slowest rank).

``frozen_during_steps`` moves what exists before the first step (imports, the tokenizer, the
data, the workers' handles) out of the collector's reach for the step loop, as the workers
do after their setup (``hpcrl.core.workers.manual_gc``): later full collections then walk
only what the steps themselves keep.
"""

from __future__ import annotations

import contextlib
import gc
import time
from collections.abc import Iterator
from typing import Any

import attrs


@attrs.define
class CollectionClock:
    """Sums the collector's runs from ``install`` on; ``take`` returns and resets the sums."""

    seconds: float = 0.0
    full_collections: int = 0
    _started_at: float | None = attrs.field(default=None, init=False)

    def _on_collection(self, phase: str, info: dict[str, Any]) -> None:
        if phase == "start":
            self._started_at = time.perf_counter()
            return
        if self._started_at is None:  # installed between a collection's start and stop
            return
        self.seconds += time.perf_counter() - self._started_at
        self._started_at = None
        self.full_collections += int(info["generation"] == 2)

    def install(self) -> CollectionClock:
        if self._on_collection not in gc.callbacks:
            gc.callbacks.append(self._on_collection)
        return self

    def remove(self) -> None:
        if self._on_collection in gc.callbacks:
            gc.callbacks.remove(self._on_collection)

    @contextlib.contextmanager
    def installed(self) -> Iterator[CollectionClock]:
        self.install()
        try:
            yield self
        finally:
            self.remove()

    def take(self, suffix: str) -> dict[str, float]:
        """The sums since the last ``take`` as metrics named ``..._{suffix}``, then zero."""
        taken = {
            f"time_gc_{suffix}_s": self.seconds,
            f"gc_full_collections_{suffix}": float(self.full_collections),
        }
        self.seconds, self.full_collections = 0.0, 0
        return taken


@contextlib.contextmanager
def frozen_during_steps() -> Iterator[None]:
    """Everything alive now kept out of the collector's walks until the block ends: one
    collection first (garbage is not frozen with the rest), unfrozen afterwards, so a process
    that trains again (tests, sweeps in one driver) frees what this run left."""
    gc.collect()
    gc.freeze()
    try:
        yield
    finally:
        gc.unfreeze()
