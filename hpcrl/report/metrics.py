"""Reading ``<run_dir>/metrics.jsonl`` (one JSON object per training step) and summarising it.

Keys read (written by the training core's metrics writer; any may be missing or null):
``step`` (int), ``time_step_s``, ``tokens_per_s``, ``loss``, ``reward_mean``,
``peak_gpu_mem_gb`` (null without a GPU), ``peak_host_rss_gb``.
"""

from __future__ import annotations

import json
import math
from collections.abc import Sequence
from pathlib import Path
from typing import Any

import attrs

METRICS_FILE = "metrics.jsonl"


class MetricsError(RuntimeError):
    """A metrics file that cannot be read (the message names the file and line)."""


def read_metrics(run_dir: Path) -> list[dict[str, Any]]:
    """All step records of a run, in file order. A torn last line (the job is still writing)
    is skipped; a bad line elsewhere is an error naming its line number."""
    path = Path(run_dir) / METRICS_FILE
    if not path.is_file():
        return []
    lines = path.read_text().splitlines()
    records = []
    for number, line in enumerate(lines, start=1):
        if not line.strip():
            continue
        try:
            record = json.loads(line)
        except json.JSONDecodeError as error:
            if number == len(lines):
                break
            raise MetricsError(f"{path}:{number}: not JSON ({error})") from None
        if not isinstance(record, dict):
            raise MetricsError(f"{path}:{number}: expected a JSON object, got {line[:60]!r}")
        records.append(record)
    return records


def last_metrics(run_dir: Path) -> dict[str, Any] | None:
    records = read_metrics(run_dir)
    return records[-1] if records else None


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
    values = (record.get(key) for record in records)
    return [
        float(value)
        for value in values
        if isinstance(value, int | float) and not isinstance(value, bool)
    ]


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
