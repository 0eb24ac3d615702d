"""The allocator's trips to CUDA per step (``hpcrl.core.workers.allocator_counters``): growth
between takes, nothing where CUDA was never used (this machine). The counters' source on a
GPU is ``torch.cuda.memory_stats()``; here a scripted sequence of such cumulative readings
stands in for it (no CUDA on this machine; the real source runs in tests/gpu's jobs)."""

from __future__ import annotations

from tests.require import require_module

require_module("torch")

from hpcrl.core.workers.allocator_counters import (  # noqa: E402
    RETRIES_KEY,
    SEGMENTS_KEY,
    AllocatorCounters,
    cuda_allocator_stats,
)


def test_each_take_gives_the_growth_since_the_last_one() -> None:
    readings = iter([
        {SEGMENTS_KEY: 40, RETRIES_KEY: 0, "other": 7},  # the end of setup
        {SEGMENTS_KEY: 52, RETRIES_KEY: 1},  # step 1: new sizes
        {SEGMENTS_KEY: 52, RETRIES_KEY: 1},  # step 2: all cached
    ])  # fmt: skip
    counters = AllocatorCounters(read_stats=lambda: next(readings))
    counters.take()
    assert counters.take() == {
        "gpu_segments_allocated_worker": 12.0,
        "gpu_alloc_retries_worker": 1.0,
    }
    assert counters.take() == {
        "gpu_segments_allocated_worker": 0.0,
        "gpu_alloc_retries_worker": 0.0,
    }


def test_a_process_without_cuda_reports_nothing() -> None:
    assert cuda_allocator_stats() == {}
    assert AllocatorCounters().take() == {}
