"""``hpcrl submit --wait``: follow a job to its end with one live progress line.

queued (with Slurm's reason) → running → Ray ready (``status/ray_ready`` of the current
attempt) → training step N/M (the last line of ``metrics.jsonl``) → done. On a terminal the
line updates in place; elsewhere (CI logs, pipes) one line per change of phase, plus the
current line again every ``heartbeat_s`` (new training steps alone do not print). Never
hangs: the loop ends when the scheduler reports a final state (or the scheduler forgot the
job), and a job without a result is reported as failed with the tail of its logs.
"""

from __future__ import annotations

import json
import time
from collections.abc import Callable
from pathlib import Path
from typing import Any

import attrs
from rich.console import Console

from hpcrl.report.metrics import last_metrics
from hpcrl.submit.job_record import JobRecord
from hpcrl.submit.job_state import (
    JobOutcome,
    JobStatus,
    query_status,
    read_outcome,
    results_written,
)
from hpcrl.submit.logs import list_log_files, read_log, tail_lines

#: A job the scheduler has never heard of for this long after submission is lost.
UNKNOWN_GRACE_S = 60.0
LOG_TAIL_LINES = 20
TAILED_NODE_LOGS = ("node.log", "driver.log")


@attrs.frozen(kw_only=True)
class WaitSettings:
    poll_s: float = 2.0
    unknown_grace_s: float = UNKNOWN_GRACE_S
    sacct_lag_s: float = 10.0  # results written but sacct still says RUNNING: trust the results
    unreachable_grace_s: float = 300.0  # sacct failing this long: stop waiting, say so
    heartbeat_s: float = 60.0  # without a terminal: the line again after this long unchanged


def ray_ready(run_dir: Path, attempt: int) -> bool:
    """The node entrypoint's ``status/ray_ready`` marker, written by this attempt."""
    try:
        marker = json.loads((run_dir / "status" / "ray_ready").read_text())
    except (OSError, json.JSONDecodeError):
        return False
    # attempt id is "<job id>.<SLURM_RESTART_COUNT>"; older attempts' markers are stale
    return str(marker.get("attempt", "")).rpartition(".")[2] == str(attempt - 1)


def describe_progress(run_dir: Path, status: JobStatus, max_steps: int | None) -> str:
    """One line: where the job is now."""
    return progress_of(run_dir, status, max_steps)[1]


def progress_of(run_dir: Path, status: JobStatus, max_steps: int | None) -> tuple[str, str]:
    """(phase, line): the line says where the job is; a new phase is worth a printed line."""
    attempt = f" (attempt {status.attempts})" if status.attempts > 1 else ""
    if status.state == "PENDING" or status.state == "UNKNOWN":
        reason = f" (reason: {status.reason})" if status.reason else ""
        return "queued" + reason + attempt, f"queued{reason}{attempt}"
    if status.is_final:
        return status.state + attempt, f"{status.state.lower()}{attempt}"
    metrics = last_metrics(run_dir)
    if metrics is not None:
        text = f"training step {_step_text(metrics, max_steps)}{_metric_text(metrics)}{attempt}"
        return "training" + attempt, text
    if ray_ready(run_dir, status.attempts):
        return "ray ready" + attempt, f"Ray ready, driver starting{attempt}"
    return "running" + attempt, f"running, starting Ray{attempt}"


def _step_text(metrics: dict[str, Any], max_steps: int | None) -> str:
    step = metrics.get("step", "?")
    return f"{step}/{max_steps}" if max_steps else f"{step}"


def _metric_text(metrics: dict[str, Any]) -> str:
    parts = [
        f"{label} {metrics[name]:.4g}"
        for name, label in (("reward_mean", "reward"), ("loss", "loss"))
        if isinstance(metrics.get(name), int | float)
    ]
    return (" · " + " · ".join(parts)) if parts else ""


def wait_for_job(
    run_dir: Path,
    record: JobRecord,
    console: Console,
    max_steps: int | None = None,
    settings: WaitSettings = WaitSettings(),
    clock: Callable[[], float] = time.monotonic,
    sleep: Callable[[float], None] = time.sleep,
) -> JobOutcome:
    """Show progress until the job ends; return how it ended (printing the failure).

    On a terminal one live line; otherwise (CI logs, pipes) a line per phase and heartbeats.
    """
    watch = _Watch(record, settings, clock=clock)
    first = f"job {record.job_id}: submitted"
    with _ProgressLine(console, first, settings.heartbeat_s, clock) as progress:
        while True:
            status = watch.poll()
            phase, line = progress_of(run_dir, status, max_steps)
            if status.scheduler_error:
                phase += " · scheduler not answering"
                line += f" · scheduler not answering ({status.scheduler_error})"
            progress.update(phase, f"job {record.job_id}: {line}")
            if watch.ended(status):
                break
            sleep(settings.poll_s)
    status = watch.final_status(status)
    outcome = read_outcome(record, run_dir, status)
    report_outcome(run_dir, record, status, outcome, console)
    return outcome


