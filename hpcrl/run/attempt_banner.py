"""The line that starts each attempt in a task's log, written by the job's node task and read
by ``hpcrl logs --attempt K``, ``--wait`` and the cause finder (``--open-mode=append`` keeps
every attempt of a job in one file; these lines split it).
"""

from __future__ import annotations

import datetime
import re
import socket

#: ``===== hpcrl attempt 2 · job 41 · node 0 (n1) · 2026-11-29T10:40:00+00:00 =====``
ATTEMPT_BANNER_RE = re.compile(r"^===== hpcrl attempt (?P<attempt>\d+) · ")


def job_id_of(env: dict[str, str]) -> str:
    """The job's id as hpcrl shows it: ``20_3`` for array task 3 of array 20 (Slurm gives each
    task an id of its own, e.g. 23, that no hpcrl command shows), else the job id."""
    array_job, array_task = env.get("SLURM_ARRAY_JOB_ID"), env.get("SLURM_ARRAY_TASK_ID")
    if array_job and array_task:
        return f"{array_job}_{array_task}"
    return env.get("SLURM_JOB_ID") or env.get("SUBMITIT_LOCAL_JOB_ID", "?")


def attempt_banner(env: dict[str, str], attempt_offset: int = 0) -> str:
    attempt = attempt_offset + int(env.get("SLURM_RESTART_COUNT", "0")) + 1
    job_id = job_id_of(env)
    node = env.get("SLURM_NODEID", "0")
    now = datetime.datetime.now(datetime.UTC).isoformat(timespec="seconds")
    return f"===== hpcrl attempt {attempt} · job {job_id} · node {node} ({socket.gethostname()}) · {now} ====="
