"""What ``hpcrl status``, ``logs`` and ``cancel`` show, from run folders alone."""

from __future__ import annotations

import sys
from collections.abc import Sequence
from pathlib import Path

import attrs
from rich.console import Console

from hpcrl.config.errors import UserError
from hpcrl.report.metrics import last_metrics
from hpcrl.submit.job_record import JobRecord, RunFolderError, read_job_record
from hpcrl.submit.job_state import (
    SacctWatcher,
    cancel_job,
    failure_cause,
    query_status,
    query_statuses,
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


def collect_run_dirs(paths: Sequence[Path], runs_dir: Path) -> list[tuple[str, Path]]:
    """(display name, run folder) for the given folders, or for every run under ``runs_dir``;
    a sweep folder stands for its points (an unreadable sweep for itself: its row says why)."""
    if not paths:
        if not runs_dir.is_dir():
            return []
        paths = sorted(
            path
            for path in runs_dir.iterdir()
            if (path / "job.json").exists() or is_sweep_dir(path)
        )
    found = []
    for path in paths:
        try:
            points = read_sweep_record(path).points if is_sweep_dir(path) else None
        except SweepError:
            points = None
        if points is None:
            found.append((path.name or str(path), path))
        else:
            found += [(f"{path.name}/{p.run_dir_name}", path / p.run_dir_name) for p in points]
    return found


def format_elapsed(seconds: float | None) -> str:
    if seconds is None:
        return ""
    minutes, secs = divmod(int(seconds), 60)
    hours, minutes = divmod(minutes, 60)
    return f"{hours}:{minutes:02d}:{secs:02d}"


#: States in which a job's named failure (status/node<k>.failed) is worth showing.
_NOT_FAILED = frozenset({"PENDING", "RUNNING", "COMPLETED", "UNKNOWN", "REQUEUED", "SUSPENDED"})


def status_rows(run_dirs: Sequence[tuple[str, Path]]) -> tuple[list[tuple[str, ...]], list[str]]:
    """One row per run (run, job, state, attempts, step, reward, elapsed, cause: why a failed
    job failed, when a node of it said so) and a note per run that could not be read, saying
    why. One scheduler query answers for all the runs."""
    records: dict[int, JobRecord] = {}
    problems: dict[int, str] = {}
    notes: list[str] = []
    for index, (name, run_dir) in enumerate(run_dirs):
        try:
            if is_sweep_dir(run_dir):  # listed as itself: its sweep.json is unreadable
                read_sweep_record(run_dir)
            records[index] = read_job_record(run_dir)
        except (RunFolderError, SweepError) as error:
            problems[index] = getattr(error, "short", "bad sweep.json")
            notes.append(f"{name}: {error.one_line()}")
    statuses = dict(zip(records, query_statuses(list(records.values())), strict=True))
    rows = []
    for index, (name, run_dir) in enumerate(run_dirs):
        if index in problems:
            rows.append((name, "", problems[index], "", "", "", "", ""))
            continue
        record, status = records[index], statuses[index]
        metrics = last_metrics(run_dir) or {}
        reward = metrics.get("reward_mean")
        state = status.state + (" (scheduler not answering)" if status.scheduler_error else "")
        cause = "" if status.state in _NOT_FAILED else (failure_cause(run_dir) or "")
        rows.append((
            name, record.job_id, state, str(status.attempts), str(metrics.get("step", "")),
            f"{reward:.4g}" if isinstance(reward, int | float) else "",
            format_elapsed(status.elapsed_s), cause,
        ))  # fmt: skip
    return rows, notes


def status_row(name: str, run_dir: Path) -> tuple[str, ...]:
    """run, job, state, attempts, step, reward, elapsed, cause (see ``status_rows``)."""
    return status_rows([(name, run_dir)])[0][0]


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
        return 0
    cancel_job(record)
    console.print(f"Cancelled job {record.job_id} ({path})")
    return 0
