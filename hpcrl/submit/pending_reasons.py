"""Why a Slurm job still waits: squeue's reason (``Priority``, ``Resources``, ...).

sacct's ``Reason`` of a pending job is empty on Slurm 22.05 (it is filled in once the job has
started, if at all); the controller's queue has it. One ``squeue`` call answers for every
pending job being watched; it is asked only while some job is pending, and a failure (squeue
missing, the job already gone from the queue) leaves the reason unknown, never an error.
"""

from __future__ import annotations

import subprocess
from collections.abc import Callable, Sequence

SQUEUE_TIMEOUT_S = 10
#: What squeue writes for a job with nothing to say.
NO_REASON = frozenset({"", "None", "(null)"})


def squeue_command(job_ids: Sequence[str]) -> list[str]:
    """``--array``: one line per array task (``20_3``), not ``20_[0-7]``."""
    array_ids = sorted({job_id.split("_", 1)[0] for job_id in job_ids})
    return ["squeue", "--noheader", "--array", "--format=%i|%r", f"--jobs={','.join(array_ids)}"]


def parse_reasons(text: str) -> dict[str, str]:
    """``20_3|Priority`` lines as {job id: reason}; lines of any other shape are skipped."""
    reasons = {}
    for line in text.splitlines():
        fields = line.strip().split("|")
        if len(fields) == 2 and fields[0] and fields[1].strip() not in NO_REASON:
            reasons[fields[0]] = fields[1].strip()
    return reasons


def pending_reasons(
    job_ids: Sequence[str], run: Callable[..., subprocess.CompletedProcess] = subprocess.run
) -> dict[str, str]:
    """The reason of each pending job in ``job_ids`` that squeue names ({} when it cannot)."""
    if not job_ids:
        return {}
    try:
        proc = run(squeue_command(job_ids), capture_output=True, text=True, errors="replace",
                   timeout=SQUEUE_TIMEOUT_S, check=False)  # fmt: skip
    except (OSError, subprocess.SubprocessError):
        return {}
    return parse_reasons(proc.stdout or "") if proc.returncode == 0 else {}


def queued_states(
    job_ids: Sequence[str], run: Callable[..., subprocess.CompletedProcess] = subprocess.run
) -> dict[str, str]:
    """squeue's state word (``PENDING``, ``RUNNING``, ``COMPLETING``, ...) of each job in
    ``job_ids`` still in the controller's queue ({} when squeue cannot say)."""
    if not job_ids:
        return {}
    command = [*squeue_command(job_ids)[:-2], "--format=%i|%T", squeue_command(job_ids)[-1]]
    try:
        proc = run(command, capture_output=True, text=True, errors="replace",
                   timeout=SQUEUE_TIMEOUT_S, check=False)  # fmt: skip
    except (OSError, subprocess.SubprocessError):
        return {}
    return parse_reasons(proc.stdout or "") if proc.returncode == 0 else {}
