"""A submitted job's live state, result and cancellation, rebuilt from ``job.json`` alone.

Slurm: state, exit code, elapsed time, pending reason and the number of attempts (requeues
show as extra sacct records with ``--duplicates``) come from one sacct call for all the jobs
asked about (``SacctWatcher``, submitit's shared-watcher scheme). Local: submitit's LocalJob only knows its process inside the submitting Python, so
another process reads the controller's pid and submitit's result files instead.

Job ids repeat, so a record is matched by id *and* submit time and cluster
(``hpcrl.submit.job_identity``): rows of its id from another job make the status ``STALE``
(final), saying whose they are; a reused local pid is not the record's controller.
"""

from __future__ import annotations

import datetime
import json
import os
import signal
import subprocess
import time
from collections.abc import Callable, Sequence
from pathlib import Path
from typing import Any

import attrs
import submitit
from submitit.core.utils import JobPaths, UncompletedJobError
from submitit.local.local import LocalJob
from submitit.slurm.slurm import SlurmInfoWatcher, SlurmJob, read_job_id

from hpcrl.config.errors import UserError
from hpcrl.run.job_record import JobRecord
from hpcrl.run.polling import wait_until
from hpcrl.submit.failure_causes import failure_account, failure_cause
from hpcrl.submit.job_identity import (
    STALE_AFTER_S,
    SUBMIT_SLACK_S,
    process_start_time,
    record_time,
    rows_of_record,
    state_word,
)
from hpcrl.submit.job_status import FINAL_STATES, JobStatus
from hpcrl.submit.pending_reasons import pending_reasons, queued_states

SACCT_TIMEOUT_S = 30
SACCT_FIELDS = (
    "JobID", "State", "ExitCode", "ElapsedRaw", "Reason", "Submit", "Cluster", "Start",
)  # fmt: skip
#: sacct prints times in epoch seconds with this (no time zone to guess).
SACCT_ENV = {"SLURM_TIME_FORMAT": "%s"}
WATCH_DELAY_S = 30  # while waiting: at most this long between two sacct calls
LOCAL_CANCEL_GRACE_S = 60.0  # local cancel: how long the tasks get to stop Ray and exit
LOCAL_CONTROLLER_EXIT_S = 15.0  # then: how long submitit's interrupted controller gets to exit


@attrs.frozen(kw_only=True)
class JobOutcome:
    """How a finished job ended: ``exit_code`` is the driver's (task 0's return value) when
    submitit has a result, else derived from the scheduler; ``detail`` says why it failed."""

    exit_code: int
    has_result: bool
    detail: str = ""


def rebuild_job(record: JobRecord) -> submitit.Job[Any]:
    """submitit's Job object for a recorded job (a meta-job over all its tasks)."""
    tasks = list(range(record.num_tasks))
    if record.executor == "local":
        return LocalJob(folder=record.submitit_folder, job_id=record.job_id, tasks=tasks)
    return SlurmJob(folder=record.submitit_folder, job_id=record.job_id, tasks=tasks)


def task_paths(record: JobRecord, task_id: int) -> JobPaths:
    return JobPaths(record.submitit_folder, job_id=record.job_id, task_id=task_id)


