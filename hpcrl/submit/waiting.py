"""``hpcrl submit --wait``: follow a job to its end with one live progress line.

queued (with Slurm's reason) → running → Ray ready (``status/ray_ready`` of the current
attempt) → the driver's phase (loading the checkpoint of step N, ...) → training step N/M
with an ETA (the current attempt's lines of ``metrics.jsonl``: ``hpcrl.submit.progress``) →
done. On a terminal the
line updates in place; elsewhere (CI logs, pipes) one line per change of phase and per new
training step (at most one per ``step_line_s``), and ``still <phase> (for <time>)`` after
``heartbeat_s`` without one. Never
hangs: the loop ends when the scheduler reports a final state (or the scheduler forgot the
job), and a job without a result is reported as failed with the tail of its logs.
"""

from __future__ import annotations

import time
from collections import Counter
from collections.abc import Callable, Sequence
from pathlib import Path
from types import TracebackType

import attrs
from rich.console import Console

from hpcrl.run.job_record import JobRecord
from hpcrl.run.metrics_file import last_metrics
from hpcrl.submit.failure_causes import attempt_causes
from hpcrl.submit.hints import command
from hpcrl.submit.job_state import (
    JobOutcome,
    SacctWatcher,
    query_statuses,
    read_outcome,
    results_written,
)
from hpcrl.submit.job_status import JobStatus
from hpcrl.submit.log_view import LoggedRun, LogSelection, prefixed_lines, shown_files, strip_ansi
from hpcrl.submit.logs import fold_state_dumps, read_log, tail_lines
from hpcrl.submit.progress import duration, metric_text, progress_of, step_text
from hpcrl.submit.status_view import planned_max_steps

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
    heartbeat_s: float = 60.0  # without a terminal: "still <phase> (for ...)" after this long
    step_line_s: float = 10.0  # without a terminal: at most one line per new step this often


