"""What ``hpcrl status``, ``logs`` and ``cancel`` show, from run folders alone."""

from __future__ import annotations

import sys
from collections.abc import Sequence
from pathlib import Path

import attrs
from rich.console import Console

from hpcrl.report.metrics import MetricsError, last_metrics
from hpcrl.submit.job_record import RunFolderError, read_job_record
from hpcrl.submit.job_state import cancel_job, failure_cause, query_status
from hpcrl.submit.logs import LogFile, follow, list_log_files, read_log
from hpcrl.submit.sweep import is_sweep_dir, read_sweep_record


def collect_run_dirs(paths: Sequence[Path], runs_dir: Path) -> list[tuple[str, Path]]:
    """(display name, run folder) for the given folders, or for every run under ``runs_dir``;
    a sweep folder stands for its points."""
    if not paths:
        if not runs_dir.is_dir():
            return []
        paths = sorted(
            path
            for path in runs_dir.iterdir()
            if (path / "job.json").is_file() or is_sweep_dir(path)
        )
    found = []
    for path in paths:
        if is_sweep_dir(path):
            sweep = read_sweep_record(path)
            found += [
                (f"{path.name}/{p.run_dir_name}", path / p.run_dir_name) for p in sweep.points
            ]
        else:
            found.append((path.name, path))
    return found


def format_elapsed(seconds: float | None) -> str:
    if seconds is None:
        return ""
    minutes, secs = divmod(int(seconds), 60)
    hours, minutes = divmod(minutes, 60)
    return f"{hours}:{minutes:02d}:{secs:02d}"


#: States in which a job's named failure (status/node<k>.failed) is worth showing.
_NOT_FAILED = frozenset({"PENDING", "RUNNING", "COMPLETED", "UNKNOWN", "REQUEUED", "SUSPENDED"})


def status_row(name: str, run_dir: Path) -> tuple[str, ...]:
    """run, job, state, attempts, step, reward, elapsed, cause (why a failed job failed, when
    a node of it said so: a preflight or bootstrap failure)."""
    try:
        record = read_job_record(run_dir)
    except RunFolderError:
        return (name, "", "not submitted", "", "", "", "", "")
    status = query_status(record)
    cause = "" if status.state in _NOT_FAILED else (failure_cause(run_dir) or "")
    try:
        metrics = last_metrics(run_dir) or {}
    except MetricsError as error:
        metrics = {"step": f"bad metrics: {error}"}
    reward = metrics.get("reward_mean")
    return (
        name,
        record.job_id,
        status.state,
        str(status.attempts),
        str(metrics.get("step", "")),
        f"{reward:.4g}" if isinstance(reward, int | float) else "",
        format_elapsed(status.elapsed_s),
        cause,
    )


# --------------------------------------------------------------------------- logs
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
        print(
            f"hpcrl logs: {run_dir} is a sweep; give one point folder ({points})", file=sys.stderr
        )
        return 2
    record = read_job_record(run_dir)
    if node is not None and not 0 <= node < record.num_tasks:
        print(
            f"hpcrl logs: --node {node}: the job has nodes 0..{record.num_tasks - 1}",
            file=sys.stderr,
        )
        return 2
    if follow_job:
        chunks = follow(
            lambda: _select(list_log_files(run_dir, record, node), attempt),
            lambda: query_status(record).is_final,
        )
        for log, text in chunks:
            prefix = f"[node{log.node} {log.label}] "
            sys.stdout.write("".join(prefix + line for line in text.splitlines(keepends=True)))
            sys.stdout.flush()
        return 0
    for log in _select(list_log_files(run_dir, record, node), attempt):
        text = read_log(log.path, attempt if log.label in ("stdout", "stderr") else None)
        if text:
            print(f"==> node {log.node} {log.label}: {log.path} <==")
            sys.stdout.write(text if text.endswith("\n") else text + "\n")
    return 0


# --------------------------------------------------------------------------- cancel
def cancel_run(path: Path, console: Console) -> int:
    """Cancel a run's job; for a sweep folder, the whole array."""
    if is_sweep_dir(path):
        sweep = read_sweep_record(path)
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