class SacctWatcher(SlurmInfoWatcher):
    """submitit's shared watcher, asking what hpcrl shows: one ``sacct`` call answers for
    every job registered on it (array tasks and requeued attempts included), forced or on
    submitit's backoff (2 s, 4 s, 8 s, ... after the last job was added, then every
    ``delay_s``). Each call has a timeout; a failure is kept in ``error`` (the last answer
    stays) instead of a warning per call.
    """

    def __init__(
        self,
        delay_s: int = WATCH_DELAY_S,
        timeout_s: float = SACCT_TIMEOUT_S,
        run: Callable[..., subprocess.CompletedProcess] | None = None,
    ) -> None:
        super().__init__(delay_s=delay_s)
        self._timeout_s = timeout_s
        self._run = run or subprocess.run
        self.error: str | None = None
        self.rows: dict[str, list[dict[str, str]]] = {}  # job id -> one row per attempt
        self.reasons: dict[str, str] = {}  # pending jobs: squeue's reason (sacct's is empty)
        #: jobs whose last attempt ended NODE_FAIL but that Slurm still queues (a requeue):
        #: squeue's state. sacct adds the next attempt's row only once it is eligible.
        self.requeued: dict[str, str] = {}

    def watch(self, job_id: str) -> None:
        if job_id not in self._registered:  # registering again would restart the backoff
            self.register_job(job_id)

    def _make_command(self) -> list[str] | None:
        to_check = sorted({job_id.split("_")[0] for job_id in self._registered - self._finished})
        if not to_check:
            return None
        command = ["sacct", "-X", "--duplicates", "--parsable2", "-o", ",".join(SACCT_FIELDS)]
        for job_id in to_check:
            command += ["-j", job_id]
        return command

    def update(self) -> None:
        command = self._make_command()
        if command is None:
            return
        self._num_calls += 1
        output, self.error = self._call(command)
        if output is not None:
            self._info_dict.update(self.read_info(output))
            self._ask_why_pending()
        self._last_status_check = time.time()
        for job_id in self._registered - self._finished:
            if self.is_done(job_id, mode="cache") and job_id not in self.requeued:
                self._finished.add(job_id)

    def _ask_why_pending(self) -> None:
        pending = self._last_state_is("PENDING")
        self.reasons = pending_reasons(pending, self._run) if pending else {}
        node_failed = self._last_state_is("NODE_FAIL")
        self.requeued = queued_states(node_failed, self._run) if node_failed else {}
        if any(state == "PENDING" for state in self.requeued.values()):
            self.reasons |= pending_reasons(list(self.requeued), self._run)

    def _last_state_is(self, word: str) -> list[str]:
        return [
            job_id
            for job_id in self._registered - self._finished
            if self.rows.get(job_id) and state_word(self.rows[job_id][-1].get("State", "")) == word
        ]

    def _call(self, command: list[str]) -> tuple[str | None, str | None]:
        try:
            proc = self._run(command, capture_output=True, text=True, errors="replace",
                             timeout=self._timeout_s, check=False,
                             env={**os.environ, **SACCT_ENV})  # fmt: skip
        except subprocess.TimeoutExpired:
            return None, f"sacct did not answer within {self._timeout_s:.0f} s"
        except (OSError, subprocess.SubprocessError) as error:
            return None, f"sacct: {error}"
        if proc.returncode != 0:
            last = (proc.stderr or "").strip().splitlines()[-1:] or ["no message"]
            return None, f"sacct exited {proc.returncode}: {last[0]}"
        return proc.stdout, None

    def read_info(self, string: bytes | str) -> dict[str, dict[str, str]]:
        """Rows by job id (``123``, ``123_4``); the last row of a job is its current attempt."""
        text = string.decode(errors="replace") if isinstance(string, bytes) else string
        lines = text.splitlines()
        names = lines[0].split("|") if lines else []
        found: dict[str, list[dict[str, str]]] = {}
        for line in lines[1:]:
            row = {name: value.strip() for name, value in zip(names, line.split("|"), strict=False)}
            for job_id in _expand_job_id(row.get("JobID", "")):
                found.setdefault(job_id, []).append(row)
        self.rows.update(found)
        return {job_id: rows[-1] for job_id, rows in found.items()}

    def status(self, job_id: str, record: JobRecord | None = None) -> JobStatus:
        """The job's status from its rows (with ``record``: only the rows of that job)."""
        rows = self.rows.get(job_id)
        if not rows:
            return JobStatus(state="UNKNOWN", scheduler_error=self.error)
        if record is not None:
            rows, stale = rows_of_record(rows, record)
            if not rows and time.time() - record_time(record) < STALE_AFTER_S:
                return JobStatus(state="UNKNOWN", scheduler_error=self.error)
            if not rows:
                return JobStatus(state="STALE", stale=stale, scheduler_error=self.error)
        last = rows[-1]
        state = state_word(last.get("State", ""))
        states = tuple(state_word(row.get("State", "")) for row in rows)
        queued = self.requeued.get(job_id) if state == "NODE_FAIL" else None
        if queued is not None:  # Slurm requeued it: the next attempt waits (or is starting)
            state = "REQUEUED" if queued == "COMPLETING" else queued
            if state != "REQUEUED":
                states += (state,)
        elapsed, start = last.get("ElapsedRaw", ""), last.get("Start", "")
        reason = self.reasons.get(job_id) if state == "PENDING" else None
        reason = None if state in FINAL_STATES else reason or last.get("Reason")
        return JobStatus(
            state=state,
            attempts=len(states),
            elapsed_s=float(elapsed) if elapsed.isdigit() else None,
            started_at_s=float(start) if start.isdigit() else None,
            exit_code=_parse_exit_code(last.get("ExitCode", "")) if state in FINAL_STATES else None,
            reason=reason if reason not in (None, "", "None") else None,
            states=states,
            scheduler_error=self.error,
        )


