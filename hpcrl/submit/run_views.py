"""What ``hpcrl status``, ``logs`` and ``cancel`` show, from run folders alone."""

from __future__ import annotations

import sys
from collections.abc import Sequence
from pathlib import Path

import attrs
from rich.console import Console

from hpcrl.causes import latest_cause, read_causes
from hpcrl.config.errors import UserError
from hpcrl.report.metrics import last_metrics
from hpcrl.submit.job_record import JobRecord, RunFolderError, read_job_record
from hpcrl.submit.job_state import (
    JobStatus,
    cancel_job,
    failure_cause,
    query_status,
    query_statuses,
)
from hpcrl.submit.logs import LogFile, fold_state_dumps, follow, list_log_files, read_log
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
        cause = status_cause(run_dir, status)
        rows.append((
            name, record.job_id, state, str(status.attempts), str(metrics.get("step", "")),
            f"{reward:.4g}" if isinstance(reward, int | float) else "",
            format_elapsed(status.elapsed_s), cause,
        ))  # fmt: skip
    return rows, notes


def status_cause(run_dir: Path, status: JobStatus) -> str:
    """The cause cell: why a failed job failed (its newest attempt, ``failure_cause``); for a
    job that goes on or completed after a requeue, why its previous attempt ended."""
    if status.state not in _NOT_FAILED:
        line = failure_cause(run_dir) or ""
        return f"attempt {status.attempts}: {line}" if line and status.attempts > 1 else line
    cause = latest_cause(run_dir)
    if cause is None or cause.attempt >= status.attempts - 1 + int(status.state == "REQUEUED"):
        return ""  # none, or the current attempt's own (a stale reading)
    return cause.titled_line()


def status_row(name: str, run_dir: Path) -> tuple[str, ...]:
    """run, job, state, attempts, step, reward, elapsed, cause (see ``status_rows``)."""
    return status_rows([(name, run_dir)])[0][0]


# --------------------------------------------------------------------------- logs
def attempt_cause_lines(run_dir: Path, attempt: int | None = None) -> list[str]:
    """``attempt 1: <cause>`` for every attempt that ended early (only ``attempt``, counted
    from 1, when given)."""
    return [
        cause.titled_line()
        for cause in read_causes(run_dir)
        if attempt is None or cause.attempt == attempt - 1
    ]


def _select(logs: list[LogFile], attempt: int | None) -> list[LogFile]:
    """Node logs live under logs/node<k>/attempt<r>/ with r = attempt - 1 (Slurm's restart count)."""
    if attempt is None:
        return logs
    submitit_labels = ("stdout", "stderr")
    return [
        log
        for log in logs
        if log.label in submitit_labels or log.label.startswith(f"attempt{attempt - 1}/")
    ]


def print_logs(run_dir: Path, node: int | None, attempt: int | None, follow_job: bool) -> int:
    if is_sweep_dir(run_dir):
        points = ", ".join(p.run_dir_name for p in read_sweep_record(run_dir).points)
        raise RunFolderError(f"{run_dir} is a sweep", fix=f"give one point folder ({points})")
    record = read_job_record(run_dir)
    if node is not None and not 0 <= node < record.num_tasks:
        raise UserError(
            f"--node {node}: job {record.job_id} has nodes 0..{record.num_tasks - 1}",
            fix="give one of those, or leave --node out for every node",
        )
    if attempt is not None and attempt < 1:
        raise UserError(f"--attempt {attempt}: attempts count from 1", fix="e.g. --attempt 1")
    if follow_job:
        return _follow_logs(run_dir, record, node, attempt)
    printed = False
    for log in _select(list_log_files(run_dir, record, node), attempt):
        text = read_log(log.path, attempt if log.label in ("stdout", "stderr") else None)
        if text:
            print(f"==> node {log.node} {log.label}: {log.path} <==")
            text = fold_state_dumps(text, log.path)
            sys.stdout.write(text if text.endswith("\n") else text + "\n")
            printed = True
    for line in attempt_cause_lines(run_dir, attempt):
        print(f"==> hpcrl: {line} <==")
    if not printed:
        where = f"attempt {attempt} of " if attempt else ""
        print(f"hpcrl logs: no output yet from {where}job {record.job_id} (queued, or just "
              f"started: hpcrl logs -f {run_dir} waits for it)", file=sys.stderr)  # fmt: skip
    return 0


def _follow_logs(run_dir: Path, record: JobRecord, node: int | None, attempt: int | None) -> int:
    end = job_end_check(record)
    ended: list[str] = []

    def is_over() -> bool:
        state = end()
        if state is not None:
            ended.append(state)
        return state is not None

    settings = default_wait_settings()
    chunks = follow(
        lambda: _select(list_log_files(run_dir, record, node), attempt), is_over, settings.poll_s
    )
    for log, text in chunks:
        prefix = f"[node{log.node} {log.label}] "
        text = fold_state_dumps(text, log.path)
        sys.stdout.write("".join(prefix + line for line in text.splitlines(keepends=True)))
        sys.stdout.flush()
    for line in attempt_cause_lines(run_dir, attempt):
        print(f"hpcrl logs: {line}", file=sys.stderr)
    state = ended[-1] if ended else "UNKNOWN"
    print(f"hpcrl logs: job {record.job_id} {why_waiting_ended(state)}", file=sys.stderr)
    return 0 if state not in ("LOST", "UNREACHABLE") else 1


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