def describe_progress(
    run_dir: Path, status: JobStatus, max_steps: int | None, record: JobRecord | None = None
) -> str:
    """One line: where the job is now (``hpcrl.submit.progress``)."""
    return progress_of(run_dir, status, max_steps, record)[1]


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
    appear), one progress line; then how each ended, in order. ``max_steps``: None reads each
    run's own from its resolved recipe. Ctrl-C stops following (exit code 130 for the jobs
    still running), saying how to follow them again; it cancels nothing."""
    settings = settings or default_wait_settings()
    steps = [max_steps if max_steps is not None else planned_max_steps(d) for d, _ in runs]
    watcher = SacctWatcher()
    watches = [_Watch(record, settings, clock=clock) for _, record in runs]
    statuses: list[JobStatus] = [JobStatus(state="UNKNOWN")] * len(runs)
    first = (
        f"job {runs[0][1].job_id}: submitted" if len(runs) == 1 else f"{len(runs)} jobs: submitted"
    )
    announced: set[tuple[int, int]] = set()
    try:
        with _ProgressLine(console, first, settings, clock) as progress:
            while True:
                _poll(watches, watcher, statuses)
                progress.update(*_progress_text(runs, statuses, steps, watches))
                _announce_requeues(runs, announced, console, statuses)
                if all(watch.done for watch in watches):
                    break
                sleep(settings.poll_s)
    except KeyboardInterrupt:
        return _detached(runs, watches, console)
    outcomes = []
    for (run_dir, record), watch, status, run_steps in zip(
        runs, watches, statuses, steps, strict=True
    ):
        final = watch.final_status(status)
        outcome = read_outcome(record, run_dir, final)
        report_outcome(run_dir, record, final, outcome, console, run_steps)
        outcomes.append(outcome)
    return outcomes


def _announce_requeues(
    runs: Sequence[tuple[Path, JobRecord]],
    announced: set[tuple[int, int]],
    console: Console,
    statuses: Sequence[JobStatus | None] | None = None,
) -> None:
    """One line for each attempt that ended early and was requeued, once, as it appears (an
    attempt that ended the job is reported with the job's end; one Slurm ended NODE_FAIL is
    named from the job's sacct rows in ``statuses`` before the next attempt writes it)."""
    for index, (run_dir, record) in enumerate(runs):
        status = statuses[index] if statuses is not None else None
        for cause in attempt_causes(run_dir, record, status):
            if cause.requeued and (index, cause.attempt) not in announced:
                announced.add((index, cause.attempt))
                console.print(
                    f"job {record.job_id} {cause.titled_line()}",
                    markup=False, highlight=False, soft_wrap=True,
                )  # fmt: skip


def _poll(watches: list[_Watch], watcher: SacctWatcher, statuses: list[JobStatus]) -> None:
    waiting_on = [index for index, watch in enumerate(watches) if not watch.done]
    force = all(watch.polls == 0 for watch in watches) or any(
        watches[index].results_of_this_attempt(statuses[index]) for index in waiting_on
    )
    records = [watches[index].record for index in waiting_on]
    for index, status in zip(waiting_on, query_statuses(records, watcher, force), strict=True):
        statuses[index] = status
        watches[index].observe(status)


#: The exit code of a wait left with Ctrl-C (the shell's 128 + SIGINT).
DETACHED_EXIT_CODE = 130


def _detached(
    runs: Sequence[tuple[Path, JobRecord]], watches: Sequence[_Watch], console: Console
) -> list[JobOutcome]:
    """Ctrl-C: say which jobs go on and how to follow them again; no traceback."""
    open_runs = [(d, r) for (d, r), watch in zip(runs, watches, strict=True) if not watch.done]
    console.print()
    for run_dir, record in open_runs:
        console.print(
            f"detached: job {record.job_id} is still running; follow with: "
            f"{command('logs', run_dir, '-f')} (or {command('status', run_dir)})",
            markup=False, highlight=False, soft_wrap=True,
        )  # fmt: skip
    return [
        JobOutcome(
            exit_code=DETACHED_EXIT_CODE if not watch.done else 0,
            has_result=False,
            detail="detached",
        )  # fmt: skip
        for watch in watches
    ]


def _progress_text(
    runs: Sequence[tuple[Path, JobRecord]],
    statuses: Sequence[JobStatus],
    steps: Sequence[int | None],
    watches: Sequence[_Watch],
) -> tuple[str, str]:
    """(phase, line) for one job as ``job 41: <line>``; for several, ``x/y done``, counts
    per phase and each training point's step N/M (``point-0 3/4, point-2 1/4``)."""
    phases, lines, training = [], [], []
    for (run_dir, record), status, run_steps in zip(runs, statuses, steps, strict=True):
        phase, line = progress_of(run_dir, status, run_steps, record)
        if status.scheduler_error:
            phase += " · scheduler not answering"
            line += f" · scheduler not answering ({status.scheduler_error})"
        phases.append(phase)
        lines.append(line)
        if len(runs) > 1 and phase.startswith("training"):
            training.append(_point_step_text(run_dir, run_steps))
    if len(runs) == 1:
        return phases[0], f"job {runs[0][1].job_id}: {lines[0]}"
    kinds = Counter(phase.split(" (")[0].lower() for phase in phases)
    summary = ", ".join(f"{count} {kind}" for kind, count in kinds.items())
    done = sum(watch.done for watch in watches)
    steps_text = f" · {', '.join(training)}" if training else ""
    return " | ".join(phases), f"{len(runs)} jobs: {done}/{len(runs)} done · {summary}{steps_text}"


def _point_step_text(run_dir: Path, max_steps: int | None) -> str:
    """``point-2 3/4``: a training point's folder name and its last step of its own M."""
    metrics = last_metrics(run_dir) or {}
    return f"{Path(run_dir).name} {step_text(metrics, max_steps)}"


def jobs_end_check(
    records: Sequence[JobRecord],
    settings: WaitSettings | None = None,
    clock: Callable[[], float] = time.monotonic,
    watcher: SacctWatcher | None = None,
    say: Callable[[str], None] | None = None,
) -> Callable[[], list[str | None]]:
    """For ``hpcrl logs -f``: a function that says, for each job (a sweep's points), why
    following it is over (a final state, ``ENDED``, ``LOST``, ``UNREACHABLE``) or None while it
    goes on. Each call is one poll of all the jobs still followed: one sacct call answers for
    all of them (on submitit's backoff schedule; at once on the first poll and when a job's
    results appear), as for ``--wait``. ``say``: told at once when sacct fails (its own
    error, and that it is asked again), and when it answers again."""
    settings = settings or default_wait_settings()
    watcher = watcher or SacctWatcher()
    watches = [_Watch(record, settings, clock=clock) for record in records]
    statuses: list[JobStatus] = [JobStatus(state="UNKNOWN")] * len(records)
    said: list[str | None] = [None]

    def check() -> list[str | None]:
        _poll(watches, watcher, statuses)
        if say is not None:
            said[0] = _say_scheduler_error(statuses, said[0], settings, say)
        return [
            watch.final_status(status).state if watch.done else None
            for watch, status in zip(watches, statuses, strict=True)
        ]

    return check


def _say_scheduler_error(
    statuses: Sequence[JobStatus], said: str | None, settings: WaitSettings,
    say: Callable[[str], None],
) -> str | None:  # fmt: skip
    """Say a scheduler error when it first shows (or changes) and when it is over; returns
    what is said now (the error, or None)."""
    error = next((status.scheduler_error for status in statuses if status.scheduler_error), None)
    if error is not None and error != said:
        say(
            f"the scheduler is not answering ({error}); still following, asking again "
            f"(giving up after {settings.unreachable_grace_s:g} s without an answer)"
        )
    elif error is None and said is not None:
        say("the scheduler answers again")
    return error


def why_waiting_ended(state: str) -> str:
    """One line for a job that stopped being followed without a final scheduler state."""
    return {
        "ENDED": "every task wrote its result (the scheduler has not said so yet)",
        "LOST": "the scheduler has no record of this job (wrong cluster, or purged from sacct)",
        "UNREACHABLE": "the scheduler has not answered for a while; the job may still run",
    }.get(state, state.lower())


class _ProgressLine:
    """A rich spinner line on a terminal. Elsewhere plain lines stamped with the time waited:
    one per new phase, one per new training step (at most one per ``step_line_s``), and
    ``still <phase> (for <time>)`` after ``heartbeat_s`` without a line."""

    def __init__(
        self, console: Console, first: str, settings: WaitSettings, clock: Callable[[], float]
    ) -> None:
        self._console = console
        self._status = console.status(first) if console.is_terminal else None
        self._clock = clock
        self._settings = settings
        self._started_s = self._printed_s = self._phase_since_s = clock()
        self._phase: str | None = None
        self._printed_text = ""

    def __enter__(self) -> _ProgressLine:
        if self._status is not None:
            self._status.__enter__()
        return self

    def __exit__(
        self,
        exc_type: type[BaseException] | None,
        exc: BaseException | None,
        traceback: TracebackType | None,
    ) -> None:
        if self._status is not None:
            self._status.__exit__(exc_type, exc, traceback)

    def update(self, phase: str, text: str) -> None:
        now_s = self._clock()
        if phase != self._phase:
            self._phase_since_s = now_s
        if self._status is not None:
            self._status.update(f"{text} · {duration(now_s - self._started_s)}")
        elif phase != self._phase:
            self._print(now_s, text)
        elif text != self._printed_text and now_s - self._printed_s >= self._settings.step_line_s:
            self._print(now_s, text)  # a new step in the same phase
        elif now_s - self._printed_s >= self._settings.heartbeat_s:
            who, _, where = text.partition(": ")
            since = duration(now_s - self._phase_since_s)
            self._print(now_s, f"{who}: still {where} (for {since})", remember=False)
        self._phase = phase

    def _print(self, now_s: float, text: str, remember: bool = True) -> None:
        self._console.print(
            f"[{duration(now_s - self._started_s):>7}] {text}",
            markup=False, highlight=False, soft_wrap=True,
        )  # fmt: skip
        self._printed_s = now_s
        if remember:
            self._printed_text = text


def _escape(text: str) -> str:
    from rich.markup import escape

    return escape(text)


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
        written = self.results_of_this_attempt(status)
        self.results_since_s = _since(self.results_since_s, now, written)
        if self._longer_than(self.results_since_s, now, self.settings.sacct_lag_s):
            self.reason = "RESULTS"
        elif self._longer_than(self.unknown_since_s, now, self.settings.unknown_grace_s):
            self.reason = "LOST"
        elif self._longer_than(self.unreachable_since_s, now, self.settings.unreachable_grace_s):
            self.reason = "UNREACHABLE"
        return bool(self.reason)

    def results_of_this_attempt(self, status: JobStatus) -> bool:
        """Every task wrote its result, in the attempt ``status`` is of. A requeued job holds
        its earlier attempts' results (every task's where a requeue read as failed), which
        say nothing of the attempt waiting or running now."""
        if status.state == "REQUEUED" or (status.state == "PENDING" and status.attempts > 1):
            return False
        return results_written(self.record, status.started_at_s if status.attempts > 1 else None)

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


def last_step_text(run_dir: Path, max_steps: int | None) -> str:
    """`` · step 12/12 · reward 0.5 · loss 0.1`` from the run's last metrics line ('' if none)."""
    metrics = last_metrics(run_dir)
    if metrics is None:
        return ""
    return f" · step {step_text(metrics, max_steps)}{metric_text(metrics)}"


def report_outcome(
    run_dir: Path, record: JobRecord, status: JobStatus, outcome: JobOutcome, console: Console,
    max_steps: int | None = None,
) -> None:  # fmt: skip
    last = _escape(last_step_text(run_dir, max_steps))
    if outcome.exit_code == 0:
        console.print(f"[green]done[/]: job {record.job_id} {status.state}, exit code 0{last}")
        return
    if status.state == "UNREACHABLE":
        console.print(
            f"[bold yellow]stopped waiting[/]: the scheduler has not answered for a while "
            f"({status.scheduler_error}); job {record.job_id} may still run. "
            f"Check later: {_escape(command('status', run_dir))}",
            soft_wrap=True,
        )
        return
    console.print(
        f"[bold red]FAILED[/]: job {record.job_id} {status.state}, exit code {outcome.exit_code}"
        + (f" ({_escape(outcome.detail.splitlines()[0])})" if outcome.detail else "")
        + last
    )
    # attempts are counted through the run (a resumed run's earlier jobs' first)
    print_log_tails(run_dir, record, console, attempt=record.attempt_offset + status.attempts)


def print_log_tails(
    run_dir: Path, record: JobRecord, console: Console, attempt: int | None = None
) -> None:
    """The last lines of each node's error stream and driver log (node.log only for a node
    without an error stream: the node entrypoint writes its lines to both), prefixed as
    ``hpcrl logs`` prints them; of ``attempt`` (counted from 1: the one that ended the job)
    when given, Ray's state dumps folded."""
    run = LoggedRun(run_dir=run_dir, record=record)
    for log in shown_files(run, LogSelection(attempt=attempt), earlier_jobs=False):
        if log.label != "stderr" and Path(log.label).name not in TAILED_NODE_LOGS:
            continue
        text = fold_state_dumps(strip_ansi(read_log(log.path)), log.path)
        text = tail_lines(text, LOG_TAIL_LINES)
        if text.strip():
            console.print("".join(prefixed_lines(run, log, text, keep_banner=True)).rstrip("\n"),
                          markup=False, highlight=False, soft_wrap=True)  # fmt: skip
