"""Reading ``<run_dir>/metrics.jsonl`` (one JSON object per training step) and summarising it.

Keys read (written by the training core's metrics writer; any may be missing or null):
``step`` (int), ``time_step_s``, ``tokens_per_s``, ``loss``, ``reward_mean``,
``peak_gpu_mem_gb`` (null without a GPU), ``peak_host_rss_gb``.

Whatever the file holds, reading it never fails and never guesses silently: a line that is
not a JSON object with an integer ``step`` is skipped, a value that is not a finite number
(NaN, infinity, text) is left out of the numbers, and each skip is reported as a note. A
torn last line (the job is still writing it) is skipped without a note. Records are taken in
step order, so the summary does not depend on the order of the lines; a step written twice
(a requeued attempt redoing it) counts once, with its later line.
"""

from __future__ import annotations

import json
import math
from collections.abc import Sequence
from pathlib import Path
from typing import Any

import attrs

METRICS_FILE = "metrics.jsonl"
SUMMARISED_KEYS = (
    "time_step_s", "tokens_per_s", "peak_gpu_mem_gb", "peak_host_rss_gb", "loss", "reward_mean"
)  # fmt: skip
MAX_NOTED_LINES = 5


@attrs.frozen(kw_only=True)
class MetricsFile:
    """The usable records of a metrics file, in step order, and what was skipped reading it."""

    records: tuple[dict[str, Any], ...]
    notes: tuple[str, ...] = ()


def read_metrics_file(run_dir: Path) -> MetricsFile:
    path = Path(run_dir) / METRICS_FILE
    if not path.exists():
        return MetricsFile(records=())
    if not path.is_file():  # a folder, a FIFO: never opened (a FIFO would block)
        return MetricsFile(records=(), notes=(f"{path} is not a regular file; not read",))
    try:
        data = path.read_bytes()
    except OSError as error:
        return MetricsFile(records=(), notes=(f"{path}: cannot be read: {error.strerror}",))
    records, skipped = _parse_lines(data)
    notes = []
    if skipped:
        shown = "; ".join(skipped[:MAX_NOTED_LINES]) + (
            "; ..." if len(skipped) > MAX_NOTED_LINES else ""
        )
        notes.append(f"{path}: skipped {len(skipped)} unreadable line(s) ({shown})")
    ordered = _in_step_order(records)
    missing = missing_steps([record["step"] for record in ordered])
    if missing:
        notes.append(missing_steps_note(path, missing, ordered[-1]["step"], bool(skipped)))
    return MetricsFile(records=ordered, notes=tuple(notes))


def missing_steps(steps: Sequence[int]) -> list[tuple[int, int]]:
    """(first, last) of each run of training steps that has no line, between step 1 and the
    last step written (``steps`` in order; step 0 is validation before training). A job
    writes every step from 1 on; a resumed one rewrites those after its checkpoint."""
    gaps, expected = [], 1
    for step in (step for step in steps if step >= 1):
        if step > expected:
            gaps.append((expected, step - 1))
        expected = step + 1
    return gaps


def missing_steps_note(
    path: Path, gaps: list[tuple[int, int]], last: int, skipped_lines: bool
) -> str:
    count = sum(high - low + 1 for low, high in gaps)
    ranges = [str(low) if low == high else f"{low}-{high}" for low, high in gaps]
    shown = ", ".join(ranges[:MAX_NOTED_LINES]) + (", ..." if len(ranges) > MAX_NOTED_LINES else "")
    why = (
        "unreadable (see above) or"
        if skipped_lines
        else "the file was changed or cut while the job wrote it:"
    )
    return (
        f"{path}: lines are missing: {count:,} of the {last:,} steps up to step {last:,} have "
        f"none (steps {shown}), so the figures cover {last - count:,} steps; {why} the job's "
        "own log (hpcrl logs --driver) shows every step"
    )


def _parse_lines(data: bytes) -> tuple[list[dict[str, Any]], list[str]]:
    lines = data.removeprefix(b"\xef\xbb\xbf").split(b"\n")
    torn = len(lines) - 1 if lines[-1].strip() else None  # no newline after the last line yet
    records, skipped = [], []
    for number, raw in enumerate(lines, start=1):
        if not raw.strip():
            continue
        record, problem = _parse_line(raw)
        if problem is None:
            records.append(record)
        elif number - 1 != torn or problem != "not JSON":
            skipped.append(f"line {number}: {problem}")
    return records, skipped


def _parse_line(raw: bytes) -> tuple[dict[str, Any], str | None]:
    try:
        text = raw.decode("utf-8").strip()
    except UnicodeDecodeError:
        return {}, "not UTF-8"
    if "\x00" in text:
        return {}, "holds NUL bytes"
    try:
        record = json.loads(text)
    except (ValueError, RecursionError):  # ValueError: JSONDecodeError, too many digits
        return {}, "not JSON"
    if not isinstance(record, dict):
        return {}, f"a JSON {type(record).__name__}, not an object"
    step = record.get("step")
    if not isinstance(step, int) or isinstance(step, bool) or step < 0:
        return {}, f"no step number (step = {step!r:.20})"
    return record, None


def _in_step_order(records: list[dict[str, Any]]) -> tuple[dict[str, Any], ...]:
    by_step: dict[int, dict[str, Any]] = {}
    for record in records:  # file order: a step's later line wins
        by_step[record["step"]] = record
    return tuple(by_step[step] for step in sorted(by_step))


def read_metrics(run_dir: Path) -> list[dict[str, Any]]:
    """All usable step records of a run, in step order (see ``read_metrics_file``)."""
    return list(read_metrics_file(run_dir).records)


def last_metrics(run_dir: Path) -> dict[str, Any] | None:
    records = read_metrics_file(run_dir).records
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


def finite_number(value: Any) -> float | None:
    """``value`` as a float when it is a finite number (not a bool, NaN or infinity)."""
    if isinstance(value, bool) or not isinstance(value, int | float):
        return None
    try:
        number = float(value)
    except OverflowError:  # an integer beyond any float
        return None
    return number if math.isfinite(number) else None


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
