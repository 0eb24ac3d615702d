"""Why a job failed, or an attempt of it ended early, in one line, for ``hpcrl status``,
``submit --wait`` and their exit codes: node 0's cause records (``hpcrl.run.causes``), Slurm's
NODE_FAIL of an attempt that has none yet, the nodes' failure reports, the task logs.
"""

from __future__ import annotations

import json
import re
from pathlib import Path
from typing import TYPE_CHECKING

from submitit.core.utils import JobPaths

from hpcrl.run.causes import AttemptCause, read_causes, slurm_node_failure
from hpcrl.run.job_record import JobRecord

if TYPE_CHECKING:
    from hpcrl.submit.job_status import JobStatus

#: What Python prints when the task's interpreter lacks a module: before hpcrl's own code
#: runs (e.g. ``code: installed`` with an image that has no submitit), no marker can say it.
_IMPORT_FAILURE = re.compile(r"^(?:ModuleNotFoundError|ImportError): (.+)$", re.MULTILINE)
#: A node task that raised (a preflight or bootstrap failure) exits with this (submitit's).
FAILED_TASK_EXIT_CODE = 1
_STILL_RUNNING = frozenset({"PENDING", "RUNNING", "REQUEUED", "SUSPENDED", "UNKNOWN"})


def attempt_causes(
    run_dir: Path, record: JobRecord | None = None, status: JobStatus | None = None
) -> list[AttemptCause]:
    """The run's cause records, by attempt, with (given the job's sacct rows in ``status``)
    the cause of each NODE_FAIL attempt of this job that has none yet: the next attempt's
    node 0 writes it, so the login side names it while the job waits for its next attempt,
    and when Slurm did not requeue it."""
    causes = read_causes(run_dir)
    if record is None or status is None or record.executor != "slurm":
        return causes
    known = {cause.attempt for cause in causes}
    err_log = JobPaths(record.submitit_folder, job_id=record.job_id, task_id=0).stderr
    last = len(status.states) - 1
    for index, state in enumerate(status.states):
        attempt = record.attempt_offset + index
        if state != "NODE_FAIL" or attempt in known:
            continue
        requeued = index < last or status.state in _STILL_RUNNING
        cause = slurm_node_failure(run_dir, attempt, err_log, requeued=requeued)
        if cause is not None:
            causes.append(cause)
    return sorted(causes, key=lambda cause: cause.attempt)


def failure_account(
    run_dir: Path, record: JobRecord | None = None, status: JobStatus | None = None
) -> tuple[str, int] | None:
    """``(line, exit code)`` of why the job failed, when it says so: the newest attempt's
    cause (``attempt_causes``), else the newest ``status/node<k>.failed`` of a later attempt
    or of one without a record (a preflight or bootstrap failure: that node's task exited 1),
    else an import failure in a task's log."""
    from hpcrl.config.secrets import redact  # what a job wrote may quote a secret

    causes = attempt_causes(Path(run_dir), record, status)
    cause = causes[-1] if causes else None
    marker = _newest_failure_marker(run_dir)
    if cause is not None and (marker is None or marker[0] <= cause.attempt):
        return cause.line(), cause.exit_code
    line = (marker[1] if marker else None) or _import_failure(run_dir)
    return (redact(line), FAILED_TASK_EXIT_CODE) if line else None


def failure_cause(
    run_dir: Path, record: JobRecord | None = None, status: JobStatus | None = None
) -> str | None:
    """The line of ``failure_account``."""
    account = failure_account(run_dir, record, status)
    return account[0] if account else None


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


def _newest_failure_marker(run_dir: Path) -> tuple[int, str] | None:
    """``(attempt's restart count, first line)`` of the newest node failure report."""
    newest: tuple[float, int, str] | None = None
    for path in (Path(run_dir) / "status").glob("node*.failed"):
        try:
            marker = json.loads(path.read_text())
        except (OSError, ValueError):
            continue
        if not isinstance(marker, dict):
            continue
        message, written = marker.get("message"), marker.get("time")
        if isinstance(message, str) and isinstance(written, int | float):
            if newest is None or written > newest[0]:
                restart = str(marker.get("attempt", "")).rpartition(".")[2]
                line = message.splitlines()[0] if message else ""
                newest = (written, int(restart) if restart.isdigit() else 0, line)
    return newest[1:] if newest else None
