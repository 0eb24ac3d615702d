"""A submitted job's live state, result and cancellation, rebuilt from ``job.json`` alone.

Slurm: states come from submitit's sacct watcher; exit code, elapsed time and the number of
attempts (requeues show as extra sacct records with ``--duplicates``) from one more sacct
call. Local: submitit's LocalJob only knows its process inside the submitting Python, so
another process reads the controller's pid and submitit's result files instead.
"""

from __future__ import annotations

import datetime
import json
import os
import re
import signal
import subprocess
import time
from pathlib import Path
from typing import Any

import attrs
import submitit
from submitit.core.utils import JobPaths, UncompletedJobError
from submitit.local.local import LocalJob
from submitit.slurm.slurm import SlurmJob

from hpcrl.submit.job_record import JobRecord

#: sacct states after which the job will not run again (no requeue pending).
FINAL_STATES = frozenset(
    {"COMPLETED", "FAILED", "CANCELLED", "TIMEOUT", "NODE_FAIL", "OUT_OF_MEMORY", "BOOT_FAIL",
     "DEADLINE", "PREEMPTED_FINAL", "REVOKED", "LOST"}
)  # fmt: skip
SACCT_TIMEOUT_S = 30
LOCAL_CANCEL_GRACE_S = 60.0  # local cancel: how long the tasks get to stop Ray and exit
LOCAL_CONTROLLER_EXIT_S = 15.0  # then: how long submitit's interrupted controller gets to exit


@attrs.frozen(kw_only=True)
class JobStatus:
    """What the scheduler says about one job right now.

    state: sacct's state word (``RUNNING``, ``COMPLETED``, ``CANCELLED``, ...) or ``UNKNOWN``
    when the scheduler has no record yet. exit_code: sacct's, None while running.
    """

    state: str
    attempts: int = 1
    elapsed_s: float | None = None
    exit_code: int | None = None
    scheduler_error: str | None = None  # sacct failed: the state is submitit's last known one
    reason: str | None = None  # sacct's Reason of a pending job (Priority, Resources, ...)

    @property
    def is_final(self) -> bool:
        return self.state in FINAL_STATES


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


def query_status(record: JobRecord) -> JobStatus:
    if record.executor == "local":
        return _local_status(record)
    job = rebuild_job(record)
    state = _state_word(job.get_info(mode="force").get("State") or "UNKNOWN")
    rows = _sacct_rows(record.job_id)
    if isinstance(rows, str):
        return JobStatus(state=state, scheduler_error=rows)
    if not rows:
        return JobStatus(state=state)
    last = rows[-1]
    last_state = _state_word(last["State"])
    return JobStatus(
        state=state if state != "UNKNOWN" else last_state,
        attempts=len(rows),
        elapsed_s=float(last["ElapsedRaw"]) if last["ElapsedRaw"].isdigit() else None,
        exit_code=_parse_exit_code(last["ExitCode"]) if last_state in FINAL_STATES else None,
        reason=last.get("Reason") if last.get("Reason") not in (None, "", "None") else None,
    )


def results_written(record: JobRecord) -> bool:
    """Every task wrote its submitit result (the job is over even if sacct cannot say so)."""
    return all(task_paths(record, task).result_pickle.exists() for task in range(record.num_tasks))


def _state_word(state: str) -> str:
    # sacct writes "CANCELLED by 0"; the first word is the state.
    return state.split()[0].upper() if state.strip() else "UNKNOWN"


def _parse_exit_code(text: str) -> int | None:
    """sacct's ``code:signal``; a job killed by a signal gets the shell's 128 + signal."""
    code, _, sig = text.partition(":")
    if not code.isdigit():
        return None
    return 128 + int(sig) if int(code) == 0 and sig.isdigit() and int(sig) else int(code)


def _sacct_rows(job_id: str) -> list[dict[str, str]] | str:
    """One row per attempt (``--duplicates``), allocation lines only (``-X``), oldest first;
    the error text when sacct fails (slurmdbd down, sacct missing)."""
    fields = ["JobID", "State", "ExitCode", "ElapsedRaw", "Reason"]
    command = ["sacct", "-X", "--duplicates", "--parsable2", "-j", job_id, "-o", ",".join(fields)]
    try:
        proc = subprocess.run(command, capture_output=True, text=True, timeout=SACCT_TIMEOUT_S)
    except (OSError, subprocess.SubprocessError) as error:
        return f"sacct: {error}"
    if proc.returncode != 0:
        return f"sacct exited {proc.returncode}: {proc.stderr.strip().splitlines()[-1:]}"
    lines = proc.stdout.splitlines()
    rows = [dict(zip(fields, line.split("|"), strict=False)) for line in lines[1:] if line]
    return [row for row in rows if row.get("JobID") == job_id]


# --------------------------------------------------------------------------- local executor
def _local_status(record: JobRecord) -> JobStatus:
    submitted = datetime.datetime.fromisoformat(record.submitted_at).timestamp()
    if _local_controller_alive(int(record.job_id)):
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


