"""Memory peaks per step (the driver's and its workers'), compile figures, and the one
progress line per step (the step records themselves
go to ``metrics.jsonl`` through ``hpcrl.run.metrics_file.MetricsWriter``)."""

from __future__ import annotations

from collections.abc import Mapping, Sequence
from typing import Any

BYTES_PER_GB = 2**30


class HostMemoryTracker:
    """Peak resident memory of this process plus its child processes, sampled per step.

    The kernel's high-water mark (VmHWM) covers this process between samples; children are
    counted at their current RSS when sampled.
    """

    def __init__(self) -> None:
        self.peak_bytes = 0

    def sample(self) -> float:
        """Update and return the peak in GB."""
        import psutil

        process = psutil.Process()
        total = max(_self_high_water_bytes(), process.memory_info().rss)
        for child in process.children(recursive=True):
            try:
                total += child.memory_info().rss
            except psutil.Error:  # exited between listing and reading
                continue
        self.peak_bytes = max(self.peak_bytes, total)
        return self.peak_bytes / BYTES_PER_GB


def _self_high_water_bytes() -> int:
    try:
        with open("/proc/self/status", encoding="ascii") as handle:
            for line in handle:
                if line.startswith("VmHWM:"):
                    return int(line.split()[1]) * 1024
    except OSError:
        pass
    return 0


COMPILE_KEYS = (
    "compile_cache_hits",
    "compile_cache_misses",
    "compile_cache_bypasses",
    "compile_time_s",
    "aot_loads",
    "aot_builds",
    "aot_guard_rejections",
)
STALL_KEYS = (
    "time_gc_worker_s",
    "gc_full_collections_worker",
    "gpu_segments_allocated_worker",
    "gpu_alloc_retries_worker",
)


def _most_of_any_rank(states: Sequence[Mapping[str, Any]], keys: Sequence[str]) -> dict[str, float]:
    """Each of ``keys`` that some rank reported: the largest value any rank gave."""
    return {
        key: max(float(s[key]) for s in states if key in s)
        for key in keys
        if any(key in s for s in states)
    }


def step_memory_metrics(
    states: Sequence[Mapping[str, Any]], memory: HostMemoryTracker
) -> dict[str, float | None]:
    """A step record's memory and compile figures from the workers' ``collect_state()``
    (``states``, rank order) and the driver's own ``memory``: memory peaks,
    torch.compile's graph count so far (a rise after the first steps is a recompilation
    stall), its caches' hits and misses and the seconds it took so far
    (``hpcrl.core.compile_stats``), the most any rank's garbage collector ran and its
    allocator went to CUDA since the last step (``hpcrl.core.collection_clock``,
    ``hpcrl.core.workers.allocator_counters``), and rank 0's figures of this step's train and log-prob
    passes (``hpcrl.core.backends.pass_stats``)."""
    peaks = [float(s.get("peak_memory_gb", 0.0)) for s in states]
    peak_gpu_gb = max(peaks) if peaks and max(peaks) > 0 else None
    worker_rss = [float(s["peak_host_rss_gb"]) for s in states if "peak_host_rss_gb" in s]
    graphs = [float(s["compiled_graphs"]) for s in states if "compiled_graphs" in s]
    # the rank that compiled most (ranks compile the same graphs)
    cache = _most_of_any_rank(states, COMPILE_KEYS)
    # the rank that collected or allocated most: the others wait for it at the next collective
    busiest = _most_of_any_rank(states, STALL_KEYS)
    driver_gb = memory.sample()
    passes = dict(states[0].get("pass_metrics") or {}) if states else {}
    return {
        "peak_gpu_mem_gb": peak_gpu_gb,
        "peak_host_rss_gb": driver_gb + sum(worker_rss),
        "peak_host_rss_driver_gb": driver_gb,
        "compiled_graphs": max(graphs) if graphs else None,
        **cache,
        **busiest,
        **passes,
    }


def format_progress(step: int, num_steps: int, record: Mapping[str, Any]) -> str:
    """One readable line per step, e.g.
    ``step 3/20  reward 0.41±0.12  loss 0.0123  gen 1.2s  lp 0.3s  train 0.8s  412 tok/s``."""
    parts = [f"step {step}/{num_steps}"]
    if "reward_mean" in record:
        parts.append(f"reward {record['reward_mean']:.3f}±{record['reward_std']:.3f}")
    parts.append(f"loss {record['loss']:.4f}")
    if record.get("kl") is not None:
        parts.append(f"kl {record['kl']:.4f}")
    parts.append(f"gnorm {record['grad_norm']:.3f}")
    for key, label in (
        ("time_generate_s", "gen"),
        ("time_logprobs_s", "lp"),
        ("time_train_s", "train"),
    ):
        if key in record:
            parts.append(f"{label} {record[key]:.1f}s")
    if "generated_tokens_per_s" in record:
        parts.append(f"{record['generated_tokens_per_s']:.0f} gen tok/s")
    parts.append(f"{record['tokens_per_s']:.0f} tok/s")
    for key in ("val_reward_mean", "val_loss"):
        if key in record:
            parts.append(f"{key.removesuffix('_mean')} {record[key]:.4f}")
    return "  ".join(parts)
