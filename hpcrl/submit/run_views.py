"""What ``hpcrl logs`` and ``cancel`` do, from run folders alone (status: status_view)."""

from __future__ import annotations

import sys
from pathlib import Path

import attrs
from rich.console import Console

from hpcrl.config.errors import UserError
from hpcrl.submit.job_record import read_job_record
from hpcrl.submit.job_state import (
    SacctWatcher,
    cancel_job,
    query_status,
)
from hpcrl.submit.log_view import (
    LoggedRun,
    LogSelection,
    check_attempt,
    follow_logs,
    no_output_line,
    print_logs,
    runs_to_show,
)
from hpcrl.submit.sweep import SweepError, is_sweep_dir, read_sweep_record
from hpcrl.submit.waiting import default_wait_settings, job_end_check, why_waiting_ended


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
        print(no_output_line(runs, selection, str(path)), file=sys.stderr)
    return 0


def _follow(runs: list[LoggedRun], selection: LogSelection) -> int:
    watcher = SacctWatcher()
    checks = [job_end_check(run.record, watcher=watcher) for run in runs]
    ended: dict[int, str] = {}

    def is_over() -> bool:
        for index, check in enumerate(checks):
            if index not in ended and (state := check()) is not None:
                ended[index] = state
        return len(ended) == len(runs)

    follow_logs(runs, selection, is_over, default_wait_settings().poll_s, sys.stdout)
    for index, run in enumerate(runs):
        state = ended.get(index, "UNKNOWN")
        where = f"{run.point}: " if run.point else ""
        print(f"hpcrl logs: {where}job {run.record.job_id} {why_waiting_ended(state)}",
              file=sys.stderr)  # fmt: skip
    return 1 if any(state in ("LOST", "UNREACHABLE") for state in ended.values()) else 0


# --------------------------------------------------------------------------- cancel
def cancel_run(path: Path, console: Console) -> int:
    """Cancel a run's job; for a sweep folder, the whole array."""
    if is_sweep_dir(path):
        sweep = read_sweep_record(path)
        if not sweep.points:
            raise SweepError(f"{path}: the sweep has no points", fix="nothing to cancel")
        first = read_job_record(path / sweep.points[0].run_dir_name)
        if first.executor == "local":  # a local sweep: one job per point, not an array
            for point in sweep.points:
                if (path / point.run_dir_name / "job.json").is_file():
                    cancel_run(path / point.run_dir_name, console)
            return 0
        record = attrs.evolve(first, job_id=first.array_job_id)
        cancel_job(record)
        console.print(f"Cancelled job array {record.job_id} ({len(sweep.points)} points) of {path}")
        return 0
    record = read_job_record(path)
    status = query_status(record)
    if status.is_final:
        console.print(f"Job {record.job_id} already ended ({status.state}); nothing to cancel")
        if status.stale:
            console.print(status.stale, markup=False, soft_wrap=True)
        return 0
    cancel_job(record)
    console.print(f"Cancelled job {record.job_id} ({path})")
    return 0