def _expand_job_id(text: str) -> list[str]:
    """``123``, ``123_4``, and a pending array's ``123_[2-5%2]`` as ids; [] for a step or junk."""
    if not text or "." in text:
        return []
    try:
        parts_list = read_job_id(text)
    except (ValueError, IndexError):
        return []
    ids = []
    for parts in parts_list:
        if not all(part.isdigit() for part in parts):
            continue
        if len(parts) == 3:
            ids += [f"{parts[0]}_{index}" for index in range(int(parts[1]), int(parts[2]) + 1)]
        else:
            ids.append("_".join(parts))
    return ids


def query_statuses(
    records: Sequence[JobRecord], watcher: SacctWatcher | None = None, force: bool = True
) -> list[JobStatus]:
    """The status of each record, with one sacct call for all the Slurm ones (``force``:
    now; otherwise when the watcher's backoff says so)."""
    watcher = watcher or SacctWatcher()
    slurm = [record.job_id for record in records if record.executor == "slurm"]
    for job_id in slurm:
        watcher.watch(job_id)
    if slurm:
        watcher.update_if_long_enough("force" if force else "standard")
    return [
        _local_status(record)
        if record.executor == "local"
        else watcher.status(record.job_id, record)
        for record in records
    ]


def query_status(record: JobRecord) -> JobStatus:
    return query_statuses([record])[0]


def results_written(record: JobRecord, since_s: float | None = None) -> bool:
    """Every task wrote its submitit result (the job is over even if sacct cannot say so);
    ``since_s`` (epoch seconds): each result written then or later."""
    for task in range(record.num_tasks):
        try:
            written_s = task_paths(record, task).result_pickle.stat().st_mtime
        except FileNotFoundError:
            return False
        if since_s is not None and written_s < since_s:
            return False
    return True


def _parse_exit_code(text: str) -> int | None:
    """sacct's ``code:signal``; a job killed by a signal gets the shell's 128 + signal."""
    code, _, sig = text.partition(":")
    if not code.isdigit():
        return None
    return 128 + int(sig) if int(code) == 0 and sig.isdigit() and int(sig) else int(code)


# --------------------------------------------------------------------------- local executor
def _local_status(record: JobRecord) -> JobStatus:
    submitted = datetime.datetime.fromisoformat(record.submitted_at).timestamp()
    if _local_controller_alive(int(record.job_id), submitted):
        return JobStatus(state="RUNNING", elapsed_s=time.time() - submitted)
    result_path = task_paths(record, 0).result_pickle
    if not result_path.exists():
        cancelled = _local_cancel_marker(record).exists()
        return JobStatus(state="CANCELLED" if cancelled else "FAILED", exit_code=1)
    outcome = read_outcome(record, Path(record.submitit_folder).parent)
    return JobStatus(
        state="COMPLETED" if outcome.exit_code == 0 else "FAILED",
        exit_code=outcome.exit_code,
        elapsed_s=result_path.stat().st_mtime - submitted,
    )


def _local_controller_alive(pid: int, submitted: float | None = None) -> bool:
    """True while submitit's local controller with this pid runs (not a zombie, not reused:
    with ``submitted``, the process must have started within SUBMIT_SLACK_S of it)."""
    proc = Path(f"/proc/{pid}")
    try:
        cmdline = (proc / "cmdline").read_bytes()
        stat = (proc / "stat").read_text()
    except OSError:
        return False
    fields = stat.rpartition(")")[2].split()
    # stat field 22: start, in clock ticks since boot
    return is_local_controller(cmdline, fields[0], process_start_time(int(fields[19])), submitted)


def is_local_controller(
    cmdline: bytes, state: str, started: float | None, submitted: float | None
) -> bool:
    """Whether a process (its /proc cmdline, state letter and start time) is the controller.

    An empty cmdline counts: the kernel closes the exec'ing process's close-on-exec pipe,
    which ends ``Popen``, before it writes the new argv, so a poll right after submission
    reads ``b""`` (measured: 294 of 300 such polls here). A kernel thread, the other process
    with an empty cmdline, cannot have reused the pid within SUBMIT_SLACK_S of submission
    unless the start-time check below lets it; a zombie never counts.
    """
    if state == "Z" or (cmdline and b"submitit.local._local" not in cmdline):
        return False
    return submitted is None or started is None or abs(started - submitted) <= SUBMIT_SLACK_S


