"""Summarising a run's step records (read by ``hpcrl.run.metrics_file``).

Keys summarised (any may be missing or null): ``time_step_s``, ``tokens_per_s``, ``loss``,
``reward_mean``, ``peak_gpu_mem_gb`` (null without a GPU), ``peak_host_rss_gb``. A value that
is not a finite number (NaN, infinity, text) is left out of the numbers and reported as a
note (``ignored_values``).
"""

from __future__ import annotations

import math
from collections.abc import Sequence
from typing import Any

import attrs

from hpcrl.run.metrics_file import finite_number

SUMMARISED_KEYS = (
    "time_step_s", "tokens_per_s", "peak_gpu_mem_gb", "peak_host_rss_gb", "loss", "reward_mean"
)  # fmt: skip


def percentile(values: Sequence[float], fraction: float) -> float:
    """Linear-interpolated percentile (numpy's default method), ``fraction`` in [0, 1]."""
    ordered = sorted(values)
    if not ordered:
        return math.nan
    position = fraction * (len(ordered) - 1)
    low = math.floor(position)
    high = min(low + 1, len(ordered) - 1)
    return ordered[low] + (ordered[high] - ordered[low]) * (position - low)


def _numbers(records: Sequence[dict[str, Any]], key: str) -> list[float]:
    numbers = (finite_number(record.get(key)) for record in records)
    return [number for number in numbers if number is not None]


def ignored_values(records: Sequence[dict[str, Any]]) -> list[str]:
    """What the summary leaves out, per key: NaN/infinite values and values that are not
    numbers (null means "not recorded" and is not counted)."""
    notes = []
    for key in SUMMARISED_KEYS:
        not_finite = [r["step"] for r in records if _is_non_finite(r.get(key))]
        not_numbers = [
            r["step"] for r in records
            if r.get(key) is not None and finite_number(r.get(key)) is None and not _is_non_finite(r.get(key))
        ]  # fmt: skip
        if not_finite:
            notes.append(
                f"ignored {len(not_finite)} NaN/infinite {key} value(s) (steps {_steps(not_finite)})"
            )
        if not_numbers:
            notes.append(
                f"ignored {len(not_numbers)} {key} value(s) that are not a number (steps {_steps(not_numbers)})"
            )
    return notes


def _is_non_finite(value: Any) -> bool:
    return isinstance(value, float) and not math.isfinite(value)


def _steps(steps: list[int]) -> str:
    return ", ".join(map(str, steps[:5])) + (", ..." if len(steps) > 5 else "")


def _last(values: list[float]) -> float | None:
    return values[-1] if values else None


def _maximum(values: list[float]) -> float | None:
    return max(values) if values else None


@attrs.frozen(kw_only=True)
class RunSummary:
    """One run's numbers for the report table (None where no step recorded the metric)."""

    num_steps: int
    last_step: int | None
    median_time_step_s: float | None
    p95_time_step_s: float | None
    median_tokens_per_s: float | None
    peak_gpu_mem_gb: float | None
    peak_host_rss_gb: float | None
    final_loss: float | None
    final_reward: float | None


def summarize(records: Sequence[dict[str, Any]]) -> RunSummary:
    """The summary of step records in step order (``read_metrics``): finite numbers only."""
    step_times = _numbers(records, "time_step_s")
    tokens = _numbers(records, "tokens_per_s")
    steps = _numbers(records, "step")
    return RunSummary(
        num_steps=len(records),
        last_step=int(steps[-1]) if steps else None,
        median_time_step_s=percentile(step_times, 0.5) if step_times else None,
        p95_time_step_s=percentile(step_times, 0.95) if step_times else None,
        median_tokens_per_s=percentile(tokens, 0.5) if tokens else None,
        peak_gpu_mem_gb=_maximum(_numbers(records, "peak_gpu_mem_gb")),
        peak_host_rss_gb=_maximum(_numbers(records, "peak_host_rss_gb")),
        final_loss=_last(_numbers(records, "loss")),
        final_reward=_last(_numbers(records, "reward_mean")),
    )
