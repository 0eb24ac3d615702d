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


def attempt_banner(job_id: str, attempt: int, node: str) -> str:
    """``attempt``: counted through the run from 1; ``job_id`` as hpcrl shows it. The job's
    node task writes it from the scheduler's environment (``hpcrl.job.slurm_env.banner_of``)."""
    now = datetime.datetime.now(datetime.UTC).isoformat(timespec="seconds")
    return f"===== hpcrl attempt {attempt} · job {job_id} · node {node} ({socket.gethostname()}) · {now} ====="
