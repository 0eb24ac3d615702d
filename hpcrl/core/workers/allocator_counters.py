"""How often a worker's CUDA caching allocator had to go to the driver, per step.

A step whose tensors need block sizes the allocator has not cached calls ``cudaMalloc``
(slow; a failed one frees the cache and tries again: a "retry"). Workers whose micro-batch
widths change from step to step (no compile bucket: the Megatron backend) can meet new sizes
in any early step. Each step's metrics line carries the new segments and retries of the
worker that had most (``gpu_segments_allocated_worker``, ``gpu_alloc_retries_worker``), so a
slow step can be checked against them (docs/performance.md, item 2: Megatron's slow steps 3-4
on an H100 are the case it was added for, not yet measured with it).
"""

from __future__ import annotations

from collections.abc import Callable, Mapping
from typing import Any

import attrs

# torch.cuda.memory_stats() keys (cumulative since the process started)
SEGMENTS_KEY = "segment.all.allocated"
RETRIES_KEY = "num_alloc_retries"


def cuda_allocator_stats() -> Mapping[str, Any]:
    """This process's allocator counters; empty where CUDA was never used."""
    import torch

    if not torch.cuda.is_available() or not torch.cuda.is_initialized():
        return {}
    return torch.cuda.memory_stats()


@attrs.define
class AllocatorCounters:
    """``take`` returns the counters' growth since the previous ``take`` (or since creation)."""

    read_stats: Callable[[], Mapping[str, Any]] = cuda_allocator_stats
    _last: dict[str, int] = attrs.field(factory=dict, init=False)

    def take(self) -> dict[str, float]:
        stats = self.read_stats()
        if SEGMENTS_KEY not in stats:
            return {}
        now = {key: int(stats.get(key, 0)) for key in (SEGMENTS_KEY, RETRIES_KEY)}
        grown = {key: now[key] - self._last.get(key, 0) for key in now}
        self._last = now
        return {
            "gpu_segments_allocated_worker": float(grown[SEGMENTS_KEY]),
            "gpu_alloc_retries_worker": float(grown[RETRIES_KEY]),
        }
