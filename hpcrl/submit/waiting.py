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
from collections import Counter
from collections.abc import Callable, Sequence
from pathlib import Path
from typing import Any

import attrs
from rich.console import Console

from hpcrl.causes import read_causes
from hpcrl.report.metrics import last_metrics
from hpcrl.submit.job_record import JobRecord
from hpcrl.submit.job_state import (
    JobOutcome,
    JobStatus,
    SacctWatcher,
    query_statuses,
    read_outcome,
    results_written,
)
from hpcrl.submit.logs import fold_state_dumps, list_log_files, read_log, tail_lines

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


def default_wait_settings() -> WaitSettings:
    return WaitSettings()


def wait_for_job(
    run_dir: Path,
    record: JobRecord,
    console: Console,
    max_steps: int | None = None,
    settings: WaitSettings | None = None,
    clock: Callable[[], float] = time.monotonic,
    sleep: Callable[[float], None] = time.sleep,
) -> JobOutcome:
    """Show progress until the job ends; return how it ended (printing the failure).

    On a terminal one live line; otherwise (CI logs, pipes) a line per phase and heartbeats.
    """
    return wait_for_jobs([(run_dir, record)], console, max_steps, settings, clock, sleep)[0]


def wait_for_jobs(
    runs: Sequence[tuple[Path, JobRecord]],
    console: Console,
    max_steps: int | None = None,
    settings: WaitSettings | None = None,
    clock: Callable[[], float] = time.monotonic,
    sleep: Callable[[float], None] = time.sleep,
) -> list[JobOutcome]:
    """Follow every job at once (a sweep's points): one scheduler query per poll for all of
    them (submitit's watcher backoff between queries, a query at once when a job's results
    appear), one progress line; then how each ended, in order."""
    settings = settings or default_wait_settings()
    watcher = SacctWatcher()
    watches = [_Watch(record, settings, clock=clock) for _, record in runs]
    statuses: list[JobStatus] = [JobStatus(state="UNKNOWN")] * len(runs)
    first = (
        f"job {runs[0][1].job_id}: submitted" if len(runs) == 1 else f"{len(runs)} jobs: submitted"
    )
    announced: set[tuple[int, int]] = set()
    with _ProgressLine(console, first, settings.heartbeat_s, clock) as progress:
        while True:
            waiting_on = [index for index, watch in enumerate(watches) if not watch.done]
            force = all(watch.polls == 0 for watch in watches) or any(
                results_written(watches[index].record) for index in waiting_on
            )
            records = [watches[index].record for index in waiting_on]
            for index, status in zip(
                waiting_on, query_statuses(records, watcher, force), strict=True
            ):
                statuses[index] = status
                watches[index].observe(status)
            progress.update(*_progress_text(runs, statuses, max_steps))
            _announce_requeues(runs, announced, console)
            if all(watch.done for watch in watches):
                break
            sleep(settings.poll_s)
    outcomes = []
    for (run_dir, record), watch, status in zip(runs, watches, statuses, strict=True):
        final = watch.final_status(status)
        outcome = read_outcome(record, run_dir, final)
        report_outcome(run_dir, record, final, outcome, console)
        outcomes.append(outcome)
    return outcomes


def _announce_requeues(
    runs: Sequence[tuple[Path, JobRecord]], announced: set[tuple[int, int]], console: Console
) -> None:
    """One line for each attempt that ended early and was requeued, once, as it appears (an
    attempt that ended the job is reported with the job's end)."""
    for index, (run_dir, record) in enumerate(runs):
        for cause in read_causes(run_dir):
            if cause.requeued and (index, cause.attempt) not in announced:
                announced.add((index, cause.attempt))
                console.print(
                    f"job {record.job_id} {cause.titled_line()}",
                    markup=False, highlight=False, soft_wrap=True,
                )  # fmt: skip


def _progress_text(
    runs: Sequence[tuple[Path, JobRecord]], statuses: Sequence[JobStatus], max_steps: int | None
) -> tuple[str, str]:
    """(phase, line) for one job as ``job 41: <line>``; for several, counts per phase."""
    phases, lines = [], []
    for (run_dir, _), status in zip(runs, statuses, strict=True):
        phase, line = progress_of(run_dir, status, max_steps)
        if status.scheduler_error:
            phase += " · scheduler not answering"
            line += f" · scheduler not answering ({status.scheduler_error})"
        phases.append(phase)
        lines.append(line)
    if len(runs) == 1:
        return phases[0], f"job {runs[0][1].job_id}: {lines[0]}"
    kinds = Counter(phase.split(" (")[0].lower() for phase in phases)
    summary = ", ".join(f"{count} {kind}" for kind, count in kinds.items())
    return " | ".join(phases), f"{len(runs)} jobs: {summary}"


def job_end_check(
    record: JobRecord,
    settings: WaitSettings | None = None,
    clock: Callable[[], float] = time.monotonic,
) -> Callable[[], str | None]:
    """For ``hpcrl logs -f``: a function that says why following is over (a final state,
    ``ENDED``, ``LOST``, ``UNREACHABLE``) or None while the job goes on; it asks the
    scheduler on submitit's backoff schedule, not on every call."""
    watcher = SacctWatcher()
    watch = _Watch(record, settings or default_wait_settings(), clock=clock)

    def check() -> str | None:
        force = watch.polls == 0 or results_written(record)
        status = query_statuses([record], watcher, force)[0]
        return watch.final_status(status).state if watch.observe(status) else None

    return check


def why_waiting_ended(state: str) -> str:
    """One line for a job that stopped being followed without a final scheduler state."""
    return {
        "ENDED": "every task wrote its result (the scheduler has not said so yet)",
        "LOST": "the scheduler has no record of this job (wrong cluster, or purged from sacct)",
        "UNREACHABLE": "the scheduler has not answered for a while; the job may still run",
    }.get(state, state.lower())


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
    polls: int = 0
    done: bool = False

    def observe(self, status: JobStatus) -> bool:
        """Take in the latest status; True (and ``done``) once waiting is over."""
        self.polls += 1
        self.done = self.done or self._ended(status)
        return self.done

    def _ended(self, status: JobStatus) -> bool:
        now = self.clock()
        if status.is_final:
            return True
        self.unreachable_since_s = _since(
            self.unreachable_since_s, now, bool(status.scheduler_error)
        )
        # UNKNOWN while sacct fails is no news: only the scheduler's own answer can lose a job
        unknown = status.state == "UNKNOWN" and not status.scheduler_error
        self.unknown_since_s = _since(self.unknown_since_s, now, unknown)
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
    print_log_tails(run_dir, record, console, attempt=status.attempts)


def print_log_tails(
    run_dir: Path, record: JobRecord, console: Console, attempt: int | None = None
) -> None:
    """The last lines of each node's error stream, node log and driver log (of ``attempt``,
    counted from 1, when given: the one that ended the job); Ray's state dumps folded."""
    for log in list_log_files(run_dir, record):
        if log.label != "stderr" and Path(log.label).name not in TAILED_NODE_LOGS:
            continue
        if (
            attempt is not None
            and log.label != "stderr"
            and not log.label.startswith(f"attempt{attempt - 1}/")
        ):
            continue
        text = tail_lines(fold_state_dumps(read_log(log.path), log.path), LOG_TAIL_LINES)
        if text.strip():
            console.rule(f"node {log.node} {log.label}: {log.path}", style="dim")
            console.print(text.rstrip("\n"), markup=False, highlight=False, soft_wrap=True)