# --------------------------------------------------------------------------- result / cancel
def read_outcome(record: JobRecord, run_dir: Path, status: JobStatus | None = None) -> JobOutcome:
    """How the job ended, from task 0's submitit result (the driver runs on task 0).

    The node entrypoint raises when the driver fails (so submitit and Slurm mark the job
    failed); the driver's own exit code is then read from its ``status/done`` marker.
    """
    job = rebuild_job(record).task(0)
    if not job.paths.result_pickle.exists():
        # hpcrl's own account first: when node 1 failed first, srun ended the batch step
        # and sacct's exit code is that (15), not the failing node's.
        account = failure_account(run_dir, record, status)
        exit_code = status.exit_code if status and status.exit_code else 1
        state = status.state if status else "unknown"
        if account is not None:
            return JobOutcome(exit_code=account[1], has_result=False, detail=account[0])
        return JobOutcome(exit_code=exit_code, has_result=False, detail=f"no result ({state})")
    try:
        result = job.result()
    except UncompletedJobError as error:
        # A node's named failure says it in one line; the exception line is the fallback.
        detail = failure_cause(run_dir, record, status) or _last_line(error)
        return JobOutcome(exit_code=_driver_exit_code(run_dir) or 1, has_result=True, detail=detail)
    except Exception as error:  # a damaged result file (pickle): say so, do not crash
        detail = f"unreadable result {job.paths.result_pickle}: {type(error).__name__}"
        return JobOutcome(
            exit_code=_driver_exit_code(run_dir) or 1, has_result=False, detail=detail
        )
    if isinstance(result, bool) or not isinstance(result, int):
        return JobOutcome(
            exit_code=0 if result is None else 1, has_result=True, detail=repr(result)
        )
    return JobOutcome(exit_code=result, has_result=True)


def _driver_exit_code(run_dir: Path) -> int | None:
    try:
        marker = json.loads((Path(run_dir) / "status" / "done").read_text())
    except (OSError, json.JSONDecodeError):
        return None
    code = marker.get("exit_code")
    return code if isinstance(code, int) and not isinstance(code, bool) else None


def _last_line(error: Exception) -> str:
    """The exception line of the job's traceback inside submitit's error message."""
    lines = str(error).splitlines()
    frames = [index for index, line in enumerate(lines) if line.startswith("  File ")]
    after_frames = lines[frames[-1] + 1 :] if frames else lines
    raised = [line for line in after_frames if line and not line[0].isspace()]
    return raised[0].strip() if raised else (lines[0] if lines else "")


class CancelFailed(UserError):
    """The scheduler did not confirm a cancellation."""


def cancel_job(record: JobRecord) -> None:
    """Cancel with ``scancel`` on Slurm (what submitit's Job.cancel runs, here with a timeout
    and its message kept); locally SIGINT to submitit's controller, as submitit's
    LocalJob.cancel does (it interrupts its tasks, then kills what is left)."""
    if record.executor == "slurm":
        _scancel(record.job_id)
        return
    pid, submitted = int(record.job_id), record_time(record)
    if not _local_controller_alive(pid, submitted):  # never another run's reused pid
        return
    _local_cancel_marker(record).touch()  # no scheduler remembers it for us
    # Interrupt the tasks themselves first: submitit's controller, when interrupted, gives
    # them one second before SIGKILL, too short for the node entrypoint to stop Ray.
    for task_pid in _child_pids(pid):
        os.kill(task_pid, signal.SIGINT)

    def gone() -> bool:
        return not _local_controller_alive(pid, submitted)

    if not wait_until(gone, LOCAL_CANCEL_GRACE_S, interval_s=0.2):
        # Interrupted, the controller gives its tasks a second, kills them, then exits; wait
        # for that so the status right after a cancel says CANCELLED, not RUNNING.
        os.kill(pid, signal.SIGINT)
        if not wait_until(gone, LOCAL_CONTROLLER_EXIT_S, interval_s=0.2):
            os.kill(pid, signal.SIGKILL)


def _scancel(job_id: str) -> None:
    fix = f"check the job with: squeue -j {job_id} (cancel it by hand with: scancel {job_id})"
    try:
        proc = subprocess.run(["scancel", job_id], capture_output=True, text=True,
                              errors="replace", timeout=SACCT_TIMEOUT_S, check=False)  # fmt: skip
    except subprocess.TimeoutExpired:
        raise CancelFailed(
            f"scancel {job_id} did not answer within {SACCT_TIMEOUT_S} s", fix
        ) from None
    except OSError as error:
        raise CancelFailed(
            f"cannot run scancel for job {job_id}: {error.strerror or error}", fix
        ) from None
    if proc.returncode != 0:
        message = " ".join(proc.stderr.split()) or f"exit code {proc.returncode}"
        raise CancelFailed(f"scancel {job_id} failed: {message}", fix)


def _child_pids(pid: int) -> list[int]:
    try:
        return [
            int(child) for child in Path(f"/proc/{pid}/task/{pid}/children").read_text().split()
        ]
    except OSError:
        return []


def _local_cancel_marker(record: JobRecord) -> Path:
    return Path(record.submitit_folder) / f"{record.job_id}_cancelled"