class _ProgressLine:
    """A rich spinner line on a terminal; elsewhere plain lines stamped with the time waited,
    one per new phase and one per ``heartbeat_s`` without one."""

    def __init__(
        self, console: Console, first: str, heartbeat_s: float, clock: Callable[[], float]
    ) -> None:
        self._console = console
        self._status = console.status(first) if console.is_terminal else None
        self._clock = clock
        self._heartbeat_s = heartbeat_s
        self._started_s = self._printed_s = clock()
        self._phase: str | None = None

    def __enter__(self) -> _ProgressLine:
        if self._status is not None:
            self._status.__enter__()
        return self

    def __exit__(self, *exc_info: object) -> None:
        if self._status is not None:
            self._status.__exit__(*exc_info)

    def update(self, phase: str, text: str) -> None:
        now_s = self._clock()
        if self._status is not None:
            self._status.update(f"{text} · {_duration(now_s - self._started_s)}")
        elif phase != self._phase or now_s - self._printed_s >= self._heartbeat_s:
            self._console.print(
                f"[{_duration(now_s - self._started_s):>7}] {text}",
                markup=False, highlight=False, soft_wrap=True,
            )  # fmt: skip
            self._printed_s = now_s
        self._phase = phase


def _duration(seconds: float) -> str:
    """``42s``, ``12m05s``, ``3h07m``: short enough to scan in a log."""
    seconds = int(seconds)
    if seconds < 60:
        return f"{seconds}s"
    if seconds < 3600:
        return f"{seconds // 60}m{seconds % 60:02d}s"
    return f"{seconds // 3600}h{seconds % 3600 // 60:02d}m"


@attrs.define
class _Watch:
    """When to stop waiting: a final scheduler state; all results written (sacct lagging or
    down); a job the scheduler never heard of; a scheduler unreachable for too long."""

    record: JobRecord
    settings: WaitSettings
    clock: Callable[[], float] = time.monotonic
    unknown_since_s: float | None = None
    unreachable_since_s: float | None = None
    results_since_s: float | None = None
    reason: str = ""

    def poll(self) -> JobStatus:
        return query_status(self.record)

    def ended(self, status: JobStatus) -> bool:
        now = self.clock()
        if status.is_final:
            return True
        self.unreachable_since_s = _since(
            self.unreachable_since_s, now, bool(status.scheduler_error)
        )
        self.unknown_since_s = _since(self.unknown_since_s, now, status.state == "UNKNOWN")
        self.results_since_s = _since(self.results_since_s, now, results_written(self.record))
        if self._longer_than(self.results_since_s, now, self.settings.sacct_lag_s):
            self.reason = "RESULTS"
        elif self._longer_than(self.unknown_since_s, now, self.settings.unknown_grace_s):
            self.reason = "LOST"
        elif self._longer_than(self.unreachable_since_s, now, self.settings.unreachable_grace_s):
            self.reason = "UNREACHABLE"
        return bool(self.reason)

    def final_status(self, status: JobStatus) -> JobStatus:
        if self.reason == "RESULTS":
            return attrs.evolve(status, state="ENDED")
        return attrs.evolve(status, state=self.reason) if self.reason else status

    @staticmethod
    def _longer_than(since_s: float | None, now: float, limit_s: float) -> bool:
        return since_s is not None and now - since_s > limit_s


def _since(since_s: float | None, now: float, condition: bool) -> float | None:
    """When ``condition`` started holding (None while it does not)."""
    if not condition:
        return None
    return now if since_s is None else since_s


def report_outcome(
    run_dir: Path, record: JobRecord, status: JobStatus, outcome: JobOutcome, console: Console
) -> None:
    if outcome.exit_code == 0:
        console.print(f"[green]done[/]: job {record.job_id} {status.state}, exit code 0")
        return
    if status.state == "UNREACHABLE":
        console.print(
            f"[bold yellow]stopped waiting[/]: the scheduler has not answered for a while "
            f"({status.scheduler_error}); job {record.job_id} may still run. "
            f"Check later: hpcrl status {run_dir}",
            soft_wrap=True,
        )
        return
    console.print(
        f"[bold red]FAILED[/]: job {record.job_id} {status.state}, exit code {outcome.exit_code}"
        + (f" ({outcome.detail.splitlines()[0]})" if outcome.detail else "")
    )
    print_log_tails(run_dir, record, console)


def print_log_tails(run_dir: Path, record: JobRecord, console: Console) -> None:
    """The last lines of each node's error stream, node log and driver log."""
    for log in list_log_files(run_dir, record):
        if log.label != "stderr" and Path(log.label).name not in TAILED_NODE_LOGS:
            continue
        text = tail_lines(read_log(log.path), LOG_TAIL_LINES)
        if text.strip():
            console.rule(f"node {log.node} {log.label}: {log.path}", style="dim")
            console.print(text.rstrip("\n"), markup=False, highlight=False, soft_wrap=True)
