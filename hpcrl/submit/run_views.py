"""What ``hpcrl logs`` and ``cancel`` do, from run folders alone (status: status_view)."""

from __future__ import annotations

import sys
from collections import Counter
from pathlib import Path

import attrs
from rich.console import Console

from hpcrl.config.errors import UserError
from hpcrl.submit.job_record import JobRecord, read_job_record
from hpcrl.submit.job_state import SacctWatcher, cancel_job, query_statuses
from hpcrl.submit.log_view import (
    LoggedRun,
    LogSelection,
    check_attempt,
    follow_logs,
    no_output_line,
    print_logs,
    runs_to_show,
)
from hpcrl.submit.shutdown_noise import write_cancel_note
from hpcrl.submit.sweep import SweepError, is_sweep_dir, read_sweep_record
from hpcrl.submit.waiting import default_wait_settings, jobs_end_check, why_waiting_ended


# --------------------------------------------------------------------------- logs
def show_logs(path: Path, selection: LogSelection, point: int | None, follow_job: bool) -> int:
    """``hpcrl logs``: print (or follow) the logs of a run, or of a sweep's points."""
    runs = runs_to_show(path, point)
    for run in runs:
        if selection.node is not None and not 0 <= selection.node < run.record.num_tasks:
            raise UserError(
                f"--node {selection.node}: job {run.record.job_id} has nodes "
                f"0..{run.record.num_tasks - 1}",
                fix="give one of those, or leave --node out for every node",
            )
    check_attempt(runs, selection)
    if follow_job:
        return _follow(runs, selection)
    if not print_logs(runs, selection, sys.stdout):
        print(no_output_line(runs, selection, path), file=sys.stderr)
    return 0


def _follow(runs: list[LoggedRun], selection: LogSelection) -> int:
    check = jobs_end_check([run.record for run in runs])
    ended: dict[int, str] = {}

    def is_over() -> bool:
        for index, state in enumerate(check()):
            if state is not None:
                ended.setdefault(index, state)
        return len(ended) == len(runs)

    follow_logs(runs, selection, is_over, default_wait_settings().poll_s, sys.stdout)
    for index, run in enumerate(runs):
        state = ended.get(index, "UNKNOWN")
        where = f"{run.point}: " if run.point else ""
        print(f"hpcrl logs: {where}job {run.record.job_id} {why_waiting_ended(state)}",
              file=sys.stderr)  # fmt: skip
    return 1 if any(state in ("LOST", "UNREACHABLE") for state in ended.values()) else 0


# --------------------------------------------------------------------------- cancel
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
