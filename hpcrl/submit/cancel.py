"""What ``hpcrl cancel`` does, from run folders alone: a run's job, or a sweep's array and
every point's own job."""

from __future__ import annotations

from collections import Counter
from pathlib import Path

import attrs
from rich.console import Console

from hpcrl.run.job_record import JobRecord, read_job_record
from hpcrl.run.sweep_record import SweepError, is_sweep_dir, read_sweep_record
from hpcrl.submit.job_state import SacctWatcher, cancel_job, query_statuses
from hpcrl.submit.shutdown_noise import write_cancel_note


def cancel_run(path: Path, console: Console, watcher: SacctWatcher | None = None) -> int:
    """Cancel a run's job; for a sweep folder, the whole array and every point's own job.
    Only a job that is the record's own (id and submit time/cluster) is cancelled."""
    if is_sweep_dir(path):
        return _cancel_sweep(path, console, watcher)
    record = read_job_record(path)
    status = query_statuses([record], watcher)[0]
    if status.is_final:
        console.print(f"Job {record.job_id} already ended ({status.state}); nothing to cancel")
        if status.stale:
            console.print(status.stale, markup=False, soft_wrap=True)
        return 0
    write_cancel_note(path, record, record.attempt_offset + status.attempts)  # who, when
    cancel_job(record)
    console.print(f"Cancelled job {record.job_id} ({path})", markup=False, highlight=False)
    return 0


def _cancel_sweep(path: Path, console: Console, watcher: SacctWatcher | None = None) -> int:
    """The array job, then each point whose job is no task of it: one ``hpcrl resume``
    submitted as a job of its own (a local sweep's points are all such jobs)."""
    sweep = read_sweep_record(path)
    if not sweep.points:
        raise SweepError(f"{path}: the sweep has no points", fix="nothing to cancel")
    points = [path / point.run_dir_name for point in sweep.points]
    records = {point: read_job_record(point) for point in points if (point / "job.json").is_file()}
    if not records:
        raise SweepError(f"{path}: no point of the sweep was submitted", fix="nothing to cancel")
    array_id = sweep.array_job_id
    tasks = {point: record for point, record in records.items() if record.array_job_id == array_id}
    if array_id is not None and tasks:
        _cancel_array(path, array_id, tasks, len(sweep.points), console, watcher)
    for point, record in records.items():
        if array_id is None or record.array_job_id != array_id:
            cancel_run(point, console, watcher)
    return 0


def _cancel_array(
    path: Path,
    array_id: str,
    task_records: dict[Path, JobRecord],
    num_points: int,
    console: Console,
    watcher: SacctWatcher | None,
) -> None:
    """``scancel`` the array only while its tasks are the points' own jobs (id and submit
    time/cluster, as for one run) and one of them has not ended."""
    tasks = list(task_records.values())
    statuses = query_statuses(tasks, watcher)
    stale = next((status.stale for status in statuses if status.state == "STALE"), None)
    if stale is not None:
        console.print(f"Not cancelling job array {array_id} of {path}: {stale}",
                      markup=False, soft_wrap=True)  # fmt: skip
        return
    if all(status.is_final for status in statuses):
        states = Counter(status.state for status in statuses)
        ended = ", ".join(f"{count} {state}" for state, count in states.items())
        console.print(f"Job array {array_id} of {path} already ended ({ended}); nothing to "
                      "cancel", markup=False, soft_wrap=True)  # fmt: skip
        return
    for (point, record), status in zip(task_records.items(), statuses, strict=True):
        if not status.is_final:
            write_cancel_note(point, record, record.attempt_offset + status.attempts)
    cancel_job(attrs.evolve(tasks[0], job_id=array_id))
    console.print(f"Cancelled job array {array_id} ({num_points} points) of {path}",
                  markup=False, highlight=False)  # fmt: skip