def _local_controller_alive(pid: int) -> bool:
    """True while submitit's local controller with this pid runs (not a zombie, not reused)."""
    proc = Path(f"/proc/{pid}")
    try:
        cmdline = (proc / "cmdline").read_bytes()
        stat = (proc / "stat").read_text()
    except OSError:
        return False
    state_letter = stat.rpartition(")")[2].split()[0]
    return b"submitit.local._local" in cmdline and state_letter != "Z"


# --------------------------------------------------------------------------- result / cancel
def read_outcome(record: JobRecord, run_dir: Path, status: JobStatus | None = None) -> JobOutcome:
    """How the job ended, from task 0's submitit result (the driver runs on task 0).

    The node entrypoint raises when the driver fails (so submitit and Slurm mark the job
    failed); the driver's own exit code is then read from its ``status/done`` marker.
    """
    job = rebuild_job(record).task(0)
    if not job.paths.result_pickle.exists():
        exit_code = status.exit_code if status and status.exit_code else 1
        state = status.state if status else "unknown"
        detail = failure_cause(run_dir) or f"no result ({state})"
        return JobOutcome(exit_code=exit_code, has_result=False, detail=detail)
    try:
        result = job.result()
    except UncompletedJobError as error:
        # A node's named failure says it in one line; the exception line is the fallback.
        detail = failure_cause(run_dir) or _last_line(error)
        return JobOutcome(exit_code=_driver_exit_code(run_dir) or 1, has_result=True, detail=detail)
    if isinstance(result, bool) or not isinstance(result, int):
        return JobOutcome(
            exit_code=0 if result is None else 1, has_result=True, detail=repr(result)
        )
    return JobOutcome(exit_code=result, has_result=True)


#: What Python prints when the task's interpreter lacks a module: before hpcrl's own code
#: runs (e.g. ``code: installed`` with an image that has no submitit), no marker can say it.
_IMPORT_FAILURE = re.compile(r"^(?:ModuleNotFoundError|ImportError): (.+)$", re.MULTILINE)


def failure_cause(run_dir: Path) -> str | None:
    """Why the job failed, in one line, when it says so: the newest ``status/node<k>.failed``
    (a preflight or bootstrap failure), else an import failure in a task's log."""
    return _newest_failure_marker(run_dir) or _import_failure(run_dir)


def _import_failure(run_dir: Path) -> str | None:
    for log in sorted((Path(run_dir) / "submitit").glob("*_log.err")):
        try:
            found = _IMPORT_FAILURE.findall(log.read_text(errors="replace"))
        except OSError:
            continue
        if found:
            return (
                f"the job's Python could not import: {found[-1]} (with code: installed it "
                "must have hpcrl and its packages; code: bundle ships them with the job)"
            )
    return None


def _newest_failure_marker(run_dir: Path) -> str | None:
    newest: tuple[float, str] | None = None
    for path in (Path(run_dir) / "status").glob("node*.failed"):
        try:
            marker = json.loads(path.read_text())
        except (OSError, json.JSONDecodeError):
            continue
        message, written = marker.get("message"), marker.get("time")
        if isinstance(message, str) and isinstance(written, int | float):
            if newest is None or written > newest[0]:
                newest = (written, message.splitlines()[0] if message else "")
    return newest[1] if newest else None


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


def cancel_job(record: JobRecord) -> None:
    """Cancel through submitit (scancel) on Slurm; locally SIGINT to submitit's controller,
    as submitit's LocalJob.cancel does (it interrupts its tasks, then kills what is left)."""
    if record.executor == "slurm":
        rebuild_job(record).cancel(check=True)
        return
    pid = int(record.job_id)
    if not _local_controller_alive(pid):
        return
    _local_cancel_marker(record).touch()  # no scheduler remembers it for us
    # Interrupt the tasks themselves first: submitit's controller, when interrupted, gives
    # them one second before SIGKILL, too short for the node entrypoint to stop Ray.
    for task_pid in _child_pids(pid):
        os.kill(task_pid, signal.SIGINT)
    deadline_s = time.monotonic() + LOCAL_CANCEL_GRACE_S
    while _local_controller_alive(pid) and time.monotonic() < deadline_s:
        time.sleep(0.2)
    if _local_controller_alive(pid):
        # Interrupted, the controller gives its tasks a second, kills them, then exits; wait
        # for that so the status right after a cancel says CANCELLED, not RUNNING.
        os.kill(pid, signal.SIGINT)
        deadline_s = time.monotonic() + LOCAL_CONTROLLER_EXIT_S
        while _local_controller_alive(pid) and time.monotonic() < deadline_s:
            time.sleep(0.2)
    if _local_controller_alive(pid):
        os.kill(pid, signal.SIGKILL)


def _child_pids(pid: int) -> list[int]:
    try:
        return [
            int(child) for child in Path(f"/proc/{pid}/task/{pid}/children").read_text().split()
        ]
    except OSError:
        return []


def _local_cancel_marker(record: JobRecord) -> Path:
    return Path(record.submitit_folder) / f"{record.job_id}_cancelled"
